"""Hub names resolved to local files through ``huggingface_hub`` (transformers' ``utils/hub.py``: ``cached_file``,
``cached_files``): a local directory is used as it is; any other name is a repo id whose files come from the cache
(``HF_HUB_CACHE`` / ``HF_HOME``: ``models--org--name/refs``, ``snapshots/<sha>``, ``blobs``) or are downloaded into
it by ``hf_hub_download`` (never when ``HF_HUB_OFFLINE=1`` or ``local_files_only=True``). The loaders then read the
directory the files lie in: the repo's snapshot (and ``subfolder``) or the local directory.

Saving goes through it too: the shard split transformers' ``save_pretrained`` asks ``huggingface_hub`` for, and the
uploads: ``PushToHubMixin`` (transformers' ``utils/hub.py``: ``push_to_hub`` saves into a temporary directory and
commits its files; ``save_pretrained(push_to_hub=True)`` commits the files the save changed), and the repo and folder
calls of the Trainer's pushes. This is the only module that calls ``huggingface_hub``; it imports nothing of hf-lite.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

from huggingface_hub import (
    _CACHED_NO_EXIST,
    CommitOperationAdd,
    HfApi,
    ModelCard,
    ModelCardData,
    constants,
    hf_hub_download,
    split_torch_state_dict_into_shards,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name

logger = logging.getLogger(__name__)

# What transformers' from_pretrained accepts for the download (``DownloadKwargs``), and what it accepts but changes
# nothing here (no mirrors, no remote code revisions, no low-memory loader: the loader is already lazy per shard).
DOWNLOAD_KWARGS = ("cache_dir", "force_download", "proxies", "token", "revision", "local_files_only", "user_agent")
IGNORED_KWARGS = ("use_auth_token", "resume_download", "mirror", "code_revision", "_commit_hash", "_from_auto",
                  "_from_pipeline", "low_cpu_mem_usage", "from_flax", "adapter_kwargs", "tqdm_class")


def pop_hub_kwargs(kwargs: dict) -> tuple[dict, bool]:
    """Remove the hub kwargs from ``kwargs``: returns the download ones (for ``cached_files``) and
    ``trust_remote_code``; ``from_tf=True`` is an error."""
    download = {key: kwargs.pop(key) for key in DOWNLOAD_KWARGS if key in kwargs}
    if kwargs.get("use_auth_token") is not None and download.get("token") is None:
        download["token"] = kwargs["use_auth_token"]  # transformers 4's name for token
    for key in IGNORED_KWARGS:
        kwargs.pop(key, None)
    if kwargs.pop("from_tf", False):
        raise ValueError("from_tf=True: hf-lite loads PyTorch checkpoints only (safetensors or .bin), not TensorFlow")
    return download, bool(kwargs.pop("trust_remote_code", False))


def check_remote_code(config_dict: dict, trust_remote_code: bool, where) -> None:
    """``trust_remote_code=True`` for a config.json with an ``auto_map`` asks to run the checkpoint's own code."""
    if trust_remote_code and "auto_map" in config_dict:
        raise ValueError(
            f"trust_remote_code=True: {where} asks for its own code ({config_dict['auto_map']}); hf-lite does not run "
            "code from checkpoints. Register the classes with AutoConfig/AutoModel.register and pass "
            "trust_remote_code=False"
        )


def _missing_entry_error(repo: str, names: list[str], revision: str | None) -> OSError:
    what = f"a file named {names[0]}" if len(names) == 1 else f"files named {tuple(names)}"
    return OSError(f"{repo} does not appear to have {what}. Checkout "
                   f"'https://huggingface.co/{repo}/tree/{revision or 'main'}' for available files.")


def _snapshot_cached(repo_id: str, revision: str | None, cache_dir: str) -> bool:
    """Whether the cache holds a snapshot of ``repo_id`` at ``revision`` (a ref under ``refs/`` or a commit)."""
    repo_cache = os.path.join(cache_dir, repo_folder_name(repo_id=repo_id, repo_type="model"))
    ref = os.path.join(repo_cache, "refs", revision or "main")
    commit = revision or "main"
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            commit = f.read().strip()
    return os.path.isdir(os.path.join(repo_cache, "snapshots", commit))


