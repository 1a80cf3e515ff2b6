"""Helpers shared by the model files: reading transformers' config fields, checking a load was complete."""

from __future__ import annotations


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


def check_loaded(expected: set[str], loaded: set[str]) -> None:
    missing = sorted(expected - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} tensors: {shown}")
