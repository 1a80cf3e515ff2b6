"""transformers' ``utils`` package: logging, version checks, availability checks."""
