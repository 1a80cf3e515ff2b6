"""torch's own process-group tests, ported: test/distributed/test_c10d_common.py (AbstractCommTest's
``_test_warn_not_in_group``, ``_test_rank_membership``, ``_test_tensor_dtype_mismatch``,
``_test_tensor_dtype_complex``; PythonProcessGroupExtensionTest's ``test_backend_class_attr``) and
test/distributed/test_c10d_gloo.py (``test_allgather_coalesced_checks``, the uneven list ``reduce_scatter`` and the
contiguity check of ``alltoall_base`` gloo makes), on the native backends and on the gloo adapter, where torch's own
calls run in the same ranks and must agree. Adapted: torch 2.15 raises ValueError where the older upstream
tests expect RuntimeError for dtype mixes and group membership; these follow torch 2.15."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pt_dist
import pytest
import torch

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _warned_ops(calls) -> tuple[list, list]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = [call() for call in calls]
    ops = [m.group(1) for w in caught
           if (m := re.fullmatch(r"Running (\w+) on global rank 1 which does not belong to the given group\.",
                                 str(w.message)))]
    return returned, ops


def _dtype_mismatches(ws: int) -> list:
    tensor = torch.ones(2, 2) * 7
    tensor_h = tensor.half()
    tensor_list = [torch.zeros(2, 2) for _ in range(ws)]
    tensor_list_h = list(tensor_list)
    tensor_list_h[1] = tensor_list_h[1].half()
    return [lambda: pt_dist.all_gather(tensor_list_h, tensor), lambda: pt_dist.all_gather(tensor_list, tensor_h),
            lambda: pt_dist.all_gather_coalesced([tensor_list_h], tensor_list),
            lambda: pt_dist.all_reduce_coalesced(tensor_list_h),
            lambda: pt_dist.reduce_scatter(tensor, tensor_list_h),
            lambda: pt_dist.reduce_scatter(tensor_h, tensor_list),
            lambda: pt_dist.all_to_all_single(tensor_h, tensor),
            lambda: pt_dist.all_to_all(tensor_list_h, tensor_list),
            lambda: pt_dist.all_to_all(tensor_list, tensor_list_h),
            lambda: pt_dist.scatter(tensor, tensor_list_h), lambda: pt_dist.gather(tensor_h, tensor_list),
            lambda: pt_dist.gather(tensor, tensor_list_h), lambda: pt_dist.scatter(tensor_h, tensor_list)]


def _upstream_cases(rank, world_size, backend):
    import torch.distributed as dist

    util.join(rank, world_size, backend, key=f"upstream-{backend}")
    out = {}
    # _test_warn_not_in_group: a collective on a group this rank is not in warns and returns None
    group = pt_dist.new_group([0])
    x, xs = torch.zeros(2, 2), [torch.zeros(2, 2)]
    calls = [lambda: pt_dist.all_gather(xs, x, group=group), lambda: pt_dist.all_reduce(x, group=group),
             lambda: pt_dist.barrier(group=group), lambda: pt_dist.broadcast(x, src=0, group=group),
             lambda: pt_dist.all_gather_object([None], 1, group=group),
             lambda: pt_dist.reduce_scatter(x, [x], group=group)]
    if rank == 1:
        out["not in group"] = _warned_ops(calls)
    else:
        [call() for call in calls]
    # _test_rank_membership (on the member: the other rank holds no group to ask)
    sub = pt_dist.new_group([1])
    if rank == 1:
        assert pt_dist.get_group_rank(sub, 1) == 0 and pt_dist.get_global_rank(sub, 0) == 1
        with pytest.raises(ValueError, match="not part of group"):
            pt_dist.get_group_rank(sub, 0)
        with pytest.raises(ValueError, match="not part of group"):
            pt_dist.get_global_rank(sub, 1)
        assert pt_dist.get_process_group_ranks(sub) == [1]
    # _test_tensor_dtype_mismatch: refused on the rank that got them, before any communication
    refused = 0
    for call in _dtype_mismatches(world_size):
        with pytest.raises(ValueError):
            call()
        refused += 1
    out["dtype mismatches refused"] = refused
    # _test_tensor_dtype_complex: complex tensors meet real ones of the same bytes
    mine = torch.tensor([rank + 1.0, rank + 2.0])
    real = [torch.zeros(2) for _ in range(world_size)]
    mixed = list(real)
    mixed[1] = torch.view_as_complex(torch.zeros(2))
    got = []
    for outs, inp in ((real, mine), (real, torch.view_as_complex(mine.clone())), (mixed, mine),
                      (mixed, torch.view_as_complex(mine.clone()))):
        pt_dist.all_gather(outs, inp)
        got.append([torch.view_as_real(t).reshape(-1).tolist() if t.is_complex() else t.tolist() for t in outs])
    out["complex all_gather"] = got
    # test_c10d_gloo: the list reduce_scatter with a different output size on each rank (gloo takes it)
    uneven_out = torch.zeros(rank + 1)
    ins = [torch.full((j + 1,), float((rank + 1) * 10 ** j)) for j in range(world_size)]
    pt_dist.reduce_scatter(uneven_out, ins)
    out["uneven reduce_scatter"] = uneven_out.tolist()
    work = pt_dist.reduce_scatter(uneven_out := torch.zeros(rank + 1), ins, async_op=True)
    work.wait()
    out["uneven reduce_scatter async"] = uneven_out.tolist()
    if backend == "gloo":  # torch's own, on the very same group
        ref = torch.zeros(rank + 1)
        dist.reduce_scatter(ref, [t.clone() for t in ins])
        out["torch's uneven reduce_scatter"] = ref.tolist()
    # test_allgather_coalesced_checks, with torch's classes and words
    dummy_input = [torch.zeros([1], dtype=torch.float32)]
    outputs = [[torch.zeros([1], dtype=torch.float32)] for _ in range(world_size)]
    outputs[0] = [torch.zeros([0], dtype=torch.float32)]
    with pytest.raises(RuntimeError, match="invalid size of output tensor at index 0"):
        pt_dist.all_gather_coalesced(outputs, dummy_input)
    outputs[0] = [torch.zeros([1], dtype=torch.float64)]
    with pytest.raises(RuntimeError, match="invalid tensor type at index 0"):
        pt_dist.all_gather_coalesced(outputs, dummy_input)
    with pytest.raises(RuntimeError, match="output lists should be equal to world size"):
        pt_dist.all_gather_coalesced([[torch.zeros([1])] for _ in range(world_size + 1)], dummy_input)
    with pytest.raises(TypeError, match="Invalid function argument.*output_tensor_lists"):
        pt_dist.all_gather_coalesced([torch.zeros([0], dtype=torch.float32)], dummy_input)
    # gloo's alltoall_base: a strided input is refused; a strided output is fine
    with pytest.raises(ValueError, match="Tensors must be contiguous"):
        pt_dist.all_to_all_single(torch.empty(2, 2), torch.ones(2, 2).t())
    strided = torch.zeros(2, 2).t()
    pt_dist.all_to_all_single(strided, torch.full((2, 2), float(rank)))
    out["all_to_all_single into a strided output"] = strided.tolist()
    util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_upstream_process_group_cases(backend):
    res = run_ranks(_upstream_cases, 2, backend, backend=None, timeout=90)
    gathered = [[1.0, 2.0], [2.0, 3.0]]
    for rank, out in enumerate(res):
        assert out["dtype mismatches refused"] == 13
        assert out["complex all_gather"] == [gathered] * 4
        want = [3.0] if rank == 0 else [30.0, 30.0]
        assert out["uneven reduce_scatter"] == out["uneven reduce_scatter async"] == want
        if backend == "gloo":
            assert out["torch's uneven reduce_scatter"] == want
        assert out["all_to_all_single into a strided output"] == [[0.0, 0.0], [1.0, 1.0]]
    returned, warned = res[1]["not in group"]
    assert returned == [None] * 6
    assert warned == ["all_gather", "all_reduce", "barrier", "broadcast", "all_gather_object", "reduce_scatter"]
    assert "not in group" not in res[0]


def test_register_backend_adds_the_class_attribute():
    from pt_dist import Backend

    Backend.register_backend("dummy", lambda *args: None)
    try:
        assert Backend.DUMMY == "dummy" and Backend("DUMMY") == "dummy"
    finally:
        Backend._plugins.pop("dummy")
        del Backend.DUMMY
