"""vLLM's ``vllm.v1`` import paths."""