def _download(repo_id: str, filename: str, subfolder: str, cache_dir: str, revision: str | None,
              raise_for_connection: bool, **download) -> str | None:
    """One file of a repo, from the cache or downloaded; None when the repo (at ``revision``) does not have it."""
    full_name = os.path.join(subfolder, filename)
    if revision is not None and REGEX_COMMIT_HASH.match(revision) and not download.get("force_download"):
        # A commit never changes: a file (or its recorded absence) cached for it is the answer, without a request.
        cached = try_to_load_from_cache(repo_id, full_name, cache_dir=cache_dir, revision=revision)
        if cached is not None:
            return None if cached is _CACHED_NO_EXIST else cached
    try:
        return hf_hub_download(repo_id, filename, subfolder=subfolder or None, revision=revision,
                               cache_dir=cache_dir, **download)
    except LocalEntryNotFoundError as err:  # offline, or the hub unreachable: only the cache can answer
        if _snapshot_cached(repo_id, revision, cache_dir):
            return None  # the snapshot is there and this file is not in it
        if not raise_for_connection:
            return None
        raise OSError(
            f"We couldn't connect to '{constants.ENDPOINT}' to load the files, and couldn't find them in the cached "
            "files.\nCheck your internet connection or see how to run the library in offline mode at "
            "'https://huggingface.co/docs/transformers/installation#offline-mode'.\n"
            f"{repo_id!r} is not a local directory, and the cache {cache_dir} has no snapshot of it at revision "
            f"{revision or 'main'!r}."
        ) from err
    except EntryNotFoundError:
        return None
    except GatedRepoError as err:
        raise OSError(f"You are trying to access a gated repo.\nMake sure to have access to it at "
                      f"https://huggingface.co/{repo_id}.\n{err}") from err
    except RepositoryNotFoundError as err:
        raise OSError(
            f"{repo_id} is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token having "
            "permission to this repo either by logging in with `hf auth login` or by passing `token=<your_token>`"
        ) from err
    except RevisionNotFoundError as err:
        raise OSError(f"{revision} is not a valid git identifier (branch name, tag name or commit id) that exists for "
                      f"this model name. Check the model page at 'https://huggingface.co/{repo_id}' for available "
                      "revisions.") from err
    except HfHubHTTPError as err:
        raise OSError(f"There was a specific connection error when trying to load {repo_id}:\n{err}") from err
    except ValueError as err:  # not a valid repo id: most often a local path that does not exist
        raise OSError(f"{err} ({repo_id!r} is not a local directory either)") from err


def cached_files(path_or_repo_id: str | os.PathLike, filenames: list[str], cache_dir: str | os.PathLike | None = None,
                 force_download: bool = False, proxies: dict | None = None, token: bool | str | None = None,
                 revision: str | None = None, local_files_only: bool = False, subfolder: str = "",
                 user_agent: dict | str | None = None, _raise_exceptions_for_missing_entries: bool = True,
                 _raise_exceptions_for_connection_errors: bool = True) -> list[str | None]:
    """The local path of each of ``filenames`` (None for those missing, when missing entries do not raise).

    transformers' ``cached_files``, one ``hf_hub_download`` per file: a missing file raises its "does not appear to
    have a file named" error, a repo that is not cached while offline its "We couldn't connect" error (plus the name).
    """
    subfolder = subfolder or ""
    path_or_repo_id = os.fspath(path_or_repo_id)
    if os.path.isdir(path_or_repo_id):
        resolved = [os.path.join(path_or_repo_id, subfolder, name) for name in filenames]
        resolved = [path if os.path.isfile(path) else None for path in resolved]
    else:
        local_files_only = local_files_only or constants.is_offline_mode()
        cache_dir = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
        download = {"force_download": force_download, "proxies": proxies, "token": token,
                    "local_files_only": local_files_only, "user_agent": user_agent}
        resolved = [_download(path_or_repo_id, name, subfolder, cache_dir, revision,
                              _raise_exceptions_for_connection_errors, **download) for name in filenames]
    missing = [os.path.join(subfolder, n) for n, path in zip(filenames, resolved) if path is None]
    if missing and _raise_exceptions_for_missing_entries:
        raise _missing_entry_error(path_or_repo_id, missing, revision)
    return resolved


