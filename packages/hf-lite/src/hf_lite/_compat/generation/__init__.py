"""transformers' ``generation`` surface beyond the decoding loop (streamers)."""
