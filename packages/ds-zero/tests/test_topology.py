"""The process grid: DeepSpeed's tests/unit/runtime/pipe/test_topology.py ported (rank <-> coordinate, axis lists,
communicator lists, rank names, the grid's groups on 4 ranks, stage_to_global, prime factors)."""

import pytest
import torch
from ds_zero.pipe.topology import PipelineParallelGrid as Grid
from ds_zero.pipe.topology import PipeModelDataParallelTopology, _prime_factors
from ds_zero.pipe.topology import ProcessTopology as Topo

from harness import run_ranks


def test_topology_2d():
    topo = Topo(axes=["row", "col"], dims=[2, 2])
    assert topo.world_size() == 4
    assert [topo.get_rank(row=r, col=c) for r in (0, 1) for c in (0, 1)] == [0, 1, 2, 3]
    assert [topo.get_axis_list("row", i) for i in (0, 1)] == [[0, 1], [2, 3]]
    assert [topo.get_axis_list("col", i) for i in (0, 1)] == [[0, 2], [1, 3]]


def test_topology_dims():
    topo = Topo(axes=["a", "b", "c"], dims=[2, 3, 4])
    assert topo.world_size() == 24 and [topo.get_dim(a) for a in "abc"] == [2, 3, 4]


def test_topology_match():
    topo = Topo(axes=["pipe", "data", "model"], dims=[2, 2, 2])
    assert topo.filter_match(pipe=0, data=1) == [2, 3]


def test_topology_rank_repr():
    topo = Topo(axes=["a", "b"], dims=[2, 2])
    assert [topo.get_rank_repr(rank=r) for r in range(4)] == ["a_00-b_00", "a_00-b_01", "a_01-b_00", "a_01-b_01"]
    assert topo.get_rank_repr(rank=3, inner_sep="+") == "a+01-b+01"
    assert topo.get_rank_repr(rank=3, inner_sep="🤗", outer_sep="_JEFF_") == "a🤗01_JEFF_b🤗01"
    topo = Topo(axes=["pipe", "data"], dims=[2, 2])
    assert [topo.get_rank_repr(rank=r) for r in range(4)] == [""] * 4  # data and pipe are omitted by default
    assert [topo.get_rank_repr(rank=r, omit_axes=["pipe"]) for r in range(4)] == ["data_00", "data_01"] * 2
    assert [topo.get_rank_repr(rank=r, omit_axes=[]) for r in range(4)] == [
        "pipe_00-data_00", "pipe_00-data_01", "pipe_01-data_00", "pipe_01-data_01"]
    topo = Topo(axes=["pipe", "data", "model"], dims=[2, 2, 2])
    assert [topo.get_rank_repr(rank=r) for r in range(8)] == ["model_00", "model_01"] * 4


def test_topology_3d():
    topo = Topo(axes=["a", "b", "c"], dims=[2, 2, 2])
    coords = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    assert [topo.get_rank(a=a, b=b, c=c) for a, b, c in coords] == list(range(8))
    assert [topo.get_coord(r) for r in range(8)] == [topo.ProcessCoord(*c) for c in coords]
    assert topo.get_axis_list("a", 0) == [0, 1, 2, 3] and topo.get_axis_list("a", 1) == [4, 5, 6, 7]
    assert topo.get_axis_list("b", 0) == [0, 1, 4, 5] and topo.get_axis_list("b", 1) == [2, 3, 6, 7]
    assert topo.get_axis_list("c", 0) == [0, 2, 4, 6] and topo.get_axis_list("c", 1) == [1, 3, 5, 7]
    assert topo.filter_match(a=0) == [0, 1, 2, 3]
    assert topo.filter_match(b=1, c=1) == [3, 7] and topo.filter_match(a=1, b=1, c=1) == [7]
    assert topo.get_coord(0).a == 0


def test_topology_comm_list():
    topo = Topo(axes=["pipe", "data", "model"], dims=[2, 2, 2])
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.get_axis_comm_lists("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.get_axis_comm_lists("jeff") == []  # an unknown axis is no groups, not an error


def test_three_d_topology_puts_model_fastest():
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_axis_names() == ["pipe", "data", "model"]
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_primes():
    with pytest.raises(ValueError):
        _prime_factors(0)
    for x in range(1, 30):
        primes = _prime_factors(x)
        product = 1
        for p in primes:
            product *= p
            assert _prime_factors(p) == [p]
        assert product == x


def _grid_cases(rank, world):
    import torch.distributed as dist

    topo = Topo(axes=["pipe", "data"], dims=[2, 2])
    grid = Grid(topology=topo)
    out = {"valid": grid._is_grid_valid(),
           "first_last": (grid.is_first_stage == (grid.get_stage_id() == 0),
                          grid.is_last_stage == (grid.get_stage_id() == grid.get_pipe_parallel_world_size() - 1))}
    t = torch.tensor([rank])
    dist.all_reduce(t, group=grid.get_pipe_parallel_group())
    out["pipe_sum"] = (t.item(), sum(grid.pp_group))
    t = torch.tensor([rank])
    dist.all_reduce(t, group=grid.get_data_parallel_group())
    out["data_sum"] = (t.item(), sum(grid.dp_group))
    out["stage_to_global"] = [grid.stage_to_global(stage_id=s, data=d) for s in (0, 1) for d in (0, 1)]
    out["mine"] = [grid.stage_to_global(stage_id=s) for s in (0, 1)]
    out["slice"] = (grid.get_model_parallel_world_size(), grid.get_slice_parallel_rank())
    return out


def test_grid_pipe_data_and_stage_to_global():
    results = run_ranks(_grid_cases, 4, timeout=120)
    for rank, r in enumerate(results):
        assert r["valid"] and r["first_last"] == (True, True)
        assert r["pipe_sum"][0] == r["pipe_sum"][1] and r["data_sum"][0] == r["data_sum"][1]
        assert r["stage_to_global"] == [0, 1, 2, 3]
        assert r["mine"] == ([0, 2] if rank % 2 == 0 else [1, 3])
        assert r["slice"] == (2, rank // 2)  # the slice is this replica's pipeline
