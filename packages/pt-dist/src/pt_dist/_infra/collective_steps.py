"""The collective steps of a distributed checkpoint with failures carried across ranks (torch's
``checkpoint/utils.py`` ``_DistWrapper.reduce_scatter`` / ``all_reduce`` / ``all_gather`` and ``api.py``'s
``CheckpointException``; no pt_dist imports: the group's object collectives come in as ``comm``).

Each step runs this rank's part inside a try: a rank that fails sends its exception instead of its result, so
every rank raises the same ``CheckpointException``, naming each failed rank and its error, instead of some
hanging in the next collective.

``comm`` is the group as torch's ``_DistWrapper`` has it: ``rank``, ``is_coordinator``, ``gather_object(obj)``
(every rank's ``obj``, a list on the coordinator, None elsewhere), ``scatter_object(objs)`` (the coordinator's
``objs[i]`` to rank ``i``), ``broadcast_object(obj)`` (the coordinator's) and ``all_gather_object(obj)``.
"""

from __future__ import annotations

import pickle
import traceback

__all__ = ["CheckpointException", "all_gather", "all_reduce", "reduce_scatter"]


class CheckpointException(BaseException):
    """What every rank raises when any rank's step failed; ``failures``: {rank: (exception, traceback frames)}."""

    def __init__(self, msg: str, failures: dict):
        super().__init__(msg, failures)
        self._failures = failures

    @property
    def failures(self) -> dict:
        return self._failures

    def __str__(self) -> str:
        text = f"CheckpointException ranks:{self._failures.keys()}\n"
        for rank, (exc, trace) in self._failures.items():
            text += f"Traceback (most recent call last): (RANK {rank})\n"
            if trace is not None:
                text += "".join(traceback.format_list(trace))
            text += "".join(traceback.format_exception_only(type(exc), exc))
        return text


class _Failed:
    """A step's (exception, traceback frames), the exception as its text if it does not pickle."""

    def __init__(self, exc: BaseException):
        trace = traceback.extract_tb(exc.__traceback__)
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        self.wrapped = (exc, trace)


def _attempt(fun):
    try:
        return fun()
    except Exception as e:  # (sent to the coordinator: every rank raises it)
        return _Failed(e)


def _checked(step: str, results: list):
    """``results``, or the exception naming every rank whose result is a failure."""
    failures = {rank: r.wrapped for rank, r in enumerate(results) if isinstance(r, _Failed)}
    return CheckpointException(step, failures) if failures else results


def _reduce(comm, step: str, gathered: list, reduce_fun):
    """The coordinator's reduction of every rank's result, or the exception naming the ranks that failed."""
    checked = _checked(step, gathered)
    if isinstance(checked, CheckpointException):
        return checked
    reduced = _attempt(lambda: reduce_fun(gathered))
    return CheckpointException(step, {comm.rank: reduced.wrapped}) if isinstance(reduced, _Failed) else reduced


def _raised(result):
    if isinstance(result, CheckpointException):
        raise result
    return result


def reduce_scatter(comm, step: str, map_fun, reduce_fun):
    """Each rank maps, the coordinator reduces the list to one result per rank, each rank gets its own."""
    gathered = comm.gather_object(_attempt(map_fun))
    per_rank = None
    if comm.is_coordinator:
        per_rank = _reduce(comm, step, gathered, reduce_fun)
        per_rank = [per_rank] * len(gathered) if isinstance(per_rank, CheckpointException) else per_rank
    return _raised(comm.scatter_object(per_rank))


def all_reduce(comm, step: str, map_fun, reduce_fun):
    """Each rank maps, the coordinator reduces, every rank gets the reduction."""
    gathered = comm.gather_object(_attempt(map_fun))
    return _raised(comm.broadcast_object(_reduce(comm, step, gathered, reduce_fun) if comm.is_coordinator else None))


def all_gather(comm, step: str, map_fun) -> list:
    """Each rank maps, every rank gets every result."""
    return _raised(_checked(step, comm.all_gather_object(_attempt(map_fun))))
