"""Hugging Face hub names to local directories, through ``huggingface_hub`` (vLLM ``model_loader/weight_utils.py``
``download_weights_from_hf`` and ``transformers_utils/config.py``'s cache lookups).

``get_model_path("org/name", revision, download_dir)``: a local directory is used as it is; otherwise the snapshot
the hub cache holds for that revision (``models--org--name/refs/<ref>`` -> ``snapshots/<sha>/``, in ``download_dir``
or ``HF_HUB_CACHE`` / ``HF_HOME``); otherwise, unless ``HF_HUB_OFFLINE`` is set, a download of the files the engine
reads (``snapshot_download`` with ``allow_patterns``). ``try_get_generation_config`` reads generation_config.json.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants

logger = logging.getLogger(__name__)

MODEL_FILES = ["*.safetensors", "*.json", "*.jinja"]  # weights + index, config, tokenizer, generation config
TOKENIZER_FILES = ["*.json", "*.jinja"]
IGNORE_PATTERNS = ["original/**/*"]  # consolidated copies some repos carry beside the HF weights (vLLM skips them)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def is_hub_name(name: str) -> bool:
    """``org/name`` or ``name`` in the hub's spelling (no ``..``, no leading ``/`` or ``.``)."""
    return bool(_REPO_ID.match(name)) and ".." not in name and not name.endswith((".", "-"))


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (``huggingface_hub.constants`` read it once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE")
    return constants.HF_HUB_OFFLINE if value is None else value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> str:
    """``HF_HUB_CACHE``, else ``HF_HOME/hub``, as set now; else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return constants.HF_HUB_CACHE


def cached_snapshot(repo_id: str, revision: str | None, cache_dir: str, probe: str) -> str | None:
    """The cached snapshot directory of ``repo_id`` at ``revision`` (a ref or a commit sha) holding ``probe``."""
    found = huggingface_hub.try_to_load_from_cache(repo_id, probe, cache_dir=cache_dir, revision=revision)
    return str(Path(found).parent) if isinstance(found, str) else None


def download_weights_from_hf(
    model_name_or_path: str,
    cache_dir: str | None,
    allow_patterns: list[str],
    revision: str | None = None,
    ignore_patterns: list[str] | None = None,
    token: bool | str | None = None,
) -> str:
    """Download a snapshot of the files matching ``allow_patterns`` into the hub cache; its local directory.
    ``token`` is huggingface_hub's: a token string, True for the saved login, None for ``HF_TOKEN`` / the login."""
    logger.info("downloading %s (revision %s) into %s", model_name_or_path, revision or "main", cache_dir)
    try:
        return huggingface_hub.snapshot_download(
            repo_id=model_name_or_path,
            revision=revision,
            cache_dir=cache_dir,
            allow_patterns=allow_patterns,
            ignore_patterns=ignore_patterns if ignore_patterns is not None else IGNORE_PATTERNS,
            token=token,
        )
    except Exception as exc:  # network, authentication, unknown repo or revision: one error naming the model
        raise OSError(f"could not download {model_name_or_path!r} (revision {revision or 'main'}): {exc}") from exc


def get_model_path(
    model: str,
    revision: str | None = None,
    download_dir: str | None = None,
    allow_patterns: list[str] | None = None,
    probe: str = "config.json",
    token: bool | str | None = None,
) -> str:
    """A local directory holding ``model``: itself if it is one, else its cached hub snapshot, else a download
    (authenticated with ``token``, vLLM's ``hf_token``)."""
    if Path(model).is_dir():
        return model
    if not is_hub_name(model):
        raise ValueError(f"model {model!r} is not a directory and not a Hugging Face hub name ('org/name')")
    cache_dir = download_dir or hub_cache_dir()
    snapshot = cached_snapshot(model, revision, cache_dir, probe)
    if snapshot is not None:
        return snapshot
    if hub_offline():
        raise OSError(
            f"{model!r} (revision {revision or 'main'}) is neither a local directory nor in the Hugging Face cache "
            f"{cache_dir} ({probe} not found), and HF_HUB_OFFLINE is set: download it first or unset HF_HUB_OFFLINE"
        )
    return download_weights_from_hf(model, cache_dir, allow_patterns or MODEL_FILES, revision, token=token)


def try_get_generation_config(model_dir: str) -> dict:
    """generation_config.json of a checkpoint directory as a dict, or ``{}`` if it has none."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text())
