"""The engine: LLMEngine (synchronous steps), AsyncLLMEngine (for the server), arguments, statistics."""
