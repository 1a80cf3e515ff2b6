"""mega_par."""

__version__ = "0.1.0"
