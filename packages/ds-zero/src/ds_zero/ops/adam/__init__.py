from ds_zero.ops.adam.cpu_adam import CPUAdam, CPUAdamW, DeepSpeedCPUAdam

__all__ = ["CPUAdam", "CPUAdamW", "DeepSpeedCPUAdam"]
