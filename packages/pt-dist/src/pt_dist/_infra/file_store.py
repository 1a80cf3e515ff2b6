"""``FileStore``: the c10d Store as an append-only log in one file, for ranks sharing a filesystem.

Every mutation appends a length-prefixed record (the same binary encoding as the TCPStore wire
format) under an exclusive ``flock``; readers replay new records since their last offset. A blocking
``get`` polls the log with exponential backoff until the key appears or the timeout expires.
As c10d's FileStore does, every instance counts itself in the file and the last of ``world_size`` users to
``close`` removes it, so the next job (a rerun of the same command) starts from an empty file. The log carries
the backends' secret, so the file is created 0600 (``O_EXCL``), never reached through a symlink, and refused
when another user owns it or may read it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import threading
import time

from pt_dist._infra import wire
from pt_dist._infra.errors import DistError, DistStoreError
from pt_dist._infra.secret import check_private
from pt_dist._infra.store import DEFAULT_TIMEOUT, Store, _b, _seconds
from pt_dist._infra.store_server import _ARITY, ADD, APPEND, CAS, DELETE, MULTI_SET, SET, _apply, check_pairs

_INTERNAL = b"\x00pt_dist/"  # bookkeeping keys, invisible to num_keys
_USERS, _DONE, _OPENS = _INTERNAL + b"users", _INTERNAL + b"done", _INTERNAL + b"opens"


class FileStore(Store):
    """c10d's FileStore: an append-only log of store commands in a file, locked with ``flock``.

    Good for ranks on one host (or a shared filesystem); blocking ``get`` polls the log.
    """

    def __init__(self, file_name: str, world_size: int = -1, timeout=DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self.path, self.world_size = file_name, world_size
        self._data: dict[bytes, bytes] = {}
        self._pos, self._inode = 0, None
        self._lock = threading.Lock()
        self._closed, self._pid = False, os.getpid()
        self._locked(ADD, (_USERS, struct.pack("<q", 1)))
        # the how-manieth user of this file this instance is (1, 2, ...): ``world_size`` ranks opening it for
        # one init take consecutive numbers, since no rank can re-init before all have opened it for this one
        self.opened_as = struct.unpack("<q", self._locked(ADD, (_OPENS, struct.pack("<q", 1))))[0]

    def _open(self) -> int:
        """The file at ``path``: created ours and private (O_EXCL), else opened without following a symlink and
        refused unless we own it and no one else may read it: the log carries the mesh secret."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise DistError(f"FileStore: {self.path} is a symlink; refusing to follow it") from None
            raise
        try:
            check_private(os.fstat(fd), self.path, stat.S_ISREG, "regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_locked(self):
        """The file at ``path`` (created if absent), flocked; retried if a closing user removed it meanwhile."""
        while True:
            try:
                fd = self._open()
            except FileNotFoundError:  # removed by its last user between our two opens: create it again
                continue
            f = open(fd, "r+b")
            try:
                fcntl.flock(f, fcntl.LOCK_EX)
                if os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino:
                    return f
            except FileNotFoundError:
                pass
            except BaseException:  # Ctrl-C: a lock left on a file object only a traceback holds would block the
                f.close()  # cleanup that runs while that traceback is alive (closing the store) forever
                raise
            f.close()  # we locked a file that was unlinked before we got the lock

    def _locked(self, cmd: int | None, fields=(), remove_if=None) -> bytes:
        with self._lock, self._open_locked() as f:
            try:
                inode = os.fstat(f.fileno()).st_ino
                if inode != self._inode:  # a new file: the previous one was removed by its last user
                    self._inode, self._pos, self._data = inode, 0, {}
                f.seek(self._pos)
                log_bytes = f.read()
                self._replay(log_bytes)
                if cmd is None:
                    return b""
                out = _apply(self._data, cmd, list(fields))
                record = bytes([cmd]) + wire.pack_fields(*fields)
                f.seek(0, os.SEEK_END)
                f.write(struct.pack("<I", len(record)) + record)
                f.flush()
                self._pos = f.tell()
                if remove_if is not None and remove_if(self._data):
                    os.unlink(self.path)
                return out
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def close(self) -> None:
        """Sign off; the last of ``world_size`` users removes the file (as c10d's FileStore destructor does)."""
        if self._closed:
            return
        self._closed = True
        one, minus_one = struct.pack("<q", 1), struct.pack("<q", -1)
        self._locked(ADD, (_DONE, one))

        def last(data) -> bool:
            users, done = (int(data.get(k, b"0")) for k in (_USERS, _DONE))  # ADD keeps decimal text
            return users == 0 and 0 < self.world_size <= done

        self._locked(ADD, (_USERS, minus_one), remove_if=last)

    def __del__(self) -> None:  # dropped without close(): sign off all the same, as c10d's destructor does
        try:  # (not a forked child's copy: the parent still uses the file)
            if not getattr(self, "_closed", True) and self._pid == os.getpid():
                self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the file or the modules may be gone already
            pass

    def _replay(self, buf: bytes) -> None:
        pos = 0
        while pos + 4 <= len(buf):
            (n,) = struct.unpack_from("<I", buf, pos)
            if pos + 4 + n > len(buf):
                break
            rec = buf[pos + 4:pos + 4 + n]
            _apply(self._data, rec[0], wire.unpack_fields(rec[1:], _ARITY[rec[0]]))
            pos += 4 + n
        self._pos += pos

    def _wait_for(self, keys: list[bytes], timeout: float) -> bool:
        deadline, pause = time.monotonic() + timeout, 0.0005
        while True:
            self._locked(None)
            if all(k in self._data for k in keys):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def set(self, key, value):
        self._locked(SET, (_b(key), _b(value)))

    def get(self, key):
        if not self._wait_for([_b(key)], self._timeout):
            raise DistStoreError(f"FileStore.get({key!r}) timed out after {self._timeout:.1f}s")
        return self._data[_b(key)]

    def add(self, key, amount):
        return struct.unpack("<q", self._locked(ADD, (_b(key), struct.pack("<q", int(amount)))))[0]

    def compare_set(self, key, expected_value, desired_value):
        return self._locked(CAS, (_b(key), _b(expected_value), _b(desired_value)))

    def wait(self, keys, timeout=None):
        t = self._timeout if timeout is None else _seconds(timeout)
        if not self._wait_for([_b(k) for k in keys], t):
            raise DistStoreError(f"FileStore.wait({list(keys)!r}) timed out after {t:.1f}s")

    def check(self, keys):
        self._locked(None)
        return all(_b(k) in self._data for k in keys)

    def delete_key(self, key):
        return self._locked(DELETE, (_b(key),)) == b"\x01"

    def has_extended_api(self):
        return True

    def append(self, key, value):
        self._locked(APPEND, (_b(key), _b(value)))

    def multi_set(self, keys, values):
        check_pairs(keys, values)
        self._locked(MULTI_SET, (wire.pack_fields(*map(_b, keys)), wire.pack_fields(*map(_b, values))))

    def num_keys(self):
        """The keys set, plus one: the users count, as c10d's FileStore counts its reference-count key."""
        self._locked(None)
        return sum(not k.startswith(_INTERNAL) for k in self._data) + 1
