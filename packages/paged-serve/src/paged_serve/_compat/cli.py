"""``paged-serve serve MODEL_DIR`` (vLLM's ``vllm serve``): the OpenAI-compatible server on loopback by default."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from paged_serve._compat.arg_utils import EngineArgs


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paged-serve", description="paged-serve: vLLM rebuilt small")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve a Hugging Face model directory over the OpenAI API",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument("model", help="Hugging Face model directory (config.json, safetensors, tokenizer.json)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (0: any free port)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every request (better: the PAGED_SERVE_API_KEY environment "
        "variable, which other local users cannot read from the process list)",
    )
    serve.add_argument("--served-model-name", default=None, help="model name in the API (default: the directory)")
    serve.add_argument(
        "--max-waiting-requests", type=int, default=256, help="waiting requests beyond which new ones get 429"
    )
    serve.add_argument(
        "--max-request-bytes", type=int, default=8 * 1024 * 1024, help="larger request bodies get 413"
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get after SIGTERM before they are aborted",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    EngineArgs.add_cli_args(serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
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
    name = args.served_model_name or Path(args.model).name
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    app = api_server.build_app(engine, name, api_key, args.max_request_bytes)
    try:
        api_server.run_server(app, sock, engine, args.log_level, args.shutdown_timeout)
    finally:
        engine.shutdown()
    logging.getLogger(__name__).info("server stopped")
