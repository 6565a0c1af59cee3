"""A delayed OpenAI-compatible chat server with per-request-seeded answers (tests and bench/scale.py).

It stands in for a GPU server with continuous batching: concurrent requests do not slow each other,
and each answers after 50 ms plus 2.5 ms per token of the longest of its n completions (10-180
tokens, so 75-500 ms). Answers are a pure function of (seed, messages, n): the same request gets the
same completions from any copy of the server, on any port, in any order, so a search against it is
reproducible whatever the scheduling. Actor prompts get composite actions over `--commands`; critic
prompts (a CANDIDATES list) get a BEST pick among the listed candidates. Each generated token's log-prob
entry is `{"logprob": ...}`, or with `--entries vllm` what vLLM's chat answer holds (token, logprob, bytes,
top_logprobs): four times the bytes a client has to read.

    python bench/delayed_server.py [--port 0] [--commands left,right,wait] [--time-scale 1.0] [--entries vllm]

prints `READY <port>` once listening. GET /stats gives the requests served so far.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BASE_S = 0.050
PER_TOKEN_S = 0.0025
TOKENS = (10, 180)
DEFAULT_COMMANDS = ("inventory", "get 1 oak log", "get 2 cobblestone", "craft 4 oak planks using 1 oak log",
                    "craft 4 stick using 2 oak planks", "get 1 iron ingot")


def _rng(payload: dict[str, Any]) -> random.Random:
    key = json.dumps([payload.get("seed"), payload.get("messages"), payload.get("n", 1)], sort_keys=True)
    return random.Random(hashlib.sha256(key.encode()).digest())


def answer(payload: dict[str, Any], commands: tuple[str, ...] = DEFAULT_COMMANDS) -> tuple[list[tuple[str, int]], float]:
    """(n completions as (text, tokens), delay in seconds) for one chat request: a pure function."""
    rng = _rng(payload)
    n = int(payload.get("n") or 1)
    messages = payload.get("messages") or [{"content": ""}]
    last = str(messages[-1].get("content", ""))
    listed = re.findall(r"^\[(\d+)\]", last, re.MULTILINE) if "CANDIDATES:" in last else []
    lengths = [rng.randint(*TOKENS) for _ in range(n)]  # drawn first: the delay needs no commands
    out = []
    for tokens in lengths:
        if listed:
            text = f"REASON: it looks closest to the goal.\nBEST: {rng.choice(listed)}"
        else:
            status = "STOP" if rng.random() < 0.05 else "CONTINUE"
            text = (f"THOUGHT: next step.\nACTION: {rng.choice(commands)}\nEXPLANATION: progress.\n"
                    f"STATUS: {status}")
        out.append((text, tokens))
    return out, BASE_S + PER_TOKEN_S * max(t for _, t in out)


def logprob_entries(tokens: int, shape: str) -> list[dict[str, Any]]:
    """One log-prob entry per generated token: `minimal` ({"logprob"}) or `vllm` (as vLLM's chat answer)."""
    if shape == "vllm":
        return [{"token": " stick", "logprob": -0.0123456789, "bytes": [32, 115, 116, 105, 99, 107],
                 "top_logprobs": []} for _ in range(tokens)]
    return [{"logprob": -0.01} for _ in range(tokens)]


def request_delay(payload: dict[str, Any]) -> float:
    """The delay the server waits before answering `payload` (for a bench's no-barrier bound)."""
    return answer(payload)[1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms ACK stall
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/stats"):
            with self.server.lock:
                self._send(200, {"requests": self.server.requests, "busy_s": self.server.busy_s})
        elif self.path.rstrip("/").endswith("/health"):
            self._send(200, {"ok": True})
        else:
            self._send(404, {"detail": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            payload = json.loads(self.rfile.read(length))
        except ValueError:
            self._send(400, {"detail": "body is not JSON"})
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"detail": "only /v1/chat/completions"})
            return
        choices, delay = answer(payload, self.server.commands)
        delay *= self.server.time_scale
        time.sleep(delay)
        with self.server.lock:
            self.server.requests += 1
            self.server.busy_s += delay
        self._send(200, {
            "object": "chat.completion",
            "model": payload.get("model", ""),
            "choices": [
                {"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": text},
                 "logprobs": {"content": logprob_entries(tokens, self.server.entries)}}
                for i, (text, tokens) in enumerate(choices)
            ],
            "usage": {"completion_tokens": sum(t for _, t in choices)},
        })


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def __init__(self, port: int, commands: tuple[str, ...], time_scale: float, entries: str = "minimal") -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.commands = commands
        self.time_scale = time_scale
        self.entries = entries
        self.lock = threading.Lock()
        self.requests = 0
        self.busy_s = 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--commands", default=",".join(DEFAULT_COMMANDS))
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply every delay (0: answer at once)")
    ap.add_argument("--entries", choices=("minimal", "vllm"), default="minimal", help="each token's log-prob entry")
    args = ap.parse_args()
    server = _Server(args.port, tuple(c.strip() for c in args.commands.split(",") if c.strip()), args.time_scale,
                     args.entries)
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
