"""The hub keyword arguments of every ``from_pretrained`` (transformers' ``utils/hub.py`` names them): on a local
directory ``cache_dir``, ``revision``, ``token``, ``force_download``, ``local_files_only``, ``low_cpu_mem_usage``...
change nothing and are accepted; ``from_tf=True`` and remote code (``trust_remote_code=True`` with an ``auto_map``)
are errors naming what hf-lite does not do."""

from __future__ import annotations

HUB_KWARGS = ("cache_dir", "revision", "token", "use_auth_token", "force_download", "local_files_only", "proxies",
              "resume_download", "mirror", "code_revision", "_commit_hash", "_from_auto", "_from_pipeline",
              "user_agent", "low_cpu_mem_usage", "from_flax", "adapter_kwargs")


def pop_hub_kwargs(kwargs: dict) -> bool:
    """Remove the hub kwargs from ``kwargs`` (checking ``from_tf``); returns ``trust_remote_code``."""
    for key in HUB_KWARGS:
        kwargs.pop(key, None)
    if kwargs.pop("from_tf", False):
        raise ValueError("from_tf=True: hf-lite loads PyTorch checkpoints only (safetensors or .bin), not TensorFlow")
    return bool(kwargs.pop("trust_remote_code", False))


def check_remote_code(config_dict: dict, trust_remote_code: bool, where) -> None:
    """``trust_remote_code=True`` for a config.json with an ``auto_map`` asks to run the checkpoint's own code."""
    if trust_remote_code and "auto_map" in config_dict:
        raise ValueError(
            f"trust_remote_code=True: {where} asks for its own code ({config_dict['auto_map']}); hf-lite does not run "
            "code from checkpoints. Register the classes with AutoConfig/AutoModel.register and pass "
            "trust_remote_code=False"
        )
