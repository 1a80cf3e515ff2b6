"""The error every ``dist_checkpointing`` failure raises (``megatron/core/dist_checkpointing/core.py``)."""


class CheckpointingException(Exception):
    """A checkpoint that cannot be saved or loaded as asked; the message names the key or the file."""
