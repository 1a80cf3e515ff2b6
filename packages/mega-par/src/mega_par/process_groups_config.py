"""``ProcessGroupCollection`` (``megatron/core/process_groups_config.py``): the process groups a model uses, handed
to it explicitly (``pg_collection=``) instead of read from parallel_state. Here the groups mega_par's grid has:
``tp``, ``pp``, ``mp``, ``cp``, ``dp``, ``dp_cp``, ``embd`` (None on middle pipeline stages)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from mega_par import parallel_state

_FROM_MPU = {
    "tp": lambda: parallel_state.get_tensor_model_parallel_group(check_initialized=False),
    "pp": lambda: parallel_state.get_pipeline_model_parallel_group(check_initialized=False),
    "mp": lambda: parallel_state.get_model_parallel_group(check_initialized=False),
    "cp": lambda: parallel_state.get_context_parallel_group(check_initialized=False),
    "dp": lambda: parallel_state.get_data_parallel_group() if parallel_state.is_initialized() else None,
    "dp_cp": lambda: parallel_state.get_data_parallel_group(with_context_parallel=True)
    if parallel_state.is_initialized() else None,
    "embd": lambda: parallel_state.get_embedding_group(check_initialized=False),
}


@dataclass(init=False)
class ProcessGroupCollection:
    tp: object = field(default=None)
    pp: object = field(default=None)
    mp: object = field(default=None)
    cp: object = field(default=None)
    dp: object = field(default=None)
    dp_cp: object = field(default=None)
    embd: object = field(default=None)

    def __init__(self, **kwargs):
        known = {f.name for f in fields(self)}
        for key, value in kwargs.items():
            if key not in known:
                raise ValueError(f"Unknown attribute: {key} (mega_par's grid has the groups {sorted(known)}; "
                                 "no expert, hierarchical-CP or distributed-optimizer-instance groups)")
            setattr(self, key, value)

    @classmethod
    def use_mpu_process_groups(cls, required_pgs: list[str] | None = None) -> ProcessGroupCollection:
        """parallel_state's groups (all, or those named in ``required_pgs``)."""
        names = list(_FROM_MPU) if required_pgs is None else list(required_pgs)
        invalid = [n for n in names if n not in _FROM_MPU]
        if invalid:
            raise ValueError(f"Invalid process groups requested: {invalid}")
        return cls(**{n: _FROM_MPU[n]() for n in names})
