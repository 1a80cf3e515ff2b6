"""What exists only so DeepSpeed's scripts, configs and command lines run on ds_zero: each module names the
upstream surface it serves and wraps the core (``ds_zero.engine``, ``ds_zero.runtime``, ``ds_zero.pipe``); the
core never imports it."""
