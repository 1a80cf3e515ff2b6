"""``HashStore``: c10d's in-process store (HashStore.hpp), a dictionary behind a condition variable."""

from __future__ import annotations

import struct
import threading

from pt_dist._infra import wire
from pt_dist._infra.errors import DistStoreError
from pt_dist._infra.store import DEFAULT_TIMEOUT, Store, _b, _seconds
from pt_dist._infra.store_server import ADD, APPEND, CAS, DELETE, MULTI_SET, SET, _apply, check_pairs


class HashStore(Store):
    """c10d's in-process store: a dictionary behind a condition variable, for ranks that are threads of one
    process and for tests (``init_process_group(store=HashStore(), rank=0, world_size=1)``)."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()

    def _do(self, cmd: int, *fields: bytes) -> bytes:
        with self._cond:
            out = _apply(self._data, cmd, list(fields))
            self._cond.notify_all()
            return out

    def _wait_for(self, keys: list[bytes], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: all(k in self._data for k in keys), timeout=timeout):
                raise DistStoreError(f"HashStore.{what} timed out after {timeout:.1f}s")

    def set(self, key, value):
        self._do(SET, _b(key), _b(value))

    def get(self, key):
        self._wait_for([_b(key)], self._timeout, f"get({key!r})")
        with self._cond:
            return self._data[_b(key)]

    def add(self, key, amount):
        return struct.unpack("<q", self._do(ADD, _b(key), struct.pack("<q", int(amount))))[0]

    def compare_set(self, key, expected_value, desired_value):
        return self._do(CAS, _b(key), _b(expected_value), _b(desired_value))

    def wait(self, keys, timeout=None):
        self._wait_for([_b(k) for k in keys], self._timeout if timeout is None else _seconds(timeout),
                       f"wait({list(keys)!r})")

    def check(self, keys):
        with self._cond:
            return all(_b(k) in self._data for k in keys)

    def delete_key(self, key):
        return self._do(DELETE, _b(key)) == b"\x01"

    def num_keys(self):
        with self._cond:
            return len(self._data)

    def has_extended_api(self):
        return True

    def append(self, key, value):
        self._do(APPEND, _b(key), _b(value))

    def multi_set(self, keys, values):
        check_pairs(keys, values)
        self._do(MULTI_SET, wire.pack_fields(*map(_b, keys)), wire.pack_fields(*map(_b, values)))
