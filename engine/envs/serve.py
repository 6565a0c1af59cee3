"""`orchard serve-env ENV`: any Orchard env over AgentGym's HTTP env-server protocol (stdlib only).

AgentGym env servers keep numbered env instances: POST /create, POST /step {id, action},
POST /reset {id, data_idx}, GET /observation?id=N (and POST /close). Two request styles exist in the
wild: `id` (TextCraft, BabyAI, SciWorld servers; /create answers {"id": N}) and `env_idx` (WebShop;
/create answers a bare N, /step answers {"state", ...}, /reset answers [observation, null]). This
server reads either key in every request; `style` only picks the shape of /create and /reset
answers. Step answers carry both "observation" and "state". Orchard extensions: GET /tasks?split=,
GET /describe, GET /valid_commands?id=N, and "task_id" in /reset. Endpoints are also served under
/<env name>/ so `agentgym:http://HOST:PORT/textcraft` works.

The first observation (the /reset answer's, and /observation until the first step) carries the task's
goal and context the way AgentGym's own server for that env phrases it (`agentgym_format`): AgentGym
clients read nothing else. The env's own reset text is also in "env_observation" (an Orchard
extension; Orchard's client prompts show goal and context separately).

Connections are served in threads. An env whose objects belong to the thread that made them (the
web env: Playwright's sync API) says so with `thread_bound = True`; its service then runs every call
on one worker thread that owns all its instances (requests queue for it).

Errors are JSON {"error": message}: 400 bad request or env error, 404 unknown path or instance,
503 too many instances, 500 an unexpected env failure (message only, never a traceback); http.server's
own errors (a bad request line, too many headers, an unknown method) are JSON 4xx too. Bodies are JSON
only (nothing is unpickled or executed), framed by one decimal Content-Length (no chunked encoding),
capped at MAX_BODY bytes. A whole request (request line, headers and body) must arrive within
REQUEST_TIMEOUT_S of its first byte, however it is trickled (the deadline is checked before every
read, not per read); a keep-alive connection with no request for IDLE_TIMEOUT_S is closed (both are
`make_server` arguments). A request whose body is not read whole
(bad or missing length, too large, too slow) is answered and its connection closed: the unread bytes
are never parsed as another request. Header lines are strict (RFC 9112): a field name is a token
followed by ':' with no whitespace before it, no line folding, no NUL/CR/LF in a value; anything else
is a 400 that closes the connection (a lenient parser drops `Content-Length : 35` and then reads the
body as a second request). Instance ids are whole numbers (JSON integers or digit strings;
not true, 1.9 or 1e400).
"""

from __future__ import annotations

import io
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from engine.envs.agentgym_format import first_observation
from engine.envs.base import Env, EnvError, SupportsValidCommands, close_env, close_envs

MAX_BODY = 1 << 20
REQUEST_TIMEOUT_S = 30.0  # first byte of a request to its last byte
IDLE_TIMEOUT_S = 120.0  # a keep-alive connection waiting for its next request (agents think between steps)
LINGER_S = 1.0
_DIGITS = re.compile(r"[0-9]{1,18}")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field-name
_BAD_VALUE = re.compile(r"[\x00\r\n]")
STYLES = ("id", "env_idx")


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Instance:
    env: Env
    lock: threading.Lock = field(default_factory=threading.Lock)
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    last_used: float = field(default_factory=time.monotonic)


