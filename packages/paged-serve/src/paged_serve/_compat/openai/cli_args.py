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
_NO_MEDIA, _NO_LORA, _NO_MOE, _NO_DP = "text-only models", "no LoRA adapters", "no MoE models", "one engine per server"
_NO_GRAPHS, _NO_CORS = "no CUDA graphs are captured", "no CORS headers are sent"
_NO_TLS = "no TLS: put a TLS-terminating proxy in front"
# flag -> (takes a value, the values that change nothing here (ANY: all; () : none), what paged-serve does instead).
# A switch given as --no-<flag> (vLLM's default, off) passes silently.
VLLM_ONLY_FLAGS: dict[str, tuple[bool, tuple[str, ...] | None, str]] = {
    # the frontend (vLLM's FrontendArgs and make_arg_parser)
    "--uds": (True, (), "the server listens on --host/--port only"),
    "--uvicorn-log-level": (True, ANY, "uvicorn logs at --log-level"),
    "--disable-uvicorn-access-log": (False, ANY, "uvicorn's access log follows --log-level"),
    "--allow-credentials": (False, (), _NO_CORS),
    "--allowed-origins": (True, (), _NO_CORS),
    "--allowed-methods": (True, (), _NO_CORS),
    "--allowed-headers": (True, (), _NO_CORS),
    "--lora-modules": (True, (), _NO_LORA),
    "--trust-request-chat-template": (False, (), "a request cannot carry a chat template (the field is a 400)"),
    "--response-role": (True, ("assistant",), "replies always have the role 'assistant'"),
    "--ssl-keyfile": (True, (), _NO_TLS),
    "--ssl-certfile": (True, (), _NO_TLS),
    "--ssl-ca-certs": (True, (), _NO_TLS),
    "--enable-ssl-refresh": (False, (), _NO_TLS),
    "--ssl-cert-reqs": (True, ("0",), _NO_TLS),
    "--root-path": (True, (), "the routes are served at /"),
    "--middleware": (True, (), "no ASGI middleware can be added"),
    "--disable-frontend-multiprocessing": (False, ANY, "the server and the engine share one process"),
    "--enable-request-id-headers": (False, (), "responses carry no X-Request-Id header"),
    "--enable-auto-tool-choice": (False, (), "no tool-call parsing (tools are accepted and ignored)"),
    "--exclude-tools-when-tool-choice-none": (False, (), "no tool-call parsing (tools are accepted and ignored)"),
    "--tool-call-parser": (True, (), "no tool-call parsing (tools are accepted and ignored)"),
    "--tool-parser-plugin": (True, ("",), "no tool-call parsing (tools are accepted and ignored)"),
    "--tool-server": (True, (), "no tool servers"),
    "--log-config-file": (True, (), "logging is configured by --log-level"),
    "--max-log-len": (True, ANY, "the request log line carries no prompt text"),
    "--disable-fastapi-docs": (False, (), "/openapi.json and /docs are always served"),
    "--enable-prompt-tokens-details": (False, (), "usage carries no prompt_tokens_details"),
    "--enable-server-load-tracking": (False, (), "no server load metrics"),
    "--enable-force-include-usage": (False, (), "usage is sent when stream_options asks for it"),
    "--enable-tokenizer-info-endpoint": (False, (), "no /get_tokenizer_info endpoint"),
    "--enable-log-outputs": (False, (), "outputs are never logged"),
    "--h11-max-incomplete-event-size": (True, (), "uvicorn's h11 limits apply (bodies: --max-request-bytes)"),
    "--h11-max-header-count": (True, (), "uvicorn's h11 limits apply (bodies: --max-request-bytes)"),
    "--log-error-stack": (False, ANY, "error responses are logged as warnings"),
    "--tokens-only": (False, (), "the OpenAI routes are always served"),
    "--headless": (False, (), _NO_DP),
    "--api-server-count": (True, ("1",), "one API server process"),
    "--config": (True, (), "flags only: no YAML config file"),
    "--enable-log-requests": (False, ANY, "requests are logged unless --disable-log-requests"),
    # ModelConfig
    "--runner": (True, ("auto", "generate"), "generative models only"),
    "--convert": (True, ("auto", "none"), "generative models only"),
    "--task": (True, ("auto", "generate"), "generative models only"),
    "--tokenizer-mode": (True, ("auto", "hf"), "the fast tokenizer (tokenizer.json) is the only one"),
    "--trust-remote-code": (False, ANY, "paged-serve runs its own model files, never code from the hub"),
    "--hf-config-path": (True, (), "config.json is read from the model directory"),
    "--allowed-local-media-path": (True, ANY, f"{_NO_MEDIA}: no media is read"),
    "--allowed-media-domains": (True, ANY, f"{_NO_MEDIA}: no media is read"),
    "--code-revision": (True, ANY, "no code is read from the hub"),
    "--rope-scaling": (True, (), "config.json's RoPE settings are used as they are"),
    "--rope-theta": (True, (), "config.json's RoPE settings are used as they are"),
    "--quantization": (True, (), "no quantized weights"),
    "--enforce-eager": (False, ANY, "paged-serve captures no CUDA graphs: it always runs eagerly"),
    "--logprobs-mode": (True, ("raw_logprobs",), "logprobs are the model's raw ones (vLLM's default)"),
    "--disable-sliding-window": (False, ANY, "sliding-window models are refused when loaded"),
    "--disable-cascade-attn": (False, ANY, "no cascade attention"),
    "--enable-prompt-embeds": (False, (), "prompts are text or token ids"),
    "--config-format": (True, ("auto", "hf"), "config.json in Hugging Face's format"),
    "--hf-overrides": (True, (), "config.json is read as it is"),
    "--pooler-config": (True, (), "generative models only"),
    "--override-pooler-config": (True, (), "generative models only"),
    "--logits-processor-pattern": (True, (), "requests cannot name logits processors"),
    "--enable-sleep-mode": (False, (), "the engine never offloads its weights to sleep"),
    "--model-impl": (True, ("auto", "vllm"), "paged-serve's own model files"),
    "--override-attention-dtype": (True, (), "attention runs in the model's dtype"),
    "--logits-processors": (True, (), "no custom logits processors"),
    "--io-processor-plugin": (True, (), "no IO processor plugins"),
    "--enable-return-routed-experts": (False, (), _NO_MOE),
    "--max-seq-len-to-capture": (True, ANY, _NO_GRAPHS),
    "--disable-async-output-proc": (False, ANY, "outputs are processed synchronously after each step"),
    # LoadConfig
    "--load-format": (True, ("auto", "safetensors"), "weights load from safetensors only"),
    "--safetensors-load-strategy": (True, ANY, "weights are read slice by slice from memory-mapped safetensors"),
    "--model-loader-extra-config": (True, (), "the safetensors loader takes no options"),
    "--ignore-patterns": (True, ("original/**/*",), "hub downloads skip original/**/* (vLLM's default)"),
    "--use-tqdm-on-load": (False, ANY, "no progress bar while loading"),
    "--pt-load-map-location": (True, ANY, "weights load from safetensors, never .pt files"),
    # StructuredOutputsConfig
    "--reasoning-parser": (True, (), "no reasoning parsers"),
    "--guided-decoding-backend": (True, (), "no guided decoding (response_format other than text is a 400)"),
    "--guided-decoding-disable-fallback": (True, (), "no guided decoding"),
    "--guided-decoding-disable-any-whitespace": (True, (), "no guided decoding"),
    "--guided-decoding-disable-additional-properties": (True, (), "no guided decoding"),
    "--structured-outputs-config": (True, (), "no structured outputs"),
    # ParallelConfig
    "--pipeline-parallel-size": (True, ("1",), "no pipeline parallelism (tensor parallelism only)"),
    "--decode-context-parallel-size": (True, ("1",), "no decode context parallelism"),
    "--data-parallel-size": (True, ("1",), _NO_DP),
    "--data-parallel-rank": (True, (), _NO_DP),
    "--data-parallel-start-rank": (True, (), _NO_DP),
    "--data-parallel-size-local": (True, (), _NO_DP),
    "--data-parallel-address": (True, (), _NO_DP),
    "--data-parallel-rpc-port": (True, (), _NO_DP),
    "--data-parallel-backend": (True, ANY, _NO_DP),
    "--data-parallel-hybrid-lb": (False, (), _NO_DP),
    "--enable-expert-parallel": (False, (), _NO_MOE),
    "--all2all-backend": (True, ANY, _NO_MOE),
    "--enable-dbo": (False, (), "no dual-batch overlap"),
    "--dbo-decode-token-threshold": (True, ANY, "no dual-batch overlap"),
    "--dbo-prefill-token-threshold": (True, ANY, "no dual-batch overlap"),
    "--disable-nccl-for-dp-synchronization": (False, ANY, _NO_DP),
    "--enable-eplb": (False, (), _NO_MOE),
    "--eplb-config": (True, (), _NO_MOE),
    "--expert-placement-strategy": (True, ANY, _NO_MOE),
    "--num-redundant-experts": (True, ANY, _NO_MOE),
    "--eplb-window-size": (True, ANY, _NO_MOE),
    "--eplb-step-interval": (True, ANY, _NO_MOE),
    "--eplb-log-balancedness": (False, ANY, _NO_MOE),
    "--max-parallel-loading-workers": (True, ANY, "one process reads the checkpoint"),
    "--ray-workers-use-nsight": (False, (), "no Ray"),
    "--disable-custom-all-reduce": (False, ANY, "tensor parallelism uses torch.distributed's all-reduce"),
    "--worker-cls": (True, ("auto",), "paged-serve's own Worker"),
    "--worker-extension-cls": (True, ("",), "paged-serve's own Worker"),
    "--enable-multimodal-encoder-data-parallel": (False, ANY, _NO_MEDIA),
    # CacheConfig
    "--kv-cache-dtype": (True, ("auto",), "the KV cache has the model's dtype"),
    "--prefix-caching-hash-algo": (True, ("sha256",), "prefix blocks are hashed with chained SHA-256"),
    "--cpu-offload-gb": (True, ("0",), "weights are never offloaded to the CPU"),
    "--calculate-kv-scales": (False, ANY, "the KV cache is not fp8: it has no scales"),
    "--kv-sharing-fast-prefill": (False, (), "no cross-layer KV sharing"),
    "--mamba-cache-dtype": (True, ANY, "no Mamba models"),
    "--mamba-ssm-cache-dtype": (True, ANY, "no Mamba models"),
    "--mamba-block-size": (True, ANY, "no Mamba models"),
    # MultiModalConfig
    "--limit-mm-per-prompt": (True, (), _NO_MEDIA),
    "--enable-mm-embeds": (False, (), _NO_MEDIA),
    "--media-io-kwargs": (True, ANY, _NO_MEDIA),
    "--mm-processor-kwargs": (True, ANY, _NO_MEDIA),
    "--mm-processor-cache-gb": (True, ANY, _NO_MEDIA),
    "--disable-mm-preprocessor-cache": (False, ANY, _NO_MEDIA),
    "--mm-processor-cache-type": (True, ANY, _NO_MEDIA),
    "--mm-shm-cache-max-object-size-mb": (True, ANY, _NO_MEDIA),
    "--mm-encoder-tp-mode": (True, ANY, _NO_MEDIA),
    "--mm-encoder-attn-backend": (True, ANY, _NO_MEDIA),
    "--interleave-mm-strings": (False, ANY, _NO_MEDIA),
    "--skip-mm-profiling": (False, ANY, _NO_MEDIA),
    "--video-pruning-rate": (True, ANY, _NO_MEDIA),
    # LoRAConfig
    "--enable-lora": (False, (), _NO_LORA),
    "--max-loras": (True, ANY, _NO_LORA),
    "--max-lora-rank": (True, ANY, _NO_LORA),
    "--lora-extra-vocab-size": (True, ANY, _NO_LORA),
    "--lora-dtype": (True, ANY, _NO_LORA),
    "--max-cpu-loras": (True, ANY, _NO_LORA),
    "--fully-sharded-loras": (False, ANY, _NO_LORA),
    "--default-mm-loras": (True, (), _NO_LORA),
    # ObservabilityConfig
    "--show-hidden-metrics-for-version": (True, ANY, "/metrics has no hidden metrics"),
    "--otlp-traces-endpoint": (True, (), "no OpenTelemetry tracing"),
    "--collect-detailed-traces": (True, ANY, "no OpenTelemetry tracing"),
    # SchedulerConfig
    "--max-num-partial-prefills": (True, ("1",), "one partial prefill at a time"),
    "--max-long-partial-prefills": (True, ("1",), "one partial prefill at a time"),
    "--long-prefill-token-threshold": (True, ("0",), "one partial prefill at a time"),
    "--num-lookahead-slots": (True, ("0",), "no speculative decoding"),
    "--scheduling-policy": (True, ("fcfs",), "first come, first served is the only policy"),
    "--disable-chunked-mm-input": (False, ANY, _NO_MEDIA),
    "--scheduler-cls": (True, (), "paged-serve's own Scheduler"),
    "--disable-hybrid-kv-cache-manager": (False, ANY, "one KV cache manager for every layer"),
    "--async-scheduling": (False, ANY, "each step is scheduled after the previous one ends"),
    "--num-scheduler-steps": (True, ("1",), "one scheduler step per model step"),
    # CompilationConfig, VllmConfig and the rest
    "--cudagraph-capture-sizes": (True, ANY, _NO_GRAPHS),
    "--cuda-graph-sizes": (True, ANY, _NO_GRAPHS),
    "--max-cudagraph-capture-size": (True, ANY, _NO_GRAPHS),
    "--compilation-config": (True, ANY, "no torch.compile: the model runs eagerly"),
    "--speculative-config": (True, (), "no speculative decoding"),
    "--kv-transfer-config": (True, (), "no KV transfer between engines"),
    "--kv-events-config": (True, (), "no KV cache events are published"),
    "--additional-config": (True, (), "no platform plugins"),
    "--profiler-config": (True, (), "no profiler"),
    "--attention-config": (True, (), "paged-serve's own attention (Triton on CUDA, torch on CPU)"),
    "--disable-log-stats": (False, ANY, "paged-serve logs no periodic stats (they are at /metrics)"),
    "--aggregate-engine-logging": (False, ANY, _NO_DP),
}
# vLLM's short spellings of the flags above
SHORT_FLAGS = {
    "--quantization": "-q",
    "--pipeline-parallel-size": "-pp",
    "--data-parallel-size": "-dp",
    "--decode-context-parallel-size": "-dcp",
    "--compilation-config": "-O",
    "--api-server-count": "-asc",
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
        names = [flag, SHORT_FLAGS[flag]] if flag in SHORT_FLAGS else [flag]
        if takes_value:
            metavar = flag.removeprefix("--").upper().replace("-", "_")
            group.add_argument(*names, dest=_dest(flag), default=None, metavar=metavar, help=help_text)
        else:  # vLLM's switches are BooleanOptionalAction: --flag / --no-flag
            group.add_argument(*names, dest=_dest(flag), action=argparse.BooleanOptionalAction, default=None,
                               help=help_text)  # fmt: skip


def _is_noop(flag: str, value) -> bool:
    takes_value, noop, _ = VLLM_ONLY_FLAGS[flag]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = f"{value:g}"  # 0.0 and 0 are the same "0"
    return noop is ANY or (takes_value and str(value) in noop)


def check_vllm_only_args(args: argparse.Namespace) -> None:
    """Log a note for each vLLM flag that changes nothing here; exit naming the first one paged-serve lacks."""
    for flag, (takes_value, _, reason) in VLLM_ONLY_FLAGS.items():
        value = getattr(args, _dest(flag), None)
        if value is None or value is False:  # not given, or --no-<flag> (vLLM's default)
            continue
        shown = f"{flag} {value}" if takes_value else flag
        if not _is_noop(flag, value):
            raise SystemExit(f"paged-serve: {shown} is not supported: {reason}")
        logger.info("%s accepted with no effect: %s", shown, reason)


def check_vllm_only_kwargs(kwargs: dict) -> dict:
    """``LLM(**kwargs)`` with the same flags as keyword arguments (``enforce_eager=True``, ``quantization="awq"``):
    noted or refused (``ValueError`` naming it) as on the command line; None, False and empty values (vLLM's defaults)
    pass silently. Returns the other arguments, for ``EngineArgs``."""
    rest = {}
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if flag not in VLLM_ONLY_FLAGS:
            rest[name] = value
        elif not (value is None or value is False or (isinstance(value, (str, dict, list)) and not value)):
            reason = VLLM_ONLY_FLAGS[flag][2]
            if not _is_noop(flag, value):
                raise ValueError(f"{name}={value!r} is not supported: {reason}")
            logger.info("%s=%r accepted with no effect: %s", name, value, reason)
    return rest
