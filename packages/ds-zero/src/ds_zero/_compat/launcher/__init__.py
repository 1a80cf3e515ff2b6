"""DeepSpeed's ``deepspeed`` command (``deepspeed/launcher/``) as ``ds-zero``: ``hostfile`` reads the resource
pool and its filters, ``runner`` is the command line, ``launch`` one node's torchrun, ``local_rank`` the per-rank
step that passes ``--local_rank``."""
