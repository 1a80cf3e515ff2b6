"""``hf_lite.utils.hub`` (transformers' ``utils/hub.py``): hub names resolved through ``huggingface_hub``, in
``_infra/hub.py``."""

from .._infra.hub import cached_file, cached_files

__all__ = ["cached_file", "cached_files"]
