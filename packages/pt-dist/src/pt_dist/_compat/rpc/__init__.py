"""Compatibility for ``torch.distributed.rpc``: torch's surface over pt_dist/rpc/ (``init_rpc``'s signature, the
RRef proxies and conveniences, ``async_execution``, the agent queries); ``pt_dist.rpc`` re-exports them under
torch's names."""
