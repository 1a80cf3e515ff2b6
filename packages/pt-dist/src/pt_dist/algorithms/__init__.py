"""Training algorithms over pt_dist groups (torch.distributed.algorithms)."""
