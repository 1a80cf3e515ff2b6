"""pt_dist."""

__version__ = "0.1.0"
