"""``hf_lite.utils.hub`` (transformers' ``utils/hub.py``): hub names resolved through ``huggingface_hub``, and the
uploads (``PushToHubMixin``), in ``_infra/hub.py``."""

from .._infra.hub import PushInProgress, PushToHubMixin, cached_file, cached_files, create_and_tag_model_card

__all__ = ["PushInProgress", "PushToHubMixin", "cached_file", "cached_files", "create_and_tag_model_card"]
