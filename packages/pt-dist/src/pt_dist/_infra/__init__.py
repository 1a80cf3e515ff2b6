"""Infrastructure: the hardening pt-dist's core calls at one point each, importing nothing of the core.

``store.py`` / ``store_server.py`` / ``file_store.py`` / ``hash_store.py`` (c10d's stores), ``rendezvous.py``
(``init_method`` -> store, rank, size), ``wire.py`` (framing and the shared-secret handshake), ``secret.py``
(where the secret comes from), ``full_mesh.py`` (connecting every pair of ranks, gloo's ``connectFullMesh``),
``failure.py`` (what a failed collective does to its group), ``errors.py`` (torch's exception types),
``shm_segment.py`` / ``futex.py`` / ``huge_pages.py`` (the shared-memory backend's segments, waits and pages).
"""
