"""Hugging Face formats the engine reads: tokenizer.json and tokenizer_config.json."""
