"""``CheckpointException`` (torch/distributed/checkpoint/api.py): what every rank raises when any rank's step of
a save or load failed; ``failures`` maps each failed rank to its (exception, traceback). It lives with the steps
that raise it, ``pt_dist/_infra/collective_steps.py``."""

from pt_dist._infra.collective_steps import CheckpointException

__all__ = ["CheckpointException"]
