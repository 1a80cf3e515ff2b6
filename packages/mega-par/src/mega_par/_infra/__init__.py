"""Infrastructure: the hardening the core calls at one point (atomic file writes). Imports neither the core nor
``_compat``."""
