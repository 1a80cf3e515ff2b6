"""Compatibility for ``torch.distributed.autograd``: ``backward``'s argument checks with torch's messages, and
``_get_debug_info``."""
