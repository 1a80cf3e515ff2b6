"""The model-parallel unit (MPU): every process group of a TP x CP x DP x PP rank grid.

Mirrors ``megatron/core/parallel_state.py``. Ranks are laid out in Megatron's default order
``tp-cp-dp-pp``: tensor-parallel ranks are adjacent (they talk the most, so they share a node),
then context-, then data-, then pipeline-parallel ranks:

    global_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

All state lives in one ``_ParallelState`` object behind the module-level functions Megatron users call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass
class _ParallelState:
    tp: int
    pp: int
    cp: int
    dp: int
    vpp: int | None
    groups: dict = field(default_factory=dict)  # kind -> ProcessGroup containing this rank
    group_ranks: dict = field(default_factory=dict)  # kind -> list of global ranks of that group
    virtual_pipeline_rank: int | None = None


_STATE: _ParallelState | None = None

_KINDS = ("tp", "cp", "dp", "pp", "mp", "embedding", "dp_cp")


def _rank_of(tp_rank: int, cp_rank: int, dp_rank: int, pp_rank: int, tp: int, cp: int, dp: int) -> int:
    return tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))


def generate_rank_groups(world_size: int, tp: int, pp: int, cp: int = 1) -> dict[str, list[list[int]]]:
    """All groups of each kind, as lists of global ranks, without creating any process group."""
    for name, v in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                    ("context_parallel_size", cp)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if world_size % (tp * pp * cp) != 0:
        raise ValueError(f"world size ({world_size}) is not divisible by tensor_model_parallel_size ({tp}) x "
                         f"pipeline_model_parallel_size ({pp}) x context_parallel_size ({cp}) = {tp * pp * cp}")
    dp = world_size // (tp * pp * cp)
    coords = [(t, c, d, p) for p in range(pp) for d in range(dp) for c in range(cp) for t in range(tp)]
    r = lambda t, c, d, p: _rank_of(t, c, d, p, tp, cp, dp)

    def groups_varying(vary):
        # one group per fixed value of the other coordinates, ranks ordered by the varying coordinate(s)
        out: dict[tuple, list[int]] = {}
        for t, c, d, p in coords:
            key = tuple(v for k, v in zip("tcdp", (t, c, d, p)) if k not in vary)
            out.setdefault(key, []).append(r(t, c, d, p))
        return [sorted(g) for g in out.values()]

    groups = {"tp": groups_varying("t"), "cp": groups_varying("c"), "dp": groups_varying("d"),
              "pp": groups_varying("p"), "mp": groups_varying("tp"), "dp_cp": groups_varying("dc")}
    # Tied input/output embeddings live on the first and last pipeline stage.
    groups["embedding"] = [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in groups["pp"]]
    return groups


def initialize_model_parallel(tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1,
                              virtual_pipeline_model_parallel_size: int | None = None,
                              context_parallel_size: int = 1) -> None:
    """Build every process group of the grid (all ranks must call this, in the same order)."""
    global _STATE
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialised before initialize_model_parallel")
    if _STATE is not None:
        raise RuntimeError("model parallel is already initialised; call destroy_model_parallel first")
    world = dist.get_world_size()
    tp, pp, cp = tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size
    all_groups = generate_rank_groups(world, tp, pp, cp)
    if virtual_pipeline_model_parallel_size is not None:
        if pp < 2 or virtual_pipeline_model_parallel_size < 2:
            raise ValueError("virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size >= 2 and a "
                             f"value >= 2, got pp={pp}, vpp={virtual_pipeline_model_parallel_size}")
    state = _ParallelState(tp=tp, pp=pp, cp=cp, dp=world // (tp * pp * cp), vpp=virtual_pipeline_model_parallel_size,
                           virtual_pipeline_rank=0 if virtual_pipeline_model_parallel_size else None)
    me = dist.get_rank()
    created: dict[tuple, object] = {}
    for kind in _KINDS:
        for ranks in all_groups[kind]:
            # new_group is collective over the world: every rank creates every group (in the same order) and
            # keeps its own; kinds with the same ranks (e.g. dp and dp_cp when cp=1) share one group.
            key = tuple(ranks)
            if key not in created:
                created[key] = dist.new_group(ranks) if len(ranks) < world else dist.group.WORLD
            if me in ranks:
                state.groups[kind], state.group_ranks[kind] = created[key], ranks
    _STATE = state
    logger.info("model parallel initialised: tp=%d pp=%d cp=%d dp=%d", tp, pp, cp, state.dp)


def model_parallel_is_initialized() -> bool:
    return _STATE is not None


def _state() -> _ParallelState:
    if _STATE is None:
        raise RuntimeError("model parallel is not initialised; call initialize_model_parallel first")
    return _STATE


def destroy_model_parallel() -> None:
    """Forget the grid, as Megatron's ``destroy_model_parallel`` does: the groups are dropped, not destroyed
    (torch keeps them until its default group is destroyed), so no rank closes gloo pairs a peer may still be
    connecting while the next grid's ``new_group`` runs."""
    global _STATE
    _STATE = None


def rank_grid(world_size: int, tp: int, pp: int, cp: int = 1) -> str:
    """Text diagram of the grid: one block per pipeline stage, rows = DP replicas, columns = TP ranks."""
    dp = world_size // (tp * pp * cp) if world_size % (tp * pp * cp) == 0 else None
    generate_rank_groups(world_size, tp, pp, cp)  # validates
    lines = [f"world={world_size}  tp={tp} cp={cp} dp={dp} pp={pp}  (order tp-cp-dp-pp)"]
    for p in range(pp):
        lines.append(f"pipeline stage {p}:")
        for d in range(dp):
            for c in range(cp):
                row = " ".join(f"{_rank_of(t, c, d, p, tp, cp, dp):>3}" for t in range(tp))
                lines.append(f"  dp {d}" + (f" cp {c}" if cp > 1 else "") + f" | tp ranks:{row}")
    return "\n".join(lines)