def cached_file(path_or_repo_id: str | os.PathLike, filename: str, **kwargs) -> str | None:
    """One file (transformers' ``cached_file``)."""
    return cached_files(path_or_repo_id, [filename], **kwargs)[0]


def _directory(path_or_repo_id, subfolder: str, resolved: list[str | None], filenames: list[str]) -> str:
    """Where the resolved files lie: the local directory, or the snapshot directory (+ subfolder) of the repo."""
    if os.path.isdir(os.fspath(path_or_repo_id)):
        return os.path.join(os.fspath(path_or_repo_id), subfolder or "")
    for path, name in zip(resolved, filenames):
        if path is not None:
            return path[: -len(name)].rstrip("/" + os.sep) or path
    raise _missing_entry_error(os.fspath(path_or_repo_id), [os.path.join(subfolder or "", n) for n in filenames],
                               None)


def cached_directory(path_or_repo_id: str | os.PathLike, filenames: list[str], subfolder: str = "",
                     **download) -> str:
    """The directory holding whichever of ``filenames`` the repo has (each fetched if needed): a tokenizer's files."""
    resolved = cached_files(path_or_repo_id, filenames, subfolder=subfolder,
                            _raise_exceptions_for_missing_entries=False, **download)
    return _directory(path_or_repo_id, subfolder, resolved, filenames)


def cached_checkpoint(path_or_repo_id: str | os.PathLike, weight_names: list[str], subfolder: str = "",
                      extra_names: tuple[str, ...] = ("config.json", "generation_config.json"), **download) -> str:
    """The directory of a model checkpoint: ``extra_names`` when the repo has them, then the first of
    ``weight_names`` it has (transformers' order: safetensors, its index, ``.bin``, its index) and, for an index,
    every shard its ``weight_map`` names (transformers' ``get_checkpoint_shard_files``)."""
    if os.path.isdir(os.path.join(os.fspath(path_or_repo_id), subfolder or "")):
        return os.path.join(os.fspath(path_or_repo_id), subfolder or "")
    config = cached_files(path_or_repo_id, list(extra_names[:1]), subfolder=subfolder, **download)
    cached_files(path_or_repo_id, list(extra_names[1:]), subfolder=subfolder,
                 _raise_exceptions_for_missing_entries=False, **download)
    for name in weight_names:
        weights = cached_file(path_or_repo_id, name, subfolder=subfolder,
                              _raise_exceptions_for_missing_entries=False, **download)
        if weights is not None and name.endswith(".json"):
            with open(weights, encoding="utf-8") as f:
                shards = sorted(set(json.load(f).get("weight_map", {}).values()))
            cached_files(path_or_repo_id, shards, subfolder=subfolder, **download)
        if weights is not None:
            break
    return _directory(path_or_repo_id, subfolder, config, list(extra_names[:1]))


def shard_state_dict(state_dict: dict, max_shard_size: int, filename_pattern: str) -> tuple[dict[str, list[str]], dict]:
    """``{file: keys}`` and the index's metadata (``total_size``) as ``huggingface_hub`` splits a torch state dict
    for transformers: in key order, a new shard when the next tensor would pass ``max_shard_size``, a larger tensor
    alone in its own; ``filename_pattern`` is ``model{suffix}.safetensors``."""
    split = split_torch_state_dict_into_shards(state_dict, filename_pattern=filename_pattern,
                                               max_shard_size=max_shard_size)
    return split.filename_to_tensors, split.metadata


def create_repo(repo_id: str, token: bool | str | None = None, private: bool | None = None, **kwargs) -> str:
    """The repo's full id (``user/name``), the repo created if it does not exist."""
    return HfApi().create_repo(repo_id, token=token, private=private, exist_ok=True, **kwargs).repo_id


def upload_folder(**kwargs):
    """``HfApi.upload_folder``: one commit of a directory (a ``Future`` with ``run_as_future=True``)."""
    return HfApi().upload_folder(**kwargs)


