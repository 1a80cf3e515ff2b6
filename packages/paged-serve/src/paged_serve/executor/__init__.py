"""vLLM's executors: the driver's worker here, the other ranks in worker processes (``multiproc_executor.py``)."""
