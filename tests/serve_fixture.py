"""A REAL OpenAI-compatible server for tests: `transformers serve` on a local model folder,
bound to 127.0.0.1, offline, stopped when the context ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def transformers_serve(model_dir: Path, log_dir: Path, timeout_s: float = 60) -> Iterator[SimpleNamespace]:
    """Yields base_url (…/v1), model (the id the server expects) and the server's log path."""
    port = free_port()
    log_path = log_dir / "serve.log"
    cmd = [str(Path(sys.executable).with_name("transformers")), "serve", str(model_dir)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"`transformers serve` exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() - start > timeout_s:
                pytest.fail(f"`transformers serve` not healthy within {timeout_s} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield SimpleNamespace(base_url=f"{base}/v1", model=str(model_dir), log=log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def record_posts(gen: Any, posts: list[str]) -> None:
    """Append the URL path of every POST `gen` (an OpenAIGenerator) sends to `posts`, on either of its
    clients: the event loop (`engine.llm.loop_http`, http:// servers) or httpx (https, proxies)."""
    loop_http = gen._loop_http
    if loop_http is None:
        gen._client.event_hooks["request"].append(lambda req: posts.append(req.url.path))
        return
    post = loop_http.post

    async def recorded(path: str, body: bytes, headers: dict[str, str]) -> Any:
        posts.append(loop_http.base_path + path)
        return await post(path, body, headers)

    loop_http.post = recorded
