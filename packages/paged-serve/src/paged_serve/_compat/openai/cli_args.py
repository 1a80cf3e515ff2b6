"""The ``vllm serve`` flags (and ``LLM`` arguments) paged-serve has no mechanism for (vLLM
``entrypoints/openai/cli_args.py``, ``engine/arg_utils.py``).

Users paste vLLM's server commands. Each flag here is parsed, then either accepted with a logged note (it changes
nothing here: ``--disable-log-stats`` where no stats are logged, ``--enforce-eager`` where there are no CUDA
graphs, ``--pipeline-parallel-size 1``) or refused naming the flag and why (``--enable-lora``, ``--quantization``,
``--kv-cache-dtype fp8``), before any weight is read. The flags paged-serve implements are the engine's
(``EngineArgs.add_cli_args``) and the server's own (``cli.py``); a flag vLLM does not have either stays argparse's
"unrecognized arguments".
"""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

ANY = None  # every value is a no-op
# flag -> (takes a value, the values that change nothing here (ANY: all; () : none), what paged-serve does instead)
VLLM_ONLY_FLAGS: dict[str, tuple[bool, tuple[str, ...] | None, str]] = {
    "--disable-log-stats": (False, ANY, "paged-serve logs no periodic stats (they are at /metrics)"),
    "--enforce-eager": (False, ANY, "paged-serve captures no CUDA graphs: it always runs eagerly"),
    "--trust-remote-code": (False, ANY, "paged-serve runs its own model files, never code from the hub"),
    "--disable-custom-all-reduce": (False, ANY, "tensor parallelism uses torch.distributed's all-reduce"),
    "--disable-frontend-multiprocessing": (False, ANY, "the server and the engine share one process"),
    "--disable-async-output-proc": (False, ANY, "outputs are processed synchronously after each step"),
    "--disable-sliding-window": (False, ANY, "sliding-window models are refused when loaded"),
    "--max-seq-len-to-capture": (True, ANY, "no CUDA graphs are captured"),
    "--uvicorn-log-level": (True, ANY, "uvicorn logs at --log-level"),
    "--hf-token": (True, ANY, "set HF_TOKEN in the environment: huggingface_hub reads it"),
    "--response-role": (True, ("assistant",), "replies always have the role 'assistant'"),
    "--tokenizer-mode": (True, ("auto", "hf"), "the fast tokenizer (tokenizer.json) is the only one"),
    "--load-format": (True, ("auto", "safetensors"), "weights load from safetensors only"),
    "--kv-cache-dtype": (True, ("auto",), "the KV cache has the model's dtype"),
    "--pipeline-parallel-size": (True, ("1",), "no pipeline parallelism (tensor parallelism only)"),
    "--data-parallel-size": (True, ("1",), "one engine per server"),
    "--cpu-offload-gb": (True, ("0",), "weights are never offloaded to the CPU"),
    "--task": (True, ("auto", "generate"), "generative models only"),
    "--max-log-len": (True, ANY, "the request log line carries no prompt text"),
    "--enable-log-requests": (False, ANY, "requests are logged unless --disable-log-requests"),
    "--max-parallel-loading-workers": (True, ANY, "one process reads the checkpoint"),
    "--compilation-config": (True, ANY, "no torch.compile: the model runs eagerly"),
    "--scheduling-policy": (True, ("fcfs",), "first come, first served is the only policy"),
    "--num-scheduler-steps": (True, ("1",), "one scheduler step per model step"),
    "--quantization": (True, (), "no quantized weights"),
    "--hf-overrides": (True, (), "config.json is read as it is"),
    "--limit-mm-per-prompt": (True, (), "text-only models"),
    "--enable-sleep-mode": (False, (), "the engine never offloads its weights to sleep"),
    "--enable-lora": (False, (), "no LoRA adapters"),
    "--lora-modules": (True, (), "no LoRA adapters"),
    "--enable-auto-tool-choice": (False, (), "no tool-call parsing (tools are accepted and ignored)"),
    "--tool-call-parser": (True, (), "no tool-call parsing (tools are accepted and ignored)"),
    "--reasoning-parser": (True, (), "no reasoning parsers"),
    "--speculative-config": (True, (), "no speculative decoding"),
    "--guided-decoding-backend": (True, (), "no guided decoding (response_format other than text is a 400)"),
    "--ssl-keyfile": (True, (), "no TLS: put a TLS-terminating proxy in front"),
    "--ssl-certfile": (True, (), "no TLS: put a TLS-terminating proxy in front"),
    "--allowed-origins": (True, (), "no CORS headers are sent"),
    "--root-path": (True, (), "the routes are served at /"),
}


def _dest(flag: str) -> str:
    return "vllm_" + flag.removeprefix("--").replace("-", "_")


def add_vllm_only_args(parser: argparse.ArgumentParser) -> None:
    """Parse each of vLLM's flags (those the parser does not already take) into ``vllm_<name>``."""
    taken = {s for action in parser._actions for s in action.option_strings}
    group = parser.add_argument_group("vLLM flags accepted as no-ops or refused by name")
    for flag, (takes_value, noop, reason) in VLLM_ONLY_FLAGS.items():
        if flag in taken:
            continue
        kind = "no-op" if noop is ANY else f"no-op only as {'/'.join(noop)}" if noop else "refused"
        help_text = f"vLLM's flag ({kind}): {reason}"
        if takes_value:
            metavar = flag.removeprefix("--").upper().replace("-", "_")
            group.add_argument(flag, dest=_dest(flag), default=None, metavar=metavar, help=help_text)
        else:
            group.add_argument(flag, dest=_dest(flag), action="store_true", default=None, help=help_text)


def _is_noop(flag: str, value) -> bool:
    takes_value, noop, _ = VLLM_ONLY_FLAGS[flag]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = f"{value:g}"  # 0.0 and 0 are the same "0"
    return noop is ANY or (takes_value and str(value) in noop)


def check_vllm_only_args(args: argparse.Namespace) -> None:
    """Log a note for each vLLM flag that changes nothing here; exit naming the first one paged-serve lacks."""
    for flag, (takes_value, _, reason) in VLLM_ONLY_FLAGS.items():
        value = getattr(args, _dest(flag), None)
        if value is None:
            continue
        shown = f"{flag} {value}" if takes_value else flag
        if not _is_noop(flag, value):
            raise SystemExit(f"paged-serve: {shown} is not supported: {reason}")
        logger.info("%s accepted with no effect: %s", shown, reason)


def check_vllm_only_kwargs(kwargs: dict) -> dict:
    """``LLM(**kwargs)`` with the same flags as keyword arguments (``enforce_eager=True``, ``quantization="awq"``):
    noted or refused (``ValueError`` naming it) as on the command line; None / False (vLLM's defaults) pass
    silently. Returns the other arguments, for ``EngineArgs``."""
    rest = {}
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if flag not in VLLM_ONLY_FLAGS:
            rest[name] = value
        elif value is not None and value is not False:
            reason = VLLM_ONLY_FLAGS[flag][2]
            if not _is_noop(flag, value):
                raise ValueError(f"{name}={value!r} is not supported: {reason}")
            logger.info("%s=%r accepted with no effect: %s", name, value, reason)
    return rest
