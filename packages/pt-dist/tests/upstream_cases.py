"""The collector for torch's own test files ported to pt_dist (imported by path): each ported upstream case is a
module-level function ``case(c, group)`` that checks through ``c`` (a ``Case``: ``equal``, ``true``,
``raises``) inside spawned ranks, and gets its own pytest id, ``test_x[<backend>-<case>]``, so ``-k`` selects one.

A test module lists its cases and states how many there are::

    CASES = (grad_acc_cases, summon_cases, ...)

    @upstream_cases.parametrize(CASES, expect=9)
    def test_upstream_fsdp1_cases(backend, case, request):
        upstream_cases.check(request, world=2, timeout=180)

Ranks are costly to start, so the first test of a (module, test, backend) to run runs every *selected* case of
that test in one ``run_ranks`` job (the session's selected items say which; under pytest-xdist the job runs once
for all workers, behind a file lock) and keeps each case's failures; each test then asserts its own case's.

The checks cannot pass vacuously: ``equal`` compares shape and dtype before values (``torch.allclose`` alone
broadcasts, so ``[1]`` against ``[n]`` would pass), a case that made no check fails, every selected case must
have run, and a file listing fewer cases than it states fails at collection (``count_problem``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

import pt_dist
import pytest
import torch
from filelock import FileLock
from harness.worker import FnRef

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


class Case:
    """assertEqual / assertTrue / assertRaisesRegex for case bodies run inside a rank; failures are collected,
    checks counted. ``scratch``: a directory every rank of the job shares."""

    def __init__(self, rank: int, world: int, scratch: str | None = None):
        self.rank, self.world_size, self.scratch = rank, world, scratch
        self.fails: list[str] = []
        self.checks = 0

    def equal(self, what, a, b, rtol=1.3e-6, atol=5e-5):
        """``a`` and ``b`` both None, or tensors of one shape and dtype whose values agree within the tolerances."""
        self.checks += 1
        problem = mismatch(a, b, rtol, atol)
        if problem:
            self.fails.append(f"rank {self.rank} {what}: {problem}")

    def true(self, what, cond):
        self.checks += 1
        if not cond:
            self.fails.append(f"rank {self.rank} {what}")

    def raises(self, what, exc, fn, match=""):
        """``fn()`` raises ``exc`` whose message holds ``match``; another exception or none is a failure."""
        try:
            fn()
        except exc as e:
            self.true(f"{what}: message {e}", match in str(e))
            return
        except Exception as e:  # noqa: BLE001 - a wrong kind is a failure to report
            self.true(f"{what}: raised {type(e).__name__}({e}) instead of {exc.__name__}", False)
            return
        self.true(f"{what}: raised nothing", False)


def mismatch(a, b, rtol: float, atol: float) -> str | None:
    """Why ``a`` and ``b`` differ (None when they agree): None against a tensor, not tensors, shapes, dtypes,
    then values (``torch.allclose`` on equal shapes, so nothing broadcasts)."""
    if a is None or b is None:
        return None if a is None and b is None else f"{_show(a)} != {_show(b)}"
    if not (torch.is_tensor(a) and torch.is_tensor(b)):
        return f"not two tensors: {type(a).__name__} and {type(b).__name__}"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        return f"{_show(a)} != {_show(b)} (rtol={rtol}, atol={atol})"
    return None


def _show(t) -> str:
    if not torch.is_tensor(t):
        return repr(t)
    return f"{t.detach().flatten()[:4].tolist()}{'...' if t.numel() > 4 else ''} {tuple(t.shape)} {t.dtype}"


def count_problem(cases, expect: int) -> str | None:
    """A file listing fewer cases than it states (a case lost in an edit would pass silently otherwise)."""
    names = [c.__name__ for c in cases]
    if len(set(names)) != len(names):
        return f"case names repeat: {names}"
    if len(names) < expect:
        return f"{len(names)} cases ({names}), the file states at least {expect}"
    return None


def result_problems(results: dict, names: list) -> dict:
    """Per selected case name, what its result says is wrong: its failures, no check made, or not run."""
    out = {}
    for name in names:
        got = results.get(name)
        if got is None:
            out[name] = [f"case {name} did not run"]
        elif got["fails"]:
            out[name] = got["fails"]
        elif got["checks"] == 0:
            out[name] = [f"case {name} made no check"]
    return out


def parametrize(cases, expect: int, backends=("tcp", "shm")):
    """``pytest.mark.parametrize`` over (backend, case name), one id per ported case: ``<backend>-<case>``."""
    problem = count_problem(cases, expect)
    if problem:
        raise AssertionError(problem)
    params = [pytest.param(b, c.__name__, id=f"{b}-{c.__name__}") for b in backends for c in cases]
    return pytest.mark.parametrize(("backend", "case"), params)


def check(request, world: int, timeout: float, seed: int | None = None) -> None:
    """This test's case: the job's result for it (the job runs once per session, module, test and backend)."""
    backend, case = request.node.callspec.params["backend"], request.node.callspec.params["case"]
    names = _selected(request, backend)
    results = _job(request, backend, names, world, timeout, seed)
    if "error" in results:
        raise AssertionError(f"the ranks' job for {names} failed:\n{results['error']}")
    fails = result_problems(results, [case]).get(case)
    assert not fails, "\n".join(f[:400] for f in fails[:12])


def _selected(request, backend: str) -> list:
    """The case names of this test and backend that the session runs (all of them, or what ``-k`` kept), in the
    order the module lists them."""
    me = request.node
    chosen = {item.callspec.params["case"] for item in request.session.items
              if item.path == me.path and getattr(item, "originalname", None) == me.originalname
              and item.callspec.params.get("backend") == backend}
    declared = [p.values[1] for p in me.get_closest_marker("parametrize").args[1]]
    return [name for name in dict.fromkeys(declared) if name in chosen]


def _job(request, backend, names, world, timeout, seed) -> dict:
    me = request.node
    factory = request.getfixturevalue("tmp_path_factory")
    worker = getattr(request.config, "workerinput", None)
    # under xdist every worker's base is <session dir>/popen-gwN: the job is shared through the session dir
    root = factory.getbasetemp().parent if worker else factory.getbasetemp()
    run = worker["testrunuid"] if worker else str(os.getpid())
    stem = f"upstream-{run}-{Path(me.path).stem}-{me.originalname}-{backend}"
    done = root / f"{stem}.json"
    with FileLock(str(root / f"{stem}.lock")):
        if not done.exists():
            module = request.module
            scratch = tempfile.mkdtemp(prefix=f"{stem}-", dir=root)
            try:
                by_rank = run_ranks(_rank, world, backend, module.__name__, module.__file__, names, scratch, seed,
                                    backend=None, timeout=timeout)
                results = _merge(by_rank)
            except Exception:  # noqa: BLE001 - every case of the job reports it
                results = {"error": traceback.format_exc(limit=4)[-4000:]}
            done.write_text(json.dumps(results))
    return json.loads(done.read_text())


def _merge(by_rank: list) -> dict:
    """Each case's failures over the ranks, and its checks (the most any rank made: some check on rank 0 only)."""
    out = {}
    for results in by_rank:
        for name, (fails, checks) in results.items():
            mine = out.setdefault(name, {"fails": [], "checks": checks})
            mine["fails"] += fails
            mine["checks"] = max(mine["checks"], checks)
    return out


def run_cases(rank: int, world: int, backend: str, cases, scratch: str | None = None, seed: int | None = None):
    """A rank's side: join ``backend``, run each ``case(c, WORLD)`` with its own ``Case`` (after
    ``torch.manual_seed(seed)`` when given); ``{name: (failures, checks)}``. A case that raises is a failure,
    and the cases after it do not run (the ranks may no longer agree on the collectives)."""
    util.join(rank, world, backend, timeout=60)
    try:
        out = {}
        for case in cases:
            c = Case(rank, world, scratch)
            if seed is not None:
                torch.manual_seed(seed)
            try:
                case(c, pt_dist.group.WORLD)
            except Exception:  # noqa: BLE001 - reported as this case's failure
                c.fails.append(f"rank {rank} raised:\n{traceback.format_exc(limit=6)}")
                out[case.__name__] = (c.fails, c.checks)
                break
            out[case.__name__] = (c.fails, c.checks)
        return out
    finally:
        util.leave()


def _rank(rank, world, backend, module, file, names, scratch, seed):
    """The job's function on each rank: the test module's cases by name."""
    cases = [FnRef(module, file, name).resolve() for name in names]
    return run_cases(rank, world, backend, cases, scratch, seed)
