"""What ``torch.distributed.checkpoint`` offers beyond DCP's save and load: ``state_dict.py`` (model and
optimizer state dicts over DDP, FSDP1 and fully_shard models, torch's ``checkpoint/state_dict.py``) and the moves
it makes (``state_dict_utils.py``, torch's ``distributed/_state_dict_utils.py``)."""
