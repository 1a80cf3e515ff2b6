"""``torch.distributed.checkpoint.state_dict``: state dicts keyed by the plain module's names whatever wraps the
model (DDP, FSDP1, fully_shard, tensor parallel), and back. State-dict plumbing over the parallel wrappers, so
it lives in ``pt_dist/_compat/checkpoint/state_dict.py``."""

from pt_dist._compat.checkpoint.state_dict import (
    FQNS_T,
    DictValueType,
    ListDictValueType,
    OptimizerStateType,
    PrimitiveType,
    StateDictOptions,
    ValueType,
    _init_optim_state,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

__all__ = ["StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict", "get_state_dict",
           "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict"]
_ = (_init_optim_state,)  # torch's private helper, imported by pytorch/examples' FSDP2 checkpoint.py
_ = (FQNS_T, DictValueType, ListDictValueType, OptimizerStateType, PrimitiveType, ValueType)  # torch's type aliases
