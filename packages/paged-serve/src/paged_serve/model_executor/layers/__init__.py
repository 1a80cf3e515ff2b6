"""Model building blocks over the paged KV cache: attention, rotary embedding, norms, the sampler."""
