"""A paged-serve server on a loopback port inside the test process, and the helpers its tests share."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import uvicorn
from paged_serve import EngineArgs
from paged_serve.engine.async_llm_engine import AsyncLLMEngine
from paged_serve.entrypoints.openai.api_server import bind_socket, build_app


class Server:
    def __init__(self, path, api_key=None, max_waiting_requests=64, max_request_bytes=None, app_kw=None, **engine_kw):
        engine_kw = {"num_gpu_blocks": 96, "max_model_len": 128, **engine_kw}
        self.engine = AsyncLLMEngine.from_engine_args(EngineArgs(path, **engine_kw), max_waiting_requests)
        self.sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        limit = {"max_request_bytes": max_request_bytes} if max_request_bytes else {}
        app = build_app(self.engine, "tiny", api_key, **limit, **(app_kw or {}))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()

    def idle(self, timeout=10.0):
        """Wait until the engine holds no request and no block."""
        deadline = time.time() + timeout
        manager = self.engine.engine.scheduler.block_manager
        while time.time() < deadline:
            if not self.engine.engine.has_unfinished_requests() and not manager.block_tables:
                return True
            time.sleep(0.02)
        return False

    def idle_and_free(self, timeout=10.0) -> bool:
        """Idle, nothing running or waiting, and every KV block back in the free pool."""
        engine = self.engine.engine
        ok = self.idle(timeout)
        manager = engine.scheduler.block_manager
        return ok and manager.get_num_free_gpu_blocks() == engine.cache_config.num_gpu_blocks


def sse_events(response) -> list:
    """The server-sent events of a streamed httpx response: parsed JSON, or the string "[DONE]"."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str], env: dict | None = None, timeout: float = 90.0) -> tuple[subprocess.Popen, str]:
    """``paged-serve serve *args`` in a subprocess on a free loopback port (``env``: None inherits this one's),
    once /health answers: (the process, its URL). Its exit before that fails with its stderr."""
    port = free_port()
    cmd = [sys.executable, "-m", "paged_serve.entrypoints.cli", "serve", *args, "--port", str(port)]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    try:
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return server, url
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.2)
    except BaseException:
        server.kill()  # never left running by a test that failed to start it
        server.wait()
        raise
