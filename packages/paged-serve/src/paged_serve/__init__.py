"""paged_serve."""

__version__ = "0.1.0"
