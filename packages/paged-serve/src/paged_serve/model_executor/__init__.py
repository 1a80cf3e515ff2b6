"""Models written on the paged attention kernels, their layers, the sampler and the checkpoint loader."""
