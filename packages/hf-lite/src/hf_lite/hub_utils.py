"""The hub keyword arguments of every ``from_pretrained``, in ``_infra/hub.py`` with the hub access they feed."""

from ._infra.hub import DOWNLOAD_KWARGS, IGNORED_KWARGS, check_remote_code, pop_hub_kwargs

__all__ = ["DOWNLOAD_KWARGS", "IGNORED_KWARGS", "check_remote_code", "pop_hub_kwargs"]
