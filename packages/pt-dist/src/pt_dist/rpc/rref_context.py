"""The RRef protocol's bookkeeping on one worker: torch's ``RRefContext`` (torch/csrc/distributed/rpc/rref_context.h).

The owner keeps ``owners[rref_id]`` (the value) and ``forks[rref_id]``, the fork ids of the users that hold
it; the value is dropped from here when the last fork is deleted. A user is *pending* until the owner has
confirmed its fork (the reply to ``remote``, or to the child's fork request) and is kept alive meanwhile, so
its delete can never overtake its creation. A user that forks its RRef to another worker keeps the RRef as a
*pending child* until that child says the owner knows it (``rref_accept``): so the parent's own delete cannot
leave the owner with no forks while the child's fork request is still on its way (torch's "fork confirmations
before deletes"). Ids are ``(creating rank, counter)``, torch's ``GloballyUniqueId``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref

import torch

from pt_dist.autograd import container
from pt_dist.rpc import handlers
from pt_dist.rpc.agent import RpcTimeoutError
from pt_dist.rpc.rref import RRef

log = logging.getLogger(__name__)


class RRefContext:
    """One worker's RRefs; those it makes are ``rref_class`` (pt_dist.rpc.RRef: torch's surface over rref.RRef)."""

    def __init__(self, agent, rref_class: type[RRef] = RRef):
        self.agent, self.rank, self.rref_class = agent, agent.rank, rref_class
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.owners: dict[tuple, object] = {}
        self.forks: dict[tuple, set] = {}
        self.pending_users: dict[tuple, object] = {}
        self.pending_children: dict[tuple, object] = {}
        self.users: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def new_id(self) -> tuple[int, int]:
        return (self.rank, next(self._ids))

    def owner_rref(self, rref_id: tuple):
        """The owner's RRef for ``rref_id``, created (value still pending) if a message about it came first."""
        with self._lock:
            r = self.owners.get(rref_id)
            if r is None:
                r = self.owners[rref_id] = self.rref_class._make(self.agent, self.rank, rref_id, None)
                self.forks.setdefault(rref_id, set())
            return r

    def add_fork(self, rref_id: tuple, fork_id: tuple) -> None:
        self.owner_rref(rref_id)
        with self._lock:
            self.forks.setdefault(rref_id, set()).add(fork_id)

    def del_fork(self, rref_id: tuple, fork_id: tuple) -> None:
        with self._lock:
            forks = self.forks.get(rref_id, set())
            forks.discard(fork_id)
            if not forks:
                self.forks.pop(rref_id, None)
                self.owners.pop(rref_id, None)

    # --- pickling an RRef into a message to ``dst`` (serialize.py) --------------------------------------
    def fork(self, rref, dst: int) -> tuple:
        if rref.is_owner():
            with self._lock:
                self.owners.setdefault(rref._rref_id, rref)
                self.forks.setdefault(rref._rref_id, set())
            if dst == self.rank:
                return (self.rank, rref._rref_id, None, self.rank)
            fork_id = self.new_id()
            self.add_fork(rref._rref_id, fork_id)
            return (self.rank, rref._rref_id, fork_id, self.rank)
        fork_id = self.new_id()
        with self._lock:
            self.pending_children[fork_id] = rref
        return (rref._owner, rref._rref_id, fork_id, self.rank)

    def unfork(self, src: int, owner: int, rref_id: tuple, fork_id, parent: int, waits: list | None = None):
        """The RRef a message carried; a user the owner has yet to confirm adds a Future to ``waits`` that
        completes once it has (the call that carried it runs then: torch's RRef arguments are confirmed first)."""
        if owner == self.rank:
            r = self.owner_rref(rref_id)
            if parent != self.rank:
                self.agent.request(parent, ("rref_accept", fork_id))
            return r
        user = self.rref_class._make(self.agent, owner, rref_id, fork_id)
        if parent == owner:  # the owner added this fork when it sent it
            self.confirm(fork_id, user)
            return user
        with self._lock:
            self.pending_users[fork_id] = user
        confirmed = torch.futures.Future()
        if waits is not None:
            waits.append(confirmed)
        fut = self.agent.request(owner, ("rref_fork", rref_id, fork_id))
        fut.add_done_callback(lambda f: self._forked(f, fork_id, parent, confirmed))
        return user

    def _forked(self, fut, fork_id: tuple, parent: int, confirmed) -> None:
        with self._lock:
            user = self.pending_users.pop(fork_id, None)
        try:
            fut.wait()
            ok = True
        except Exception as e:
            ok = False
            log.warning("rref fork %s: the owner did not confirm it: %s", fork_id, e)
        if ok and user is not None:
            self.confirm(fork_id, user)
        confirmed.set_result(ok)
        try:
            self.agent.request(parent, ("rref_accept", fork_id))
        except RuntimeError as e:
            log.debug("rref fork %s: no accept to worker %d: %s", fork_id, parent, e)

    def confirm(self, fork_id: tuple, user) -> None:
        user._confirmed = True
        with self._lock:
            self.users[fork_id] = user

    # --- creating: rpc.remote -----------------------------------------------------------------------------
    def remote(self, dst: int, func, args: tuple, kwargs: dict, timeout: float, ctx) -> RRef:
        """A fresh RRef whose owner ``dst`` runs ``func`` into it (torch's ``pyRemotePythonUdf``: a user RRef,
        pending until the owner answers the ``remote`` request; on this worker, the owner RRef at once)."""
        rref_id = self.new_id()
        if dst == self.rank:
            rref = self.owner_rref(rref_id)
            self.agent.submit(_run_local, rref, func, args, kwargs, ctx)
            return rref
        user = self.rref_class._make(self.agent, dst, rref_id, rref_id)
        user._creation = self.agent.request(dst, ("remote", func, args, kwargs, rref_id, rref_id), timeout, ctx)
        with self._lock:
            self.pending_users[rref_id] = user
        user._creation.add_done_callback(lambda f: self._created(f, rref_id, user))
        return user

    def _created(self, fut, fork_id: tuple, user) -> None:
        try:
            fut.wait()
        except RpcTimeoutError:
            user._timed_out = True  # the owner may never have made it: to_here and proxies raise from now on
        except Exception:
            pass  # the owner ran the function and holds its error: to_here raises it
        self.confirm_pending(fork_id)

    def confirm_pending(self, fork_id: tuple) -> None:
        with self._lock:
            u = self.pending_users.pop(fork_id, None)
        if u is not None:
            self.confirm(fork_id, u)

    # --- deleting ----------------------------------------------------------------------------------------
    def accept(self, fork_id: tuple) -> None:
        with self._lock:
            self.pending_children.pop(fork_id, None)

    def user_deleted(self, owner: int, rref_id: tuple, fork_id: tuple) -> None:
        """A user RRef's last reference is gone (``__del__``): tell the owner, from the agent's pool."""
        if not self.agent.closing:
            self.agent.submit(self._send_delete, owner, rref_id, fork_id)

    def _send_delete(self, owner: int, rref_id: tuple, fork_id: tuple):
        try:
            return self.agent.request(owner, ("rref_delete", rref_id, fork_id))
        except RuntimeError as e:
            log.debug("rref %s: delete not sent to worker %d: %s", rref_id, owner, e)
            return None

    def delete_all_users(self) -> list:
        """Shutdown: every confirmed user here tells its owner it is gone; returns the delete futures."""
        with self._lock:
            users = list(self.users.values())
            self.users.clear()
        futures = []
        for u in users:
            if not u._deleted:
                u._deleted = True
                f = self._send_delete(u._owner, u._rref_id, u._fork_id)
                if f is not None:
                    futures.append(f)
        return futures


def _run_local(rref, func, args, kwargs, ctx) -> None:
    with container.current(ctx):  # the caller's context, as a call to another worker runs in
        handlers.run_into(rref, func, args, kwargs)
