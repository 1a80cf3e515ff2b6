"""A Hugging Face hub cache in huggingface_hub's own layout, written by tests (nothing is downloaded)."""

from __future__ import annotations

import shutil
from pathlib import Path


def add_to_hub_cache(cache_dir, repo_id: str, model_dir, sha: str, refs=("main",), files=None) -> Path:
    """``models--org--name/refs/<ref>`` holding ``sha`` and ``snapshots/<sha>/`` holding ``model_dir``'s files
    (all of them, or the names in ``files``); returns the snapshot directory."""
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True)
    for path in Path(model_dir).iterdir():
        if files is None or path.name in files:
            shutil.copy(path, snapshot / path.name)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(sha)
    return snapshot
