"""vLLM's public surface, listed and checked: every public method of ``vllm.LLM`` (``vllm/entrypoints/llm.py``)
with its parameters and defaults, and every ``vllm serve`` flag (``vllm/engine/arg_utils.py``
``EngineArgs.add_cli_args``, ``vllm/entrypoints/openai/cli_args.py`` ``FrontendArgs`` and ``make_arg_parser``), as
of the vLLM main read for this work. Each method is implemented with vLLM's signature or refuses with vLLM's
error; each flag is implemented, accepted as a no-op with a logged note, or refused by name.
"""

from __future__ import annotations

import inspect
import logging
import re

import pytest
from paged_serve import LLM, EngineArgs, SamplingParams
from paged_serve._compat.openai.cli_args import check_vllm_only_args, check_vllm_only_kwargs
from paged_serve.entrypoints.cli import make_parser
from paged_serve.v1.metrics.reader import Counter, Gauge

E = inspect.Parameter.empty
# vLLM's LLM methods: name -> [(parameter, default)], in order (keyword-only ones after "*")
VLLM_LLM_METHODS = {
    "get_tokenizer": [],
    "get_world_size": [("include_dp", True)],
    "reset_mm_cache": [],
    "get_default_sampling_params": [],
    "generate": [("prompts", E), ("sampling_params", None), "*", ("use_tqdm", True), ("lora_request", None),
                 ("priority", None), ("tokenization_kwargs", None)],
    "collective_rpc": [("method", E), ("timeout", None), ("args", ()), ("kwargs", None)],
    "apply_model": [("func", E)],
    "beam_search": [("prompts", E), ("params", E), ("lora_request", None), ("use_tqdm", False),
                    ("concurrency_limit", None)],
    "chat": [("messages", E), ("sampling_params", None), ("use_tqdm", True), ("lora_request", None),
             ("chat_template", None), ("chat_template_content_format", "auto"), ("add_generation_prompt", True),
             ("continue_final_message", False), ("tools", None), ("chat_template_kwargs", None),
             ("tokenization_kwargs", None), ("mm_processor_kwargs", None)],
    "encode": [("prompts", E), ("pooling_params", None), "*", ("truncate_prompt_tokens", None), ("use_tqdm", True),
               ("lora_request", None), ("pooling_task", None), ("tokenization_kwargs", None)],
    "embed": [("prompts", E), "*", ("truncate_prompt_tokens", None), ("use_tqdm", True), ("pooling_params", None),
              ("lora_request", None), ("tokenization_kwargs", None)],
    "classify": [("prompts", E), "*", ("pooling_params", None), ("use_tqdm", True), ("lora_request", None),
                 ("tokenization_kwargs", None)],
    "reward": [("prompts", E), "*", ("pooling_params", None), ("truncate_prompt_tokens", None), ("use_tqdm", True),
               ("lora_request", None), ("tokenization_kwargs", None)],
    "score": [("data_1", E), ("data_2", E), "*", ("use_tqdm", True), ("pooling_params", None),
              ("lora_request", None), ("tokenization_kwargs", None), ("chat_template", None)],
    "start_profile": [],
    "stop_profile": [],
    "reset_prefix_cache": [("reset_running_requests", False), ("reset_connector", False)],
    "sleep": [("level", 1)],
    "wake_up": [("tags", None)],
    "get_metrics": [],
    "init_weight_transfer_engine": [("request", E)],
    "update_weights": [("request", E)],
}  # fmt: skip
# vLLM's LLM(...) keyword arguments and their defaults
VLLM_LLM_INIT = {
    "runner": "auto", "convert": "auto", "tokenizer": None, "tokenizer_mode": "auto", "skip_tokenizer_init": False,
    "trust_remote_code": False, "allowed_local_media_path": "", "allowed_media_domains": None,
    "tensor_parallel_size": 1, "dtype": "auto", "quantization": None, "revision": None, "tokenizer_revision": None,
    "seed": 0, "gpu_memory_utilization": 0.9, "swap_space": 4, "cpu_offload_gb": 0, "enforce_eager": False,
    "enable_return_routed_experts": False, "disable_custom_all_reduce": False, "hf_token": None,
    "hf_overrides": None, "mm_processor_kwargs": None, "pooler_config": None, "structured_outputs_config": None,
    "profiler_config": None, "attention_config": None, "kv_cache_memory_bytes": None, "compilation_config": None,
    "logits_processors": None,
}  # fmt: skip


