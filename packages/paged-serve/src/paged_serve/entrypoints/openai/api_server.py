"""vLLM's ``entrypoints/openai/api_server.py`` path: the server is ``paged_serve._compat.openai.api_server``."""

from paged_serve._compat.openai.api_server import DEFAULT_MAX_REQUEST_BYTES, bind_socket, build_app, run_server

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "bind_socket",
    "build_app",
    "run_server",
]
