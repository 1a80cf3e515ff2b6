"""``ds_zero.ops``: C++ ops built on first use (DeepSpeed's ``deepspeed.ops``)."""

from ds_zero.ops.adam import CPUAdam, CPUAdamW, DeepSpeedCPUAdam

__all__ = ["CPUAdam", "CPUAdamW", "DeepSpeedCPUAdam"]
