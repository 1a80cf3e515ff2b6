"""Compatibility: what exists only so torch's own code and scripts run on pt-dist. It imports the core; the core
never imports it. The package facades (``pt_dist``, ``pt_dist.fsdp``, ...) re-export it under torch's names."""
