"""pt-dist's DistributedDataParallel / FullyShardedDataParallel: not built yet (issue 28)."""

from __future__ import annotations

from harness.pipelines.trainers import NotBuiltError


def check(spec) -> None:
    import pt_dist

    name = "FullyShardedDataParallel" if spec.options.get("trainer") == "pt-dist-fsdp" else "DistributedDataParallel"
    if not hasattr(pt_dist, name):
        raise NotBuiltError(f"pt-dist's {name} is not built yet (issue 28); use --trainer hf-lite, ds-zero or mega-par")
    raise NotBuiltError(f"pt-dist's {name} exists but train-then-serve has no path for it yet")


def train(rank: int, world_size: int, spec: dict) -> dict:  # pragma: no cover - check() refuses first
    raise NotBuiltError("pt-dist trainers are not built yet")