class PushInProgress:
    """The background uploads of the Trainer's checkpoint pushes (transformers' ``utils/hub.py``)."""

    def __init__(self, jobs=None) -> None:
        self.jobs = [] if jobs is None else jobs

    def is_done(self) -> bool:
        return all(job.done() for job in self.jobs)

    def wait_until_done(self) -> None:
        for job in self.jobs:
            job.result()

    def cancel(self) -> None:
        self.jobs = [job for job in self.jobs if not (job.cancel() or job.done())]


def create_and_tag_model_card(repo_id: str, tags: list[str] | None = None, token: bool | str | None = None):
    """The repo's README.md as a ``ModelCard`` (a new one from huggingface_hub's template when the repo has none),
    with ``tags`` added (transformers' ``create_and_tag_model_card``)."""
    try:
        card = ModelCard.load(repo_id, token=token)
    except EntryNotFoundError:
        data = ModelCardData(tags=[] if tags is None else list(tags), library_name="transformers")
        card = ModelCard.from_template(data, model_description="A checkpoint in transformers' format, pushed to "
                                       "the Hub by hf-lite. This model card has been generated automatically.")
    card.data.tags = card.data.tags or []
    card.data.tags += [tag for tag in tags or [] if tag not in card.data.tags]
    return card


class PushToHubMixin:
    """``push_to_hub`` for models, configs, generation configs and tokenizers (transformers' ``PushToHubMixin``):
    the repo is created if needed, the object saved with its ``save_pretrained`` and the files committed in one
    ``create_commit``. The class only needs ``save_pretrained(directory, **self._push_save_kwargs(...))``."""

    def _push_save_kwargs(self, max_shard_size, safe_serialization) -> dict:
        return {}  # a model takes max_shard_size / safe_serialization; a config or tokenizer nothing

    def _get_files_timestamps(self, working_dir: str | os.PathLike) -> dict[str, float]:
        if not os.path.isdir(working_dir):
            return {}
        return {f: os.path.getmtime(os.path.join(working_dir, f)) for f in os.listdir(working_dir)}

    def _create_repo(self, save_directory: str | os.PathLike, push_to_hub: bool, kwargs: dict,
                     token: bool | str | None = None) -> dict:
        """``save_pretrained(push_to_hub=True, repo_id=, commit_message=, create_pr=, private=, ...)`` before the
        save: the repo (default: the directory's name) and the files' timestamps; the hub kwargs are taken out of
        ``kwargs``. Without ``push_to_hub`` any kwarg is an error. A model's ``token`` is its own argument: it goes
        to ``create_repo`` too (transformers creates a model's repo without it)."""
        if not push_to_hub:
            if kwargs:
                raise TypeError(f"save_pretrained got unexpected keyword arguments {sorted(kwargs)} (without "
                                "push_to_hub)")
            return {}
        hub = {"commit_message": kwargs.pop("commit_message", None), "create_pr": kwargs.pop("create_pr", False)}
        repo_id = kwargs.pop("repo_id", os.fspath(save_directory).rstrip(os.sep).split(os.sep)[-1])
        if token is not None:
            kwargs["token"] = token
        hub["repo_id"] = HfApi().create_repo(repo_id, exist_ok=True, **kwargs).repo_id
        hub["files_timestamps"] = self._get_files_timestamps(save_directory)
        kwargs.clear()
        return hub

    def _upload_modified_files(self, working_dir: str | os.PathLike, repo_id: str, files_timestamps: dict[str, float],
                               commit_message: str | None = None, token: bool | str | None = None,
                               create_pr: bool = False, revision: str | None = None,
                               commit_description: str | None = None):
        """One commit of the files (and first-level folders) of ``working_dir`` created or modified since
        ``files_timestamps``; the default message names the kind of object ("Upload model", "Upload config", ...)."""
        if commit_message is None:
            name = type(self).__name__
            kind = next((k for k in ("Model", "Config", "Tokenizer") if k in name), None)
            commit_message = f"Upload {kind.lower()}" if kind else f"Upload {name}"
        modified = [f for f in sorted(os.listdir(working_dir)) if f not in files_timestamps
                    or os.path.getmtime(os.path.join(working_dir, f)) > files_timestamps[f]]
        operations = []
        for name in modified:
            path = os.path.join(working_dir, name)
            inner = sorted(os.listdir(path)) if os.path.isdir(path) else [None]
            operations += [CommitOperationAdd(path_or_fileobj=os.path.join(path, f) if f else path,
                                              path_in_repo=f"{name}/{f}" if f else name) for f in inner]
        api = HfApi()
        if revision is not None and not revision.startswith("refs/pr"):
            try:
                api.create_branch(repo_id=repo_id, branch=revision, token=token, exist_ok=True)
            except HfHubHTTPError as err:  # a PR on a repo we cannot write: the branch may exist already
                if not (create_pr and err.response is not None and err.response.status_code == 403):
                    raise
        logger.info("Uploading the following files to %s: %s", repo_id, ",".join(modified))
        return api.create_commit(repo_id=repo_id, operations=operations, commit_message=commit_message,
                                 commit_description=commit_description, token=token, create_pr=create_pr,
                                 revision=revision)

    def push_to_hub(self, repo_id: str, *, commit_message: str | None = None, commit_description: str | None = None,
                    private: bool | None = None, token: bool | str | None = None, revision: str | None = None,
                    create_pr: bool = False, max_shard_size: int | str | None = "50GB", tags: list[str] | None = None,
                    use_temp_dir: bool | None = None, safe_serialization: bool = True):
        """Upload the saved files to ``repo_id`` in one commit (transformers 5's signature; transformers 4's
        ``use_temp_dir=False`` saves into ``./<repo name>`` instead of a temporary directory, and
        ``safe_serialization`` goes to a model's ``save_pretrained``). Returns the ``CommitInfo``."""
        repo_id = HfApi().create_repo(repo_id, private=private, token=token, exist_ok=True).repo_id
        card = create_and_tag_model_card(repo_id, tags, token=token)
        save = self._push_save_kwargs(max_shard_size, safe_serialization)
        if use_temp_dir is False:
            working_dir = repo_id.split("/")[-1]
            timestamps = self._get_files_timestamps(working_dir)
            self.save_pretrained(working_dir, **save)
            card.save(os.path.join(working_dir, "README.md"))
            return self._upload_modified_files(working_dir, repo_id, timestamps, commit_message, token, create_pr,
                                               revision, commit_description)
        with tempfile.TemporaryDirectory() as tmp_dir:
            self.save_pretrained(tmp_dir, **save)
            card.save(os.path.join(tmp_dir, "README.md"))
            return self._upload_modified_files(tmp_dir, repo_id, {}, commit_message, token, create_pr, revision,
                                               commit_description)


