"""The collector of the ported upstream cases (upstream_cases.py) can fail: each of its checks is shown to catch a
planted mismatch (a ``[1]`` tensor against a ``[2]`` one, which ``torch.allclose`` alone broadcasts and
accepts; another dtype; None against a tensor; a file listing fewer cases than it states; a case that checks
nothing or does not run; a case that raises), on its own and through a rank job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import upstream_cases  # noqa: E402
from upstream_cases import Case, count_problem, result_problems  # noqa: E402


def test_equal_refuses_a_shape_that_allclose_would_broadcast():
    assert torch.allclose(torch.ones(1), torch.ones(2))  # what the collectors accepted before
    c = Case(0, 1)
    c.equal("planted", torch.ones(1), torch.ones(2))
    assert c.checks == 1 and len(c.fails) == 1 and "shape (1,) != (2,)" in c.fails[0], c.fails


def test_equal_refuses_another_dtype():
    c = Case(0, 1)
    c.equal("planted", torch.ones(3), torch.ones(3, dtype=torch.float64))
    assert len(c.fails) == 1 and "dtype torch.float32 != torch.float64" in c.fails[0], c.fails


def test_equal_refuses_none_and_non_tensors_and_values_beyond_the_tolerance():
    c = Case(0, 1)
    c.equal("none", None, torch.ones(1))
    c.equal("a float", 1.0, torch.ones(()))
    c.equal("values", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]), rtol=0, atol=0.05)
    assert len(c.fails) == 3, c.fails
    assert "None" in c.fails[0] and "not two tensors" in c.fails[1] and "atol=0.05" in c.fails[2], c.fails


def test_equal_accepts_what_agrees():
    c = Case(0, 1)
    c.equal("both None", None, None)
    c.equal("within the tolerance", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.04]), rtol=0, atol=0.05)
    c.equal("exact", torch.arange(4).view(2, 2), torch.arange(4).view(2, 2), rtol=0, atol=0)
    assert c.checks == 3 and not c.fails, c.fails


def _one(c, pg):
    c.true("one", True)


def _two(c, pg):
    c.true("two", True)


def test_too_few_cases_are_reported():
    assert count_problem((_one, _two), expect=2) is None
    problem = count_problem((_one, _two), expect=3)
    assert problem and "2 cases" in problem and "at least 3" in problem, problem
    assert "repeat" in count_problem((_one, _one), expect=2)
    with pytest.raises(AssertionError, match="at least 3"):
        upstream_cases.parametrize((_one, _two), expect=3)


def test_a_case_that_checks_nothing_or_did_not_run_is_reported():
    results = {"checked": {"fails": [], "checks": 2}, "idle": {"fails": [], "checks": 0},
               "failed": {"fails": ["rank 0 x: shape (1,) != (2,)"], "checks": 1}}
    problems = result_problems(results, ["checked", "idle", "failed", "missing"])
    assert set(problems) == {"idle", "failed", "missing"}, problems
    assert "made no check" in problems["idle"][0] and "did not run" in problems["missing"][0], problems


# -- the same, planted in cases a rank job runs ------------------------------------------------------------------

def planted_shape(c, pg):
    c.equal("planted [1] vs [2]", torch.ones(1), torch.ones(2))


def planted_dtype(c, pg):
    c.equal("planted dtype", torch.ones(2), torch.ones(2, dtype=torch.float64))


def planted_nothing(c, pg):
    pass


def planted_fine(c, pg):
    c.equal("agrees", torch.ones(2) * pg.size(), torch.full((2,), float(c.world_size)), rtol=0, atol=0)


def planted_raise(c, pg):
    raise RuntimeError("planted")


def planted_after_raise(c, pg):
    c.true("never reached", True)


def test_a_rank_job_reports_each_planted_case(tmp_path):
    names = [f.__name__ for f in (planted_shape, planted_dtype, planted_nothing, planted_fine, planted_raise,
                                  planted_after_raise)]
    (by_rank,) = run_ranks(upstream_cases._rank, 1, "tcp", __name__, __file__, names, str(tmp_path), None,
                           backend=None, timeout=60)
    problems = result_problems(upstream_cases._merge([by_rank]), names)
    assert set(problems) == set(names) - {"planted_fine"}, problems
    assert "shape (1,) != (2,)" in problems["planted_shape"][0]
    assert "dtype torch.float32 != torch.float64" in problems["planted_dtype"][0]
    assert "made no check" in problems["planted_nothing"][0]
    assert "RuntimeError: planted" in problems["planted_raise"][0]
    assert "did not run" in problems["planted_after_raise"][0]  # (the ranks may disagree after a raise)
