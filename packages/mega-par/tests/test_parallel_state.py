"""The MPU's rank grid in Megatron's order (tp-cp-dp-pp), its validation and its live groups.

Ports ``tests/unit_tests/test_parallel_state.py`` of Megatron-LM to mega_par: the rank-generator cases against
the explicit layout loops Megatron's past code used (expert parallelism left out: mega_par has none), and the
initialise / destroy / rank / world-size / stage cases on a 4-rank world (upstream runs 8 GPUs: tp=2 x pp=4
becomes tp=2 x pp=2). Upstream raises RuntimeError for sizes that do not fit; mega_par raises ValueError, before
any group is created. The live cases run inside the package's shared 8-rank run (``rank_cases``).
"""

import importlib.util
import pathlib

import pytest
import torch.distributed as dist
from mega_par import parallel_state as ps
from mega_par.parallel_state import generate_rank_groups, rank_grid

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)


def test_groups_match_megatron_docstring_example():
    """megatron/core/parallel_state.py's example: 16 GPUs, tp=2, pp=4 -> dp=2."""
    g = generate_rank_groups(16, tp=2, pp=4)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert sorted(g["dp"]) == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert sorted(g["pp"]) == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert sorted(g["embedding"]) == [[0, 12], [1, 13], [2, 14], [3, 15]]
    assert sorted(g["mp"]) == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]


