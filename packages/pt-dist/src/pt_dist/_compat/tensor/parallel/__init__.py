"""torch's tensor-parallel API (``torch.distributed.tensor.parallel``) over pt_dist's DTensor: the styles
(``style.py``), ``parallelize_module`` (``api.py``) and ``loss_parallel`` (``loss.py``)."""
