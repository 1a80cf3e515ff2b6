"""Helpers shared by the model files: reading transformers' config fields, loading a checkpoint into the layers."""

from __future__ import annotations

from collections.abc import Iterable

from paged_serve.model_executor.layers.linear import default_weight_loader
from torch import nn


def rope_parameters(config: dict) -> dict:
    """transformers 5's ``rope_parameters``, or the older ``rope_theta`` + ``rope_scaling`` pair."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params:
        params = dict(params)
    else:
        params = dict(config.get("rope_scaling") or {})
        params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def load_weights(model: nn.Module, weights: Iterable[tuple[str, object]], stacked_params_mapping=(),
                 skip: tuple[str, ...] = (), rename=lambda name: name) -> None:  # fmt: skip
    """vLLM's ``load_weights``: every checkpoint tensor goes to its parameter's layer's ``weight_loader`` (a
    separate q/k/v or gate/up tensor with its shard id, so the loader stacks it into the fused parameter); then
    every parameter (every shard of a fused one) must have been filled."""
    params = dict(model.named_parameters())  # a tied head is the embedding: listed once
    tied = getattr(model, "tie_word_embeddings", False)
    loaded: set[str] = set()
    for checkpoint_name, tensor in weights:
        if any(part in checkpoint_name for part in skip) or (tied and checkpoint_name == "lm_head.weight"):
            continue
        name, shard = rename(checkpoint_name), None
        for part, fused, shard_id in stacked_params_mapping:
            if f".{part}." in name:
                name, shard = name.replace(f".{part}.", f".{fused}."), shard_id
                break
        if name not in params:
            raise ValueError(f"unexpected tensor {checkpoint_name!r} in the checkpoint (no parameter {name!r})")
        loader = getattr(model.get_submodule(name.rpartition(".")[0]), "weight_loader", None)
        try:
            if loader is None:
                default_weight_loader(params[name], tensor)
            else:
                loader(params[name], tensor, *([] if shard is None else [shard]))
        except ValueError as exc:
            raise ValueError(f"{checkpoint_name}: {exc}") from None
        loaded.add(name if shard is None else f"{name}#{shard}")
    missing = []
    for name in params:
        shards = [f"{name}#{sid}" for _, fused, sid in stacked_params_mapping if f".{fused}." in name]
        if name not in loaded and not (shards and loaded.issuperset(shards)):
            missing.append(name)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} tensors: {shown}")