class EnvService:
    """The protocol's state and logic, independent of HTTP (so it is testable without sockets)."""

    def __init__(self, make_env: Callable[[], Env], name: str, split: str = "train", style: str = "id",
                 max_envs: int = 64, idle_s: float = 600.0, extensions: bool = True) -> None:
        if style not in STYLES:
            raise EnvError(f"unknown protocol style {style!r} (known: {', '.join(STYLES)})")
        self.make_env, self.name, self.split, self.style = make_env, name, split, style
        self.max_envs, self.idle_s = max_envs, idle_s
        self.extensions = extensions  # False: answer exactly like a plain AgentGym server (tests)
        self._probe = make_env()
        self._tasks = self._probe.tasks(split)
        self._instances: dict[int, _Instance] = {}
        self._next = 0
        self._lock = threading.Lock()
        # one worker thread, kept for the service's life: every env call of a thread-bound env runs on it
        self._worker = (ThreadPoolExecutor(1, thread_name_prefix=f"serve-{name}")
                        if getattr(self._probe, "thread_bound", False) else None)

    # -- endpoints ------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        """Answer one request (on the worker thread for a thread-bound env; its errors re-raise here)."""
        if self._worker is None:
            return self._handle(method, path, query, body)
        return self._worker.submit(self._handle, method, path, query, body).result()

    def close_all(self) -> None:
        """Close every instance and the probe env (on the thread that owns them) and stop the
        worker: the server is stopping."""
        def close() -> None:
            with self._lock:
                envs, self._instances = [i.env for i in self._instances.values()], {}
            close_envs([*envs, self._probe])
        if self._worker is None:
            close()
        else:
            self._worker.submit(close).result()
            self._worker.shutdown()

    def _handle(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        route = {("GET", "/"): self.hello, ("GET", "/describe"): self.describe, ("GET", "/tasks"): self.tasks,
                 ("POST", "/create"): self.create, ("POST", "/reset"): self.reset, ("POST", "/step"): self.step,
                 ("GET", "/observation"): self.observation, ("GET", "/valid_commands"): self.valid_commands,
                 ("POST", "/close"): self.close}.get((method, path))
        if route is None or (not self.extensions and path in ("/tasks", "/describe", "/valid_commands")):
            raise HttpError(404, f"no endpoint {method} {path}")
        return route(query if method == "GET" else (body or {}))

    def hello(self, _: Any) -> str:
        return f"This is environment {self.name} (Orchard, AgentGym protocol)."

    def describe(self, _: Any) -> dict[str, Any]:
        return {"name": self.name, "description": self._probe.describe(), "split": self.split,
                "tasks": len(self._tasks), "style": self.style}

    def tasks(self, query: dict[str, str]) -> list[dict[str, Any]]:
        split = query.get("split", self.split)
        tasks = self._tasks if split == self.split else self._probe.tasks(split)
        return [{"id": t.id, "goal": t.goal, "context": t.context, "split": t.split} for t in tasks]

    def create(self, _: Any) -> Any:
        with self._lock:
            if len(self._instances) >= self.max_envs:
                self._evict_idle()
            if len(self._instances) >= self.max_envs:
                raise HttpError(503, f"too many environments ({self.max_envs}); close some with POST /close")
            idx, self._next = self._next, self._next + 1
            self._instances[idx] = _Instance(self.make_env())
        return idx if self.style == "env_idx" else {"id": idx, "observation": "", "reward": 0, "done": False}

    def reset(self, body: dict[str, Any]) -> Any:
        idx, inst = self._instance(body)
        task_id = body.get("task_id") if self.extensions else None
        if task_id is None:
            data_idx = body.get("data_idx", body.get("session_id", 0))
            if not isinstance(data_idx, int) or isinstance(data_idx, bool) or not 0 <= data_idx < len(self._tasks):
                raise HttpError(400, f"data_idx must be a whole number in 0..{len(self._tasks) - 1}, not {data_idx!r}")
            task = self._tasks[data_idx]
        else:
            task = self._probe.task(str(task_id))
        with inst.lock:
            plain = inst.env.reset(task.id)
            valid = inst.env.valid_commands if isinstance(inst.env, SupportsValidCommands) else None
            inst.observation, extra = first_observation(self.name, task, plain, valid)
            inst.reward, inst.done = 0.0, False
        if self.style == "env_idx":
            return [inst.observation, None]
        answer = {"id": idx, "task_id": task.id, "goal": task.goal, "observation": inst.observation, **extra,
                  "reward": 0.0, "score": 0.0, "done": False}
        if self.extensions:
            answer["env_observation"] = plain
        return answer

    def step(self, body: dict[str, Any]) -> dict[str, Any]:
        _, inst = self._instance(body)
        action = body.get("action")
        if not isinstance(action, str):
            raise HttpError(400, "step needs an 'action' string")
        with inst.lock:
            out = inst.env.step(action)
            inst.observation, inst.reward, inst.done = out.observation, out.reward, out.done
        info = {k: v for k, v in out.info.items() if isinstance(v, str | int | float | bool | None)}
        return {"observation": out.observation, "state": out.observation, "reward": out.reward,
                "score": out.reward, "done": out.done, "progress": out.progress, "info": info}

    def observation(self, query: dict[str, str]) -> str:
        return self._instance(query)[1].observation

    def valid_commands(self, query: dict[str, str]) -> list[str]:
        inst = self._instance(query)[1]
        if not isinstance(inst.env, SupportsValidCommands):
            raise HttpError(404, f"env {self.name} does not list valid commands")
        with inst.lock:
            return inst.env.valid_commands()

    def close(self, body: dict[str, Any]) -> dict[str, bool]:
        idx, inst = self._instance(body)
        with self._lock:
            self._instances.pop(idx, None)
        close_env(inst.env)
        return {"closed": True}

    def shutdown(self) -> None:
        """The server is stopping: `close_all`."""
        self.close_all()

    # -- helpers --------------------------------------------------------------------------------------

    def _instance(self, args: dict[str, Any]) -> tuple[int, _Instance]:
        raw = args.get("id", args.get("env_idx"))
        if raw is None:
            raise HttpError(400, "missing environment 'id' (or 'env_idx')")
        idx = _whole(raw)
        if idx is None:
            raise HttpError(400, f"environment id must be a whole number, not {str(raw)[:40]!r}")
        with self._lock:
            inst = self._instances.get(idx)
        if inst is None:
            raise HttpError(404, f"no environment with id {str(idx)[:40]} (create one with POST /create)")
        inst.last_used = time.monotonic()
        return idx, inst

    def _evict_idle(self) -> None:
        now = time.monotonic()
        idle = [(i.last_used, k) for k, i in self._instances.items() if now - i.last_used > self.idle_s]
        if idle:
            _, key = min(idle)
            close_env(self._instances.pop(key).env)


def _whole(raw: Any) -> int | None:
    """A JSON integer or a string of digits as an int; None for anything else (booleans, floats)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and _DIGITS.fullmatch(raw.strip()):
        return int(raw)
    return None


def header_problem(headers: Any) -> str | None:
    """Why parsed request headers are malformed (one line), or None. http.server's parser stops at the
    first line that is not `token:` and leaves the rest, unparsed, as a 'payload'; folded lines come
    back as values holding a newline."""
    rest = headers.get_payload()
    if rest:
        line = str(rest).splitlines()[0]
        return (f"malformed header line {line[:60]!r}: a field name is a token followed by ':' "
                "with no whitespace before it")
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            return f"header name {name[:40]!r} is not a token"
        if _BAD_VALUE.search(value):
            return f"header {name[:40]!r} is folded or holds a control character (NUL, CR or LF)"
    return None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class _Late(Exception):
    """A request not received whole by its deadline (not a TimeoutError: http.server would swallow
    that and close without an answer)."""


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each waiting at most until `deadline` (whole-request time left), or
    `idle_s` while no request has started (deadline None)."""

    def __init__(self, sock: socket.socket, idle_s: float) -> None:
        self.sock, self.idle_s = sock, idle_s
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wait = self.idle_s if self.deadline is None else self.deadline - time.monotonic()
        if wait <= 0:
            raise _Late
        self.sock.settimeout(wait)
        try:
            return self.sock.recv_into(buffer)
        except TimeoutError:
            if self.deadline is None:
                raise  # idle: http.server closes the connection quietly
            raise _Late from None


class _Handler(BaseHTTPRequestHandler):
    service: EnvService
    request_timeout_s = REQUEST_TIMEOUT_S
    idle_timeout_s = IDLE_TIMEOUT_S
    command, requestline, request_version = "", "", "HTTP/1.1"  # a 408 can come before the request line
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:  # quiet; errors are answered as JSON
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection, self.idle_timeout_s)
        self._buffer = io.BufferedReader(self._reader)
        self.rfile = self._buffer

    def handle_one_request(self) -> None:
        """Wait up to the idle timeout for a request's first byte, then give the whole request
        `request_timeout_s`; one not in by then is a 408 and the connection closes."""
        self._reader.deadline = None
        try:
            if not self._buffer.peek(1):
                self.close_connection = True
                return
        except OSError:  # idle too long (TimeoutError) or the client went away
            self.close_connection = True
            return
        self._reader.deadline = time.monotonic() + self.request_timeout_s
        try:
            super().handle_one_request()
        except _Late:
            self.send_error(408, f"request not received whole within {self.request_timeout_s:g} s")

    def parse_request(self) -> bool:
        """http.server's parsing, then strict header lines (`header_problem`): a 400 and close."""
        if not super().parse_request():
            return False
        problem = header_problem(self.headers)
        if problem is not None:
            self.send_error(400, problem)
            return False
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (bad request line, long or many headers, unknown method) as JSON
        4xx; the request was not read whole, so the connection closes."""
        if code == HTTPStatus.NOT_IMPLEMENTED:  # an unknown method is the client's error
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {str(self.command)[:20]!r} is not allowed (GET or POST)"
        if self.request_version == "HTTP/0.9":  # a garbled request line: still answer with a status line
            self.request_version = "HTTP/1.1"
        self.close_connection = True
        self._answer(code, {"error": message or HTTPStatus(code).phrase})
        self._linger()

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        prefix = f"/{self.service.name}"
        if path == prefix or path.startswith(prefix + "/"):
            path = path[len(prefix):] or "/"
        try:
            body = self._body(parse=method == "POST")  # a GET's body is read (and ignored), never left over
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            status, payload = 200, self.service.handle(method, path, query, body)
        except HttpError as e:
            status, payload = e.status, {"error": str(e)}
        except EnvError as e:
            status, payload = 400, {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - an env bug must answer, not kill the connection
            status, payload = 500, {"error": f"{type(e).__name__}: {e}"}
        self._answer(status, payload)
        if self.close_connection:
            self._linger()

    def _linger(self) -> None:
        """Before closing on unread bytes: send FIN, then read and drop what the client still sends
        (at most LINGER_S and MAX_BODY + 64 KiB), so closing does not reset the connection and destroy
        the answer in flight."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            deadline, left = time.monotonic() + LINGER_S, MAX_BODY + (1 << 16)
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                self.connection.settimeout(wait)
                chunk = self.connection.recv(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:  # the client went away first: nothing to protect
            pass

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.connection.settimeout(self.idle_timeout_s)  # a client that never reads cannot hold us forever
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _refuse(self, status: int, message: str) -> HttpError:
        """An error for a body that was not read: the connection closes after the answer."""
        self.close_connection = True
        return HttpError(status, message)

    def _body(self, parse: bool = True) -> Any:
        if "Transfer-Encoding" in self.headers:
            raise self._refuse(411, "Transfer-Encoding (chunked) bodies are not accepted; send a Content-Length")
        lengths = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        if len(lengths) > 1:
            raise self._refuse(400, "conflicting Content-Length headers")
        text = lengths.pop() if lengths else "0"
        if not text.isascii() or not text.isdigit():
            raise self._refuse(400, f"Content-Length must be a whole number of bytes, not {text[:40]!r}")
        length = int(text) if len(text) < 20 else MAX_BODY + 1
        if length > MAX_BODY:
            raise self._refuse(413, f"request body over {MAX_BODY} bytes")
        if not length:
            return {} if parse else None
        try:
            raw = self.rfile.read(length)
        except _Late:
            raise self._refuse(408, f"request not received whole within {self.request_timeout_s:g} s") from None
        if len(raw) < length:
            raise self._refuse(400, f"request body ended after {len(raw)} of {length} bytes")
        if not parse:
            return None
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw, parse_constant=_no_constant)
        except ValueError as e:
            raise HttpError(400, f"request body is not JSON: {str(e)[:200]}") from None
        except RecursionError:
            raise HttpError(400, "request body is not JSON: nested too deeply") from None
        if not isinstance(body, dict):
            raise HttpError(400, "request body must be a JSON object")
        return body


def make_server(service: EnvService, host: str = "127.0.0.1", port: int = 0,
                request_timeout_s: float = REQUEST_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                ) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"service": service, "request_timeout_s": request_timeout_s,
                                            "idle_timeout_s": idle_timeout_s})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(spec: str, host: str, port: int, split: str, style: str, max_envs: int,
          log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> None:
    """Serve env `spec` until interrupted; logs one line with the URL (port 0 picks a free port)."""
    from engine.envs.registry import env_factory

    name = spec.partition(":")[0]
    service = EnvService(env_factory(spec), name, split, style, max_envs)
    try:
        server = make_server(service, host, port)
    except OSError as e:
        service.shutdown()
        raise EnvError(f"cannot listen on {host}:{port}: {e}") from e
    log(f"serving {spec} ({len(service._tasks)} {split} tasks, {style} style) on "
        f"http://{host}:{server.server_address[1]}/{name}")
    try:
        server.serve_forever()
    finally:
        server.server_close()
        service.shutdown()