def print_rank_grid(world_size: int | None = None, tp: int | None = None, pp: int | None = None) -> str:
    """Log (and return) the rank grid of the current or given layout."""
    if world_size is None:
        s = _state()
        world_size, tp, pp, cp = dist.get_world_size(), s.tp, s.pp, s.cp
    else:
        cp = 1
    text = rank_grid(world_size, tp, pp, cp)
    logger.info("\n%s", text)
    return text


def _group(kind):
    return _state().groups[kind]


def _rank_in(kind) -> int:
    return _state().group_ranks[kind].index(dist.get_rank())


def _maybe(kind, check_initialized: bool):
    """Megatron's ``check_initialized=False``: None instead of an error before the grid exists."""
    if not check_initialized and _STATE is None:
        return None
    return _group(kind)


def get_tensor_model_parallel_group(check_initialized: bool = True):
    return _maybe("tp", check_initialized)


def get_pipeline_model_parallel_group(check_initialized: bool = True):
    return _maybe("pp", check_initialized)


def get_data_parallel_group(with_context_parallel: bool = False):
    return _group("dp_cp" if with_context_parallel else "dp")


def get_context_parallel_group(check_initialized: bool = True):
    return _maybe("cp", check_initialized)


def get_model_parallel_group(check_initialized: bool = True):
    return _maybe("mp", check_initialized)


def get_embedding_group(check_initialized: bool = True):
    """The first+last stage group of tied embeddings; None on middle stages, which are in none."""
    if not check_initialized and _STATE is None:
        return None
    return _state().groups.get("embedding")


def get_tensor_model_parallel_world_size() -> int:
    return _state().tp


def get_pipeline_model_parallel_world_size() -> int:
    return _state().pp


def get_context_parallel_world_size() -> int:
    return _state().cp


def get_data_parallel_world_size(with_context_parallel: bool = False) -> int:
    s = _state()
    return s.dp * (s.cp if with_context_parallel else 1)


def get_tensor_model_parallel_rank() -> int:
    return _rank_in("tp")


def get_pipeline_model_parallel_rank() -> int:
    return _rank_in("pp")


def get_context_parallel_rank() -> int:
    return _rank_in("cp")


def get_data_parallel_rank(with_context_parallel: bool = False) -> int:
    return _rank_in("dp_cp" if with_context_parallel else "dp")


def get_tensor_model_parallel_src_rank() -> int:
    """The global rank of TP rank 0 in this rank's TP group (for broadcasting data)."""
    return _state().group_ranks["tp"][0]


def get_data_parallel_src_rank(with_context_parallel: bool = False) -> int:
    """The global rank of DP rank 0 in this rank's DP group (the replica that broadcasts weights)."""
    return _state().group_ranks["dp_cp" if with_context_parallel else "dp"][0]


def get_pipeline_model_parallel_next_rank() -> int:
    ranks = _state().group_ranks["pp"]
    return ranks[(ranks.index(dist.get_rank()) + 1) % len(ranks)]


def get_pipeline_model_parallel_prev_rank() -> int:
    ranks = _state().group_ranks["pp"]
    return ranks[(ranks.index(dist.get_rank()) - 1) % len(ranks)]


def get_pipeline_model_parallel_first_rank() -> int:
    return _state().group_ranks["pp"][0]


def get_pipeline_model_parallel_last_rank() -> int:
    return _state().group_ranks["pp"][-1]


def get_embedding_group_ranks() -> list[int]:
    """Ranks of this rank's embedding group (empty on middle pipeline stages)."""
    return list(_state().group_ranks.get("embedding", ()))


def get_virtual_pipeline_model_parallel_world_size() -> int | None:
    return _state().vpp


def get_virtual_pipeline_model_parallel_rank() -> int | None:
    return _state().virtual_pipeline_rank


def set_virtual_pipeline_model_parallel_rank(rank: int | None) -> None:
    _state().virtual_pipeline_rank = rank


def _virtual_rank(vp_stage: int | None) -> int | None:
    return _state().virtual_pipeline_rank if vp_stage is None else vp_stage


def is_pipeline_first_stage(ignore_virtual: bool = False, vp_stage: int | None = None) -> bool:
    """The first pipeline stage (and, unless ``ignore_virtual``, its first virtual chunk: ``vp_stage`` if
    given, else the current virtual rank)."""
    s = _state()
    if not ignore_virtual and s.vpp is not None and _virtual_rank(vp_stage) != 0:
        return False
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage(ignore_virtual: bool = False, vp_stage: int | None = None) -> bool:
    s = _state()
    if not ignore_virtual and s.vpp is not None and _virtual_rank(vp_stage) != s.vpp - 1:
        return False
    return get_pipeline_model_parallel_rank() == s.pp - 1


def is_rank_in_embedding_group(ignore_virtual: bool = False, vp_stage: int | None = None) -> bool:
    s = _state()
    if dist.get_rank() not in s.group_ranks.get("embedding", ()):
        return False
    if ignore_virtual:
        return True
    return is_pipeline_first_stage(vp_stage=vp_stage) or is_pipeline_last_stage(vp_stage=vp_stage)


def is_initialized() -> bool:
    """Whether the grid is set up (Megatron's, for code that runs with or without it)."""
    return model_parallel_is_initialized()


def get_expert_model_parallel_world_size() -> int:
    """1: mega_par has no expert parallelism, so every rank holds all experts (Megatron's value at EP=1)."""
    _state()
    return 1


def get_expert_model_parallel_rank() -> int:
    _state()
    return 0
