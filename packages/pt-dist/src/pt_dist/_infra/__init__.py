"""Infrastructure: the hardening pt-dist's core calls at one point each, importing nothing of the core.

Stores and joining: ``store.py`` / ``store_server.py`` / ``file_store.py`` / ``hash_store.py`` (c10d's stores),
``rendezvous.py`` (``init_method`` -> store, rank, size), ``full_mesh.py`` (connecting every pair of ranks,
gloo's ``connectFullMesh``). Authentication: ``wire.py`` (framing and the shared-secret handshake), ``secret.py``
(where the secret comes from). Failures: ``errors.py`` (torch's exception types), ``failure.py`` (what a failed
collective does to its group). Transports: ``p2p.py`` (send/recv channels), ``rpc_transport.py``,
``rpc_connections.py``, ``rpc_threads.py``, ``rpc_join.py``, ``rpc_cma.py`` (the RPC agent's). Shared-memory
tricks: ``shm_segment.py``, ``futex.py``, ``cma.py`` with ``huge_pages.py`` and ``single_copy.py``,
``symmetric_heap.py`` with ``symmetric_memory.py``. Checkpoint files: ``atomic_io.py``, ``renamed_pickle.py``,
``chunk_checks.py``, ``collective_steps.py``.
"""