def _past_layout(world, tp, pp, cp):
    """The groups as Megatron's code built them before its RankGenerator, loop by loop (the upstream golden)."""
    dp = world // (tp * pp * cp)
    per_stage = world // pp  # ranks of one pipeline stage
    out = {"dp": [], "dp_cp": [], "cp": [], "tp": [], "pp": []}
    for i in range(pp):
        first, last = i * per_stage, (i + 1) * per_stage
        out["dp"] += [list(range(first + j, last, cp * tp)) for j in range(cp * tp)]
        out["dp_cp"] += [list(range(first + j, last, tp)) for j in range(tp)]
        for j in range(dp):
            block = first + j * tp * cp
            out["cp"] += [list(range(block + k, block + tp * cp, tp)) for k in range(tp)]
    out["tp"] = [list(range(i * tp, (i + 1) * tp)) for i in range(world // tp)]
    out["pp"] = [list(range(i, world, per_stage)) for i in range(per_stage)]
    # a model-parallel group takes the i-th rank of every (dp x cp) group: one whole model replica
    out["mp"] = [[g[i] for g in out["dp_cp"]] for i in range(dp * cp)]
    return out


@pytest.mark.parametrize("nodes,gpus,tp,pp,cp", [
    (1, 1, 1, 1, 1), (1, 8, 8, 1, 1), (1, 8, 2, 2, 1), (1, 8, 2, 4, 1), (3, 8, 8, 3, 1), (4, 8, 2, 4, 1),
    (8, 8, 8, 8, 1), (8, 8, 2, 2, 2), (16, 8, 4, 8, 1), (16, 8, 4, 8, 4), (32, 8, 8, 8, 4), (64, 8, 4, 2, 8),
    (128, 8, 4, 2, 8), (316, 8, 4, 8, 1), (1344, 8, 4, 8, 1)])
def test_rank_generator_matches_megatrons_past_layout(nodes, gpus, tp, pp, cp):
    """Upstream test_rank_generator_for_tp_dp_pp: same groups, in the same order, as the past code's loops."""
    world = nodes * gpus
    ours, past = generate_rank_groups(world, tp, pp, cp), _past_layout(world, tp, pp, cp)
    for kind in ("dp", "dp_cp", "cp", "tp", "pp", "mp"):
        assert ours[kind] == past[kind], kind


@pytest.mark.parametrize("world,tp,pp,cp", [(8, 2, 2, 1), (8, 1, 1, 1), (8, 8, 1, 1), (16, 2, 2, 2), (12, 2, 3, 1)])
def test_every_kind_partitions_the_world(world, tp, pp, cp):
    g = generate_rank_groups(world, tp, pp, cp)
    sizes = {"tp": tp, "pp": pp, "cp": cp, "dp": world // (tp * pp * cp), "mp": tp * pp,
             "dp_cp": world // (tp * pp)}
    for kind, size in sizes.items():
        flat = sorted(r for group in g[kind] for r in group)
        assert flat == list(range(world)), kind
        assert all(len(group) == size for group in g[kind]), kind
    # tensor-parallel ranks are adjacent (they share a node)
    assert all(group == list(range(group[0], group[0] + tp)) for group in g["tp"])


def test_world_not_divisible_names_the_numbers():
    with pytest.raises(ValueError, match=r"world size \(10\) is not divisible by .*\(4\) x .*\(2\) x .*\(1\) = 8"):
        generate_rank_groups(10, tp=4, pp=2)
    with pytest.raises(ValueError, match="tensor_model_parallel_size must be a positive int, got 0"):
        generate_rank_groups(8, tp=0, pp=1)


def test_initialize_without_torch_distributed_raises():
    """Upstream test_initialize_and_destroy_model_parallel, first assertion."""
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="torch.distributed must be initialised"):
        ps.initialize_model_parallel(2, 2)


def test_rank_grid_diagram():
    text = rank_grid(8, tp=2, pp=2)
    assert text.splitlines() == [
        "world=8  tp=2 cp=1 dp=2 pp=2  (order tp-cp-dp-pp)",
        "pipeline stage 0:",
        "  dp 0 | tp ranks:  0   1",
        "  dp 1 | tp ranks:  2   3",
        "pipeline stage 1:",
        "  dp 0 | tp ranks:  4   5",
        "  dp 1 | tp ranks:  6   7",
    ]


# ---- live cases on a 4-rank world ------------------------------------------------------------------------------


class _mpu:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __enter__(self):
        ps.initialize_model_parallel(*self.args, **self.kwargs)

    def __exit__(self, *exc):
        ps.destroy_model_parallel()


def _initialize_and_destroy(rank, world):
    for bad in (dict(tensor_model_parallel_size=2 * world), dict(pipeline_model_parallel_size=2 * world),
                dict(tensor_model_parallel_size=world, pipeline_model_parallel_size=world),
                dict(virtual_pipeline_model_parallel_size=2)):
        try:
            ps.initialize_model_parallel(**bad)
        except ValueError:
            assert not ps.model_parallel_is_initialized(), f"{bad} left a half-built grid"
        else:
            raise AssertionError(f"{bad} on {world} ranks did not raise")
    with _mpu(2, 2):
        assert ps.model_parallel_is_initialized()
        for get in (ps.get_model_parallel_group, ps.get_tensor_model_parallel_group,
                    ps.get_pipeline_model_parallel_group, ps.get_data_parallel_group):
            assert get() is not None
    assert not ps.model_parallel_is_initialized()


def _pipeline_parallel_initializations(rank, world):
    with _mpu(2, 2):
        assert ps.get_pipeline_model_parallel_first_rank() == rank % 2
        assert ps.get_data_parallel_src_rank() == rank  # dp = 1
        assert ps.get_pipeline_model_parallel_next_rank() == (rank + 2) % world
        assert ps.get_pipeline_model_parallel_prev_rank() == (rank - 2) % world


def _data_parallel_initializations(rank, world):
    with _mpu(1, world):
        assert ps.get_data_parallel_src_rank() == rank
        assert ps.get_data_parallel_world_size() == 1 and ps.get_data_parallel_rank() == 0


def _tensor_model_parallel(rank, world):
    with _mpu(world, 1):
        assert ps.get_tensor_model_parallel_world_size() == world
        assert ps.get_tensor_model_parallel_rank() == rank
        assert ps.get_tensor_model_parallel_src_rank() == (rank // world) * world


def _pipeline_model_parallel(rank, world):
    with _mpu(1, world):
        assert ps.get_pipeline_model_parallel_world_size() == world
        assert ps.get_pipeline_model_parallel_rank() == rank
        assert ps.is_pipeline_first_stage(ignore_virtual=False) == (rank == 0) == ps.is_pipeline_first_stage()
        assert ps.is_pipeline_last_stage(ignore_virtual=False) == (rank == world - 1) == ps.is_pipeline_last_stage()
        ps.set_virtual_pipeline_model_parallel_rank(rank)
        assert ps.get_virtual_pipeline_model_parallel_rank() == rank


def _context_parallel_rank(rank, world):
    with _mpu(context_parallel_size=world):
        assert ps.get_context_parallel_rank() == rank
        assert ps.get_context_parallel_world_size() == world


CASES = {"initialize_and_destroy": _initialize_and_destroy,
         "pipeline_parallel_initializations": _pipeline_parallel_initializations,
         "data_parallel_initializations": _data_parallel_initializations,
         "tensor_model_parallel_world_size_rank_src": _tensor_model_parallel,
         "pipeline_model_parallel_world_size_rank_stages": _pipeline_model_parallel,
         "context_parallel_rank": _context_parallel_rank}


def rank_cases(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.mark.world_size(4)
@pytest.mark.parametrize("case", list(CASES))
def test_live_parallel_state_on_four_ranks(mega_par_ranks, case):
    H.assert_case(H.job_results(mega_par_ranks, "test_parallel_state"), case)
