"""Binding the port and serving until a signal, then shutting down gracefully (uvicorn underneath)."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before anything slow happens, so a port in use fails in a second with one line naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot bind {host}:{port}: {exc.strerror}") from None
    return sock


def run_server(
    app,
    sock: socket.socket,
    abort_all: Callable[[str], None],
    log_level: str = "info",
    shutdown_timeout: float = 10.0,
    failed: Callable[[], bool] | None = None,
) -> None:
    """Serve ``app`` until SIGTERM / SIGINT, then shut down gracefully: in-flight requests get ``shutdown_timeout``
    seconds to finish, then ``abort_all(reason)`` ends them (each client gets a 503, or an error event in its
    stream) and this returns normally. uvicorn's own cancellation stays a later backstop (it would log tracebacks).
    ``failed()`` true (the engine died: a tensor-parallel worker exited) stops the server the same way, after the
    requests in flight got their 500."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not self.should_exit:
                logger.info("shutting down: in-flight requests have %.1f s", shutdown_timeout)
                timer = threading.Timer(shutdown_timeout, abort_all, args=("the server is shutting down",))
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if failed is not None and not self.should_exit and failed():
                logger.error("the engine failed: shutting the server down")
                self.should_exit = True
            return await super().on_tick(counter)

    host, port = sock.getsockname()[:2]
    logger.info("serving on http://%s:%d", host, port)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout + 5)
    # uvicorn re-raises the signal it caught once it has stopped; a no-op handler here turns that into a return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    Server(config).run(sockets=[sock])
