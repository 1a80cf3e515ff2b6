"""The MPU's rank grid in Megatron's order (tp-cp-dp-pp) and its validation; no processes needed."""

import pytest
from mega_par.parallel_state import generate_rank_groups, rank_grid


def test_groups_match_megatron_docstring_example():
    """megatron/core/parallel_state.py's example: 16 GPUs, tp=2, pp=4 -> dp=2."""
    g = generate_rank_groups(16, tp=2, pp=4)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert sorted(g["dp"]) == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert sorted(g["pp"]) == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert sorted(g["embedding"]) == [[0, 12], [1, 13], [2, 14], [3, 15]]
    assert sorted(g["mp"]) == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]


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
