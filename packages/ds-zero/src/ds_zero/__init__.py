"""ds_zero."""

__version__ = "0.1.0"
