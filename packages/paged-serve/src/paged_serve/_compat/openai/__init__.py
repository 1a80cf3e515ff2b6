"""vLLM's OpenAI-compatible server (``vllm/entrypoints/openai/``): routes, request bodies, completions, chat."""
