"""What exists only so vLLM's code and clients run unchanged: ``EngineArgs`` and the command line, ``LLM``, the
server's engine loop and the OpenAI-compatible server. It wraps the core and imports it; the core never imports it."""
