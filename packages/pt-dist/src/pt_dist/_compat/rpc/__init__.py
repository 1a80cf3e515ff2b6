"""Compatibility for ``torch.distributed.rpc``: the parts of its surface that query or tune the running agent
rather than make calls (``agent_queries.py``); ``pt_dist.rpc`` re-exports them under torch's names."""
