"""Plumbing the core calls at one point, with no ds_zero types in it: crash-safe file writes, the swap files'
aligned asynchronous I/O, the C++ ops' just-in-time build."""
