"""Kernel-assisted waiting on a word of shared memory (Linux ``futex(2)``), with a polling fallback.

The shm backend spins on its peers' counters first; if a peer is late (the CPU is oversubscribed, or it
is still computing) spinning would steal the very core that peer needs, so the waiter sleeps in
``FUTEX_WAIT`` on the counter's address until the peer's ``FUTEX_WAKE`` (the spin-then-block scheme
of glibc mutexes and NCCL's proxy threads). The kernel compares the word before sleeping, so a wake
between our read and the call is never lost. A sleeper also checks now and then that the peer it waits for
is alive (``pid_dead``), so a crashed rank is noticed in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}.get(platform.machine())
FUTEX_WAIT, FUTEX_WAKE = 0, 1  # not the _PRIVATE variants: the word is shared between processes


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Futex:
    """``wait(addr, expected, timeout_s)`` / ``wake(addr)`` on 32-bit words at absolute addresses."""

    def __init__(self):
        self._syscall = None
        if sys.platform.startswith("linux") and _SYS_FUTEX is not None and not os.environ.get("PT_DIST_NO_FUTEX"):
            libc = ctypes.CDLL(None, use_errno=True)
            self._syscall = libc.syscall
            self._syscall.restype = ctypes.c_long

    @property
    def available(self) -> bool:
        return self._syscall is not None

    def wait(self, addr: int, expected: int, timeout_s: float) -> None:
        """Sleep while the 32-bit word at ``addr`` equals ``expected`` (at most ``timeout_s``)."""
        if self._syscall is None:
            time.sleep(min(timeout_s, 0.0002))
            return
        ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
        self._syscall(_SYS_FUTEX, ctypes.c_void_p(addr), FUTEX_WAIT, ctypes.c_uint32(expected & 0xFFFFFFFF),
                      ctypes.byref(ts), None, 0)

    def wake(self, addr: int) -> None:
        if self._syscall is not None:
            self._syscall(_SYS_FUTEX, ctypes.c_void_p(addr), FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


def pid_dead(pid: int) -> bool:
    """Whether a peer we may be sleeping on has exited (gone, or a zombie its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
