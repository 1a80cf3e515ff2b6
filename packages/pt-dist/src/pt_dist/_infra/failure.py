"""What a native group does when a collective fails mid-way: it stops, as NCCL's communicator abort does.

A failure other than a header mismatch (a peer died, a timeout, Ctrl-C, torch raising mid-fold) leaves the
transport out of step: a peer may be half-way through a transfer. So the group closes its transport (``_abort``),
which makes peers blocked on this rank fail fast, and refuses every later operation, saying why. A header
mismatch (``HeaderMismatch``) is raised by every rank at the same point, before any data moved, so the group
goes on. ``ProcessGroup.abort`` from another thread marks the group the same way.
"""

from __future__ import annotations

import contextlib

from pt_dist._infra.errors import DistBackendError, DistError


class HeaderMismatch(DistBackendError):
    """Ranks disagreed on a collective's arguments; the transport is still in step."""


@contextlib.contextmanager
def policy(pg, op_name: str):
    """Around one collective's header exchange and body on ``pg``."""
    if pg._broken:
        raise DistBackendError(f"{op_name} on group {pg.group_name!r}: the group is unusable after an earlier "
                               f"failure: {pg._broken}")
    try:
        yield
    except HeaderMismatch:
        raise
    except DistError as e:
        pg._broken = str(e)
        pg._abort()
        raise
    except (OSError, ConnectionError) as e:
        pg._broken = f"{op_name}: {e!r}"
        pg._abort()
        raise DistBackendError(f"{op_name} on group {pg.group_name!r} (rank {pg._rank}): transport failure "
                               f"{e!r}") from e
    except (Exception, KeyboardInterrupt) as e:  # a user who interrupts a hung collective must not run the next
        pg._broken = f"{op_name}: {e!r}"  # one out of step with peers still mid-transfer
        pg._abort()
        raise


@contextlib.contextmanager
def own_timeout(pg, seconds: float | None):
    """This call's own deadline (torch's ``barrier(timeout=)``): the group's ops run one at a time."""
    if seconds is None:
        yield
        return
    saved = pg.timeout
    pg._set_timeout(seconds)
    try:
        yield
    finally:
        pg._set_timeout(saved)