def test_every_vllm_llm_method_exists_with_vllm_s_parameters():
    for name, params in VLLM_LLM_METHODS.items():
        ours = list(inspect.signature(getattr(LLM, name)).parameters.values())[1:]  # without self
        by_name = {p.name: p for p in ours}
        keyword_only = False
        for position, entry in enumerate(params):
            if entry == "*":
                keyword_only = True
                continue
            pname, default = entry
            assert pname in by_name, f"LLM.{name} lacks {pname!r}"
            p = by_name[pname]
            if default is not E:  # vLLM callers always pass a required one: a default here changes nothing
                assert p.default == default, f"LLM.{name}({pname}=...) defaults to {p.default!r}, not {default!r}"
            if not keyword_only:  # vLLM callers may pass it positionally: same place here
                assert ours.index(p) == position and p.kind != p.KEYWORD_ONLY, f"LLM.{name}: {pname} not positional"
            else:
                assert p.kind != p.POSITIONAL_ONLY
        required = [p.name for p in ours if p.default is E and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        assert set(required) <= {n for n, d in (e for e in params if e != "*") if d is E}, f"LLM.{name}: {required}"


def test_every_vllm_llm_argument_is_taken_with_vllm_s_default(checkpoint, caplog):
    """Each of vLLM's ``LLM(...)`` keyword arguments at vLLM's default: an ``EngineArgs`` field with that default,
    or one of vLLM's arguments without a mechanism here, which passes (at most noted) at its default."""
    path, _ = checkpoint("llama")
    defaults = {f: getattr(EngineArgs(path), f) for f in EngineArgs.__dataclass_fields__}
    with caplog.at_level(logging.INFO, logger="paged_serve._compat.openai.cli_args"):
        rest = check_vllm_only_kwargs(dict(VLLM_LLM_INIT))  # nothing refused at vLLM's defaults
    assert all("accepted with no effect" in r.getMessage() for r in caplog.records)
    for name, value in rest.items():
        assert name in defaults and defaults[name] == value, (name, value, defaults.get(name))
    EngineArgs.from_kwargs(path, **rest)


@pytest.fixture(scope="module")
def llm(checkpoint):
    path, _ = checkpoint("llama")
    return LLM(path, num_gpu_blocks=64, block_size=8, enable_prefix_caching=True, disable_log_stats=False)


GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.mark.parametrize(
    ("call", "error"),
    [(lambda m: m.encode(["x"]), "pooling_task required for `LLM.encode`"),
     (lambda m: m.encode(["x"], pooling_task="embed"), r"LLM.encode\(\) is only supported for pooling models. Try "
      r"passing `--runner pooling` to use the model as a pooling model."),
     (lambda m: m.embed(["x"]), "Embedding API is not supported by this model. Try converting the model using "
      "`--convert embed`."),
     (lambda m: m.classify(["x"]), "Classification API is not supported by this model. Try converting the model "
      "using `--convert classify`."),
     (lambda m: m.reward(["x"]), r"LLM.encode\(\) is only supported for pooling models"),
     (lambda m: m.score("x", ["y"]), r"LLM.score\(\) is only supported for pooling models. Try passing `--runner "
      "pooling`")],
)  # fmt: skip
def test_pooling_methods_refuse_a_generative_model_with_vllm_s_errors(llm, call, error):
    with pytest.raises(ValueError, match=error):
        call(llm)


def test_generate_takes_vllm_s_keyword_options(llm):
    tok = llm.get_tokenizer()
    prompt = "the quick brown fox jumps"
    ids = tok.encode(prompt)
    keep3 = {"truncate_prompt_tokens": 3}
    (out,) = llm.generate(prompt, GREEDY, use_tqdm=False, priority=[0], tokenization_kwargs=keep3)
    assert out.prompt_token_ids == ids[-3:] and out.prompt == prompt
    (full,) = llm.generate(prompt, GREEDY, use_tqdm=False, tokenization_kwargs={"add_special_tokens": True})
    assert full.prompt_token_ids == ids
    with pytest.raises(ValueError, match=r"Got priority 2 but Priority scheduling is not enabled."):
        llm.generate(prompt, GREEDY, use_tqdm=False, priority=[2])
    with pytest.raises(ValueError, match=r"The lengths of prompts \(1\) and priority \(2\) must be the same."):
        llm.generate(prompt, GREEDY, use_tqdm=False, priority=[0, 0])
    with pytest.raises(ValueError, match="Got lora_request .* but LoRA is not enabled!"):
        llm.generate(prompt, GREEDY, use_tqdm=False, lora_request=object())
    with pytest.raises(ValueError, match=r"tokenization_kwargs \['padding'\] are not supported"):
        llm.generate(prompt, GREEDY, use_tqdm=False, tokenization_kwargs={"padding": True})
    bars = []

    def factory(*args, **kwargs):  # vLLM's use_tqdm may be a tqdm factory
        from tqdm.auto import tqdm

        bars.append(kwargs)
        return tqdm(*args, **kwargs)

    llm.generate([prompt, "the lazy dog"], GREEDY, use_tqdm=factory)
    assert [b["total"] for b in bars] == [2]
    (chat,) = llm.chat([{"role": "user", "content": prompt}], GREEDY, use_tqdm=False,
                       tokenization_kwargs={"truncate_prompt_tokens": 4})  # fmt: skip
    assert len(chat.prompt_token_ids) == 4


def test_reset_prefix_cache_forgets_cached_blocks_and_refuses_while_blocks_are_held(llm):
    prompt = {"prompt_token_ids": list(range(5, 45))}  # 5 full blocks of 8
    llm.generate(prompt, GREEDY, use_tqdm=False)
    (again,) = llm.generate(prompt, GREEDY, use_tqdm=False)
    assert again.num_cached_tokens >= 32  # the prefix was cached ...
    assert llm.reset_prefix_cache() is True
    (fresh,) = llm.generate(prompt, GREEDY, use_tqdm=False)
    assert fresh.num_cached_tokens == 0 and fresh.outputs[0].token_ids == again.outputs[0].token_ids  # ... not now
    engine = llm.llm_engine
    engine.add_request("held", None, GREEDY, prompt["prompt_token_ids"])
    engine.step()  # the request now holds blocks
    assert llm.reset_prefix_cache() is False
    engine.abort_request("held")
    assert llm.reset_prefix_cache() is True


def test_collective_rpc_apply_model_metrics_and_repr(llm, checkpoint, monkeypatch):
    assert llm.get_world_size() == 1 and llm.get_world_size(include_dp=False) == 1
    assert llm.collective_rpc(lambda worker, k: (worker.rank, k), args=(7,)) == [(0, 7)]
    assert llm.apply_model(lambda model: sum(p.numel() for p in model.parameters())) == [
        sum(p.numel() for p in llm.llm_engine.model.parameters())
    ]
    assert repr(llm) == repr(llm.llm_engine.model) and "Linear" in repr(llm)
    assert llm.reset_mm_cache() is None
    monkeypatch.setattr(llm.llm_engine.parallel_config, "tensor_parallel_size", 2)
    with pytest.raises(NotImplementedError, match="tensor_parallel_size > 1"):
        llm.apply_model(lambda model: None)
    monkeypatch.undo()
    before = {m.name: m for m in llm.get_metrics()}
    (out,) = llm.generate("the quick brown fox", GREEDY, use_tqdm=False)
    after = {m.name: m for m in llm.get_metrics()}
    assert isinstance(after["vllm:prompt_tokens"], Counter) and isinstance(after["vllm:num_requests_running"], Gauge)
    assert after["vllm:prompt_tokens"].value - before["vllm:prompt_tokens"].value == len(out.prompt_token_ids)
    assert after["vllm:generation_tokens"].value - before["vllm:generation_tokens"].value == 4
    assert after["vllm:prompt_tokens"].labels == {"model_name": llm.model_config.model, "engine": "0"}
    path, _ = checkpoint("llama")
    with pytest.raises(AssertionError, match="Stat logging disabled"):  # LLM's default, as vLLM's
        LLM(path, num_gpu_blocks=16).get_metrics()


@pytest.mark.parametrize(
    ("call", "error", "kind"),
    [(lambda m: m.start_profile(), "Profiler is not enabled", RuntimeError),
     (lambda m: m.stop_profile(), "Profiler is not enabled", RuntimeError),
     (lambda m: m.sleep(), r"LLM.sleep\(level=1\) is not supported", ValueError),
     (lambda m: m.wake_up(), r"LLM.wake_up\(\) is not supported", ValueError),
     (lambda m: m.init_weight_transfer_engine({}), "weight transfer", NotImplementedError),
     (lambda m: m.update_weights({}), "weight transfer", NotImplementedError)],
)  # fmt: skip
def test_methods_without_a_mechanism_here_refuse_by_name(llm, call, error, kind):
    with pytest.raises(kind, match=error):
        call(llm)


# ---------------------------------------------------------------- vllm serve's flags
# flag -> a value to pass (None: a switch). "--model" is serve's positional MODEL here, as vLLM's model_tag.
VLLM_SERVE_FLAGS = {
    # make_arg_parser, FrontendArgs, AsyncEngineArgs
    "--headless": None, "--api-server-count": "1", "--config": "c.yaml", "--host": "127.0.0.1", "--port": "8001",
    "--uds": "/tmp/s", "--uvicorn-log-level": "info", "--disable-uvicorn-access-log": None,
    "--allow-credentials": None, "--allowed-origins": '["*"]', "--allowed-methods": '["*"]',
    "--allowed-headers": '["*"]', "--api-key": "k", "--lora-modules": "a=b", "--chat-template": "t.jinja",
    "--chat-template-content-format": "string", "--trust-request-chat-template": None, "--response-role": "assistant",
    "--ssl-keyfile": "k", "--ssl-certfile": "c", "--ssl-ca-certs": "ca", "--enable-ssl-refresh": None,
    "--ssl-cert-reqs": "0", "--root-path": "/v", "--middleware": "m.mw", "--return-tokens-as-token-ids": None,
    "--disable-frontend-multiprocessing": None, "--enable-request-id-headers": None,
    "--enable-auto-tool-choice": None, "--exclude-tools-when-tool-choice-none": None, "--tool-call-parser": "hermes",
    "--tool-parser-plugin": "p.py", "--tool-server": "demo", "--log-config-file": "l.json", "--max-log-len": "10",
    "--disable-fastapi-docs": None, "--enable-prompt-tokens-details": None, "--enable-server-load-tracking": None,
    "--enable-force-include-usage": None, "--enable-tokenizer-info-endpoint": None, "--enable-log-outputs": None,
    "--h11-max-incomplete-event-size": "100", "--h11-max-header-count": "10", "--log-error-stack": None,
    "--tokens-only": None, "--enable-log-requests": None, "--disable-log-requests": None,
    # ModelConfig
    "--runner": "generate", "--convert": "none", "--task": "generate", "--tokenizer": "org/tok",
    "--tokenizer-mode": "auto", "--trust-remote-code": None, "--dtype": "float32", "--seed": "1",
    "--hf-config-path": "org/cfg", "--allowed-local-media-path": "/m", "--allowed-media-domains": "a.org",
    "--revision": "v1", "--code-revision": "v1", "--rope-scaling": "{}", "--rope-theta": "1e4",
    "--tokenizer-revision": "v1", "--max-model-len": "64", "--quantization": "awq", "--enforce-eager": None,
    "--max-logprobs": "5", "--logprobs-mode": "raw_logprobs", "--disable-sliding-window": None,
    "--disable-cascade-attn": None, "--skip-tokenizer-init": None, "--enable-prompt-embeds": None,
    "--served-model-name": "a", "--config-format": "hf", "--hf-token": None, "--hf-overrides": "{}",
    "--pooler-config": "{}", "--override-pooler-config": "{}", "--logits-processor-pattern": ".*",
    "--generation-config": "vllm", "--override-generation-config": '{"temperature": 0.5}',
    "--enable-sleep-mode": None, "--model-impl": "vllm", "--override-attention-dtype": "float32",
    "--logits-processors": "m.P", "--io-processor-plugin": "p",
    # LoadConfig, StructuredOutputsConfig
    "--load-format": "safetensors", "--download-dir": "/tmp/d", "--safetensors-load-strategy": "lazy",
    "--model-loader-extra-config": "{}", "--ignore-patterns": "original/**/*", "--use-tqdm-on-load": None,
    "--pt-load-map-location": "cpu", "--reasoning-parser": "deepseek_r1", "--guided-decoding-backend": "xgrammar",
    "--guided-decoding-disable-fallback": "1", "--guided-decoding-disable-any-whitespace": "1",
    "--guided-decoding-disable-additional-properties": "1",
    # ParallelConfig
    "--distributed-executor-backend": "mp", "--pipeline-parallel-size": "1", "--tensor-parallel-size": "2",
    "--decode-context-parallel-size": "1", "--data-parallel-size": "1", "--data-parallel-rank": "0",
    "--data-parallel-start-rank": "0", "--data-parallel-size-local": "1", "--data-parallel-address": "h",
    "--data-parallel-rpc-port": "1", "--data-parallel-backend": "mp", "--data-parallel-hybrid-lb": None,
    "--enable-expert-parallel": None, "--all2all-backend": "naive", "--enable-dbo": None,
    "--dbo-decode-token-threshold": "1", "--dbo-prefill-token-threshold": "1",
    "--disable-nccl-for-dp-synchronization": None, "--enable-eplb": None, "--eplb-config": "{}",
    "--expert-placement-strategy": "linear", "--num-redundant-experts": "0", "--eplb-window-size": "1",
    "--eplb-step-interval": "1", "--eplb-log-balancedness": None, "--max-parallel-loading-workers": "2",
    "--ray-workers-use-nsight": None, "--disable-custom-all-reduce": None, "--worker-cls": "auto",
    "--worker-extension-cls": "", "--enable-multimodal-encoder-data-parallel": None,
    # CacheConfig
    "--block-size": "16", "--gpu-memory-utilization": "0.5", "--kv-cache-memory-bytes": "1000000",
    "--swap-space": "1", "--kv-cache-dtype": "fp8", "--num-gpu-blocks-override": "8", "--enable-prefix-caching": None,
    "--prefix-caching-hash-algo": "sha256", "--cpu-offload-gb": "0", "--calculate-kv-scales": None,
    "--kv-sharing-fast-prefill": None, "--mamba-cache-dtype": "auto", "--mamba-ssm-cache-dtype": "auto",
    "--mamba-block-size": "16",
    # MultiModalConfig
    "--limit-mm-per-prompt": '{"image": 1}', "--enable-mm-embeds": None, "--media-io-kwargs": "{}",
    "--mm-processor-kwargs": "{}", "--mm-processor-cache-gb": "0", "--disable-mm-preprocessor-cache": None,
    "--mm-processor-cache-type": "lru", "--mm-shm-cache-max-object-size-mb": "1", "--mm-encoder-tp-mode": "weights",
    "--mm-encoder-attn-backend": "TORCH_SDPA", "--interleave-mm-strings": None, "--skip-mm-profiling": None,
    "--video-pruning-rate": "0.5",
    # LoRAConfig, ObservabilityConfig
    "--enable-lora": None, "--max-loras": "1", "--max-lora-rank": "16", "--lora-extra-vocab-size": "0",
    "--lora-dtype": "auto", "--max-cpu-loras": "1", "--fully-sharded-loras": None, "--default-mm-loras": "{}",
    "--show-hidden-metrics-for-version": "0.1", "--otlp-traces-endpoint": "http://x",
    "--collect-detailed-traces": "all",
    # SchedulerConfig, CompilationConfig, VllmConfig, the rest
    "--max-num-batched-tokens": "256", "--max-num-seqs": "4", "--max-num-partial-prefills": "1",
    "--max-long-partial-prefills": "1", "--long-prefill-token-threshold": "0", "--num-lookahead-slots": "0",
    "--scheduling-policy": "priority", "--enable-chunked-prefill": None, "--disable-chunked-mm-input": None,
    "--scheduler-cls": "m.S", "--disable-hybrid-kv-cache-manager": None, "--async-scheduling": None,
    "--cudagraph-capture-sizes": "1", "--cuda-graph-sizes": "1", "--max-cudagraph-capture-size": "8",
    "--speculative-config": "{}", "--kv-transfer-config": "{}", "--kv-events-config": "{}",
    "--compilation-config": "3", "--additional-config": "{}", "--structured-outputs-config": "{}",
    "--profiler-config": "{}", "--attention-config": "{}", "--disable-log-stats": None,
    "--aggregate-engine-logging": None,
}  # fmt: skip
# what paged-serve does with each (with the value above)
IMPLEMENTED = {
    "--host", "--port", "--api-key", "--chat-template", "--chat-template-content-format", "--disable-log-requests",
    "--served-model-name", "--tokenizer", "--dtype", "--seed", "--revision", "--tokenizer-revision",
    "--max-model-len", "--max-logprobs", "--skip-tokenizer-init", "--hf-token", "--generation-config",
    "--override-generation-config", "--download-dir", "--distributed-executor-backend", "--tensor-parallel-size",
    "--block-size", "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--swap-space",
    "--num-gpu-blocks-override", "--enable-prefix-caching", "--max-num-batched-tokens", "--max-num-seqs",
    "--enable-chunked-prefill", "--return-tokens-as-token-ids",
}  # fmt: skip
REFUSED = {
    "--headless", "--config", "--uds", "--allow-credentials", "--allowed-origins", "--allowed-methods",
    "--allowed-headers", "--lora-modules", "--trust-request-chat-template", "--ssl-keyfile", "--ssl-certfile",
    "--ssl-ca-certs", "--enable-ssl-refresh", "--root-path", "--middleware", "--enable-request-id-headers",
    "--enable-auto-tool-choice", "--exclude-tools-when-tool-choice-none", "--tool-call-parser",
    "--tool-parser-plugin", "--tool-server", "--log-config-file", "--disable-fastapi-docs",
    "--enable-prompt-tokens-details", "--enable-server-load-tracking", "--enable-force-include-usage",
    "--enable-tokenizer-info-endpoint", "--enable-log-outputs", "--h11-max-incomplete-event-size",
    "--h11-max-header-count", "--tokens-only", "--hf-config-path", "--rope-scaling", "--rope-theta", "--quantization",
    "--enable-prompt-embeds", "--hf-overrides", "--pooler-config", "--override-pooler-config",
    "--logits-processor-pattern", "--enable-sleep-mode", "--override-attention-dtype", "--logits-processors",
    "--io-processor-plugin", "--model-loader-extra-config", "--reasoning-parser", "--guided-decoding-backend",
    "--guided-decoding-disable-fallback", "--guided-decoding-disable-any-whitespace",
    "--guided-decoding-disable-additional-properties", "--data-parallel-rank", "--data-parallel-start-rank",
    "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-hybrid-lb",
    "--enable-expert-parallel", "--enable-dbo", "--enable-eplb", "--eplb-config", "--ray-workers-use-nsight",
    "--kv-cache-dtype", "--kv-sharing-fast-prefill", "--limit-mm-per-prompt", "--enable-mm-embeds", "--enable-lora",
    "--default-mm-loras", "--otlp-traces-endpoint", "--scheduling-policy", "--scheduler-cls", "--speculative-config",
    "--kv-transfer-config", "--kv-events-config", "--additional-config", "--structured-outputs-config",
    "--profiler-config", "--attention-config",
}  # fmt: skip
NOOP = set(VLLM_SERVE_FLAGS) - IMPLEMENTED - REFUSED  # accepted with a logged note


@pytest.mark.parametrize("flag", sorted(VLLM_SERVE_FLAGS))
def test_every_vllm_serve_flag_is_implemented_noted_or_refused_by_name(flag, caplog):
    value = VLLM_SERVE_FLAGS[flag]
    argv = [flag] if value is None else [flag, value]
    args = make_parser().parse_args(["serve", "org/m", *argv])  # argparse's exit 2 would fail the test
    shown = " ".join(argv)
    if flag in REFUSED:
        with pytest.raises(SystemExit, match=f"paged-serve: {re.escape(shown)} is not supported: "):
            check_vllm_only_args(args)
        return
    with caplog.at_level(logging.INFO, logger="paged_serve._compat.openai.cli_args"):
        check_vllm_only_args(args)
    notes = [r.getMessage() for r in caplog.records]
    if flag in NOOP:
        assert len(notes) == 1 and notes[0].startswith(f"{shown} accepted with no effect: "), notes
    else:
        assert notes == [] and getattr(args, flag.removeprefix("--").replace("-", "_")) not in (None, False)


def test_vllm_switches_take_their_no_form_and_short_spellings():
    args = make_parser().parse_args(["serve", "org/m", "--no-enforce-eager", "--no-enable-lora", "-q", "awq",
                                     "-pp", "1", "-O", "3", "-tp", "2", "--no-enable-prefix-caching"])  # fmt: skip
    with pytest.raises(SystemExit, match="--quantization awq is not supported"):  # -q is --quantization
        check_vllm_only_args(args)
    args = make_parser().parse_args(["serve", "org/m", "--no-enforce-eager", "--no-enable-lora", "-pp", "1"])
    check_vllm_only_args(args)  # vLLM's defaults, spelled out: nothing to refuse
    assert EngineArgs.from_cli_args(args).enable_prefix_caching is False


def test_serve_help_lists_every_vllm_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        make_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and all(flag in out for flag in VLLM_SERVE_FLAGS)
