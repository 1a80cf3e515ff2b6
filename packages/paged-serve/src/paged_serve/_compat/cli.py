"""``paged-serve serve MODEL`` (vLLM's ``vllm serve``): the OpenAI-compatible server on loopback by default.

``MODEL`` is a directory or a hub name. The flags: the engine's (``EngineArgs``), the server's, and the rest of
vLLM's (``openai/cli_args.py``: accepted with a note where they change nothing here, else refused by name).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from paged_serve._compat.arg_utils import EngineArgs
from paged_serve._compat.chat_utils import CONTENT_FORMATS, load_chat_template
from paged_serve._compat.openai.cli_args import add_vllm_only_args, check_vllm_only_args


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paged-serve", description="paged-serve: vLLM rebuilt small")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve a Hugging Face model directory over the OpenAI API",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument(
        "model", help="Hugging Face model directory (config.json, safetensors, tokenizer.json) or hub name (org/name)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (0: any free port)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every request (better: the PAGED_SERVE_API_KEY environment "
        "variable, which other local users cannot read from the process list)",
    )
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="model name(s) in the API: the first answers, each is accepted (default: MODEL)",
    )
    serve.add_argument(
        "--chat-template", default=None, help="chat template file (or inline Jinja) instead of the tokenizer's"
    )
    serve.add_argument(
        "--chat-template-content-format",
        default="auto",
        choices=CONTENT_FORMATS,
        help="message content as a string or OpenAI's parts ('auto': what the template reads)",
    )
    serve.add_argument("--disable-log-requests", action="store_true", help="log no line per request")
    serve.add_argument("--return-tokens-as-token-ids", action=argparse.BooleanOptionalAction, default=False,
                       help="logprobs tokens as 'token_id:<id>' unless a request says otherwise")  # fmt: skip
    serve.add_argument(
        "--max-waiting-requests", type=int, default=256, help="waiting requests beyond which new ones get 429"
    )
    serve.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024, help="larger request bodies get 413")
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get after SIGTERM before they are aborted",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    EngineArgs.add_cli_args(serve)
    serve.add_argument("-tp", dest="tensor_parallel_size", type=int, default=argparse.SUPPRESS,
                       help="vLLM's short --tensor-parallel-size")  # fmt: skip
    add_vllm_only_args(serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    check_vllm_only_args(args)
    try:
        chat_template = load_chat_template(args.chat_template)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"paged-serve: --chat-template: {exc}") from None
    try:
        from paged_serve._compat.openai import api_server
        from paged_serve._infra.api_key import API_KEY_ENV
    except ImportError as exc:
        raise SystemExit(f"the server needs the [server] extra: pip install 'paged-serve[server]' ({exc})") from None
    from paged_serve._compat.async_llm_engine import AsyncLLMEngine

    for name in ("max_request_bytes", "shutdown_timeout", "max_waiting_requests"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"paged-serve: --{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    engine_args = EngineArgs.from_cli_args(args)
    try:
        sock = api_server.bind_socket(args.host, args.port)  # before the weights load: a port in use fails at once
    except OSError as exc:
        raise SystemExit(f"paged-serve: {exc.strerror}") from None
    engine = AsyncLLMEngine.from_engine_args(engine_args, max_waiting_requests=args.max_waiting_requests)
    # vLLM answers with the model argument as given; a local directory is named by its last part
    names = args.served_model_name or [Path(args.model).name if Path(args.model).is_dir() else args.model]
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    app = api_server.build_app(engine, names, api_key, args.max_request_bytes, not args.disable_log_requests,
                               chat_template, args.chat_template_content_format,
                               args.return_tokens_as_token_ids)  # fmt: skip
    try:
        api_server.run_server(app, sock, engine, args.log_level, args.shutdown_timeout)
    finally:
        engine.shutdown()
    if engine.errored is not None:  # a worker died: the requests in flight got 500, the workers are gone
        raise SystemExit(f"paged-serve: the engine failed ({engine.errored}); server stopped")
    logging.getLogger(__name__).info("server stopped")