class ModelPushToHubMixin(PushToHubMixin):
    """A model's pushes: its ``model_tags`` go into the model card, the save takes the shard size and format, and
    ``save_pretrained(push_to_hub=True)`` writes the card too (transformers' ``PreTrainedModel``)."""

    model_tags: list[str] | None = None

    def add_model_tags(self, tags: list[str] | str) -> None:
        """Tags for the model card of the next push (transformers' ``PreTrainedModel.add_model_tags``)."""
        self.model_tags = list(self.model_tags or [])
        self.model_tags += [tag for tag in ([tags] if isinstance(tags, str) else tags) if tag not in self.model_tags]

    def _push_save_kwargs(self, max_shard_size, safe_serialization) -> dict:
        return {"max_shard_size": max_shard_size, "safe_serialization": safe_serialization}

    def _upload_saved(self, save_directory: str | os.PathLike, token: bool | str | None = None, **hub):
        """After ``save_pretrained(push_to_hub=True)``: the model card, then the commit of the changed files."""
        card = create_and_tag_model_card(hub["repo_id"], self.model_tags, token=token)
        card.save(os.path.join(save_directory, "README.md"))
        return self._upload_modified_files(save_directory, token=token, **hub)

    def push_to_hub(self, repo_id: str, **kwargs):
        tags = list(self.model_tags or [])
        extra = kwargs.get("tags") or []
        tags += [tag for tag in ([extra] if isinstance(extra, str) else extra) if tag not in tags]
        if tags:
            kwargs["tags"] = tags
        return super().push_to_hub(repo_id, **kwargs)
