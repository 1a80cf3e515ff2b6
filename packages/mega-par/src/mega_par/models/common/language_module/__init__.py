"""``megatron.core.models.common.language_module``."""
