"""What exists only so transformers' code runs unchanged on hf-lite: the tokenizer interface, the Trainer's surface
(its arguments, built-in callbacks, reporting integrations, metrics files, torchrun and DDP), data collators,
streamers, argument parsing, logging and version helpers. Each module wraps the core and imports it; the core never
imports these."""
