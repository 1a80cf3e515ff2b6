"""pt_dist's authenticated store seen as a ``torch.distributed.Store``, for torch's own groups to rendezvous on.

torch accepts any ``Store`` subclass written in Python (c10d's ``PythonStore`` trampoline in
torch/csrc/distributed/c10d/init.cpp): ``ProcessGroupGloo``/``ProcessGroupNCCL``, ``new_group`` and
``split_group`` then reach every key through this object. So the adapters need no c10d ``TCPStore``, which
has no authentication (a stranger on its port can rewrite any key, a peer's address included).
"""

from __future__ import annotations

import torch.distributed as dist


class TorchStore(dist.Store):
    """Forwards torch's store calls to a pt_dist ``Store``. torch's C++ side holds only the trampoline: whoever
    hands this to torch keeps a reference for as long as torch's groups live (else calls fail "Not implemented")."""

    def __init__(self, store):
        super().__init__()
        self._store = store

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key):
        return self._store.get(key)

    def add(self, key, value):
        return self._store.add(key, value)

    def compare_set(self, key, expected_value, desired_value):
        return self._store.compare_set(key, expected_value, desired_value)

    def wait(self, keys, timeout=None):
        self._store.wait(keys, timeout)

    def check(self, keys):
        return self._store.check(keys)

    def delete_key(self, key):
        return self._store.delete_key(key)

    def num_keys(self):
        return self._store.num_keys()

    def append(self, key, value):
        self._store.append(key, value)

    def multi_get(self, keys):
        return self._store.multi_get(keys)

    def multi_set(self, keys, values):
        self._store.multi_set(keys, values)

    def has_extended_api(self):
        return True

    def clone(self):  # (our store serves threads at once; a second view would need a reference of its own)
        return self

    def set_timeout(self, timeout):
        self._store.set_timeout(timeout)
