"""mega_par: Megatron-LM's core rebuilt small on torch.distributed.

Parallel state (the MPU), tensor/sequence parallel layers, a GPT model, pipeline schedules,
data parallelism with a distributed optimizer, 3D training and checkpoint conversion to Hugging Face.
"""

__version__ = "0.1.0"
