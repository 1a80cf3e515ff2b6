"""What runs the model: the KV cache tensors, its size, and the packed forward pass."""
