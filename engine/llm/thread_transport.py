"""`ThreadTransport`: an httpx transport with one keep-alive socket per calling thread; each request
is written in one `sendall` and its answer parsed by the standard library's `http.client.HTTPResponse`.

WHY: on https (hosted APIs) and behind a proxy, `OpenAIGenerator` sends from up to `max_concurrency`
pool threads (a plain-http server gets one event-loop thread instead: `engine.llm.loop_http`). httpx's default transport is httpcore's connection pool, which takes one pool-wide lock and
rescans every connection for every queued request on each request and each release (httpcore
1.0.x: O(connections^2)); shared by 256 threads it cost the client 5-13 ms of CPU per request, more
as the client fell behind (idle connections lengthen the scan). A pool per thread has one
connection to scan, but httpcore + h11 still cost 0.75-1.06 ms of CPU per POST on the loaded 2-core
host against 0.39-0.54 ms here (bare `http.client`: 0.22-0.34 ms; docs/experiments.md 2026-12-03).
The httpx.Client above stays: timeouts (the request's `timeout` extension), event hooks, headers
and the decoding of `Content-Encoding` work as with httpx's own transport, and its errors are
httpx's (`httpx.TimeoutException`, `httpx.TransportError`), which the generator's retries expect.

Connections are kept alive as httpx's default (5 s idle at most; one the server has closed meanwhile
is noticed before it is used, as httpcore does). HTTP/1.1 only; proxies from the environment are
not handled here: `engine.llm.openai_http` then keeps httpx's own pool.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from typing import Any

import httpx

KEEPALIVE_S = 5.0  # httpx's default keepalive_expiry


class _Conn:
    """One thread's socket to one origin, and when it was last used."""

    def __init__(self, origin: tuple[str, str, int], sock: socket.socket) -> None:
        self.origin = origin
        self.sock: socket.socket | None = sock
        self.idle_since = time.monotonic()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _readable(sock: socket.socket) -> bool:
    """True when an idle connection's socket has something to read: the server closed it (EOF) or
    sent what no request asked for; either way it cannot take the next request."""
    if hasattr(select, "poll"):  # select.select fails on descriptors past FD_SETSIZE (1024)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


def _seconds(timeouts: dict[str, Any], key: str) -> float | None:
    value = timeouts.get(key)
    return float(value) if value is not None else None


def _error(exc: BaseException, sending: bool) -> type[httpx.TransportError]:
    """The httpx error an `http.client` / socket error stands for (what httpcore raises)."""
    if isinstance(exc, TimeoutError):
        return httpx.WriteTimeout if sending else httpx.ReadTimeout
    if isinstance(exc, http.client.HTTPException):  # includes RemoteDisconnected: no answer at all
        return httpx.RemoteProtocolError
    return httpx.WriteError if sending else httpx.ReadError


class ThreadTransport(httpx.BaseTransport):
    """See the module docstring. `ssl_context`: for https (one for every thread; built on first
    https use when not given)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._ssl = ssl_context
        self._open: dict[int, tuple[threading.Thread, _Conn]] = {}  # by thread id, for close()
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context(trust_env=True)
            return self._ssl

    def _connection(self, origin: tuple[str, str, int], timeouts: dict[str, Any]) -> _Conn:
        """This thread's live connection to `origin`, reused when it is fresh, else a new one."""
        held: _Conn | None = getattr(self._local, "conn", None)
        if held is not None:
            fresh = time.monotonic() - held.idle_since < KEEPALIVE_S
            if held.origin == origin and held.sock is not None and fresh and not _readable(held.sock):
                return held
            held.close()
        scheme, host, port = origin
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((host, port), timeout=_seconds(timeouts, "connect"))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                sock = self._ssl_context().wrap_socket(sock, server_hostname=host)
        except TimeoutError as exc:
            if sock is not None:
                sock.close()
            raise httpx.ConnectTimeout(f"connecting to {host}:{port}: {exc}") from exc
        except OSError as exc:  # refused, unreachable, name not resolved, TLS handshake failed
            if sock is not None:
                sock.close()
            raise httpx.ConnectError(f"connecting to {host}:{port}: {exc}") from exc
        held = _Conn(origin, sock)
        self._local.conn = held
        with self._lock:
            if self._closed:
                held.close()
                raise httpx.ConnectError("the client's transport is closed")
            for ident in [i for i, (thread, _) in self._open.items() if not thread.is_alive()]:
                self._open.pop(ident)[1].close()  # a connection whose thread has ended
            self._open[threading.get_ident()] = (threading.current_thread(), held)
        return held

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r} in {url}")
        lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), url.raw_path)]
        for name, value in request.headers.raw:  # httpx's own: Host, Accept-Encoding, Content-Length...
            if b"\n" in value or b"\r" in value or b"\n" in name or b"\r" in name:
                raise httpx.LocalProtocolError(f"header {name!r} holds a line break")
            lines.append(b"%s: %s" % (name, value))
        lines.append(b"\r\n")
        message = b"\r\n".join(lines) + request.read()  # headers and body in one write
        timeouts = request.extensions.get("timeout", {})
        held = self._connection((url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80)),
                                timeouts)
        sock = held.sock
        assert sock is not None
        stage = "sending"
        try:
            sock.settimeout(_seconds(timeouts, "write"))
            sock.sendall(message)
            stage = "reading"
            sock.settimeout(_seconds(timeouts, "read"))
            resp = http.client.HTTPResponse(sock, method=request.method)
            resp.begin()
            content = resp.read()
        except (http.client.HTTPException, OSError) as exc:  # timed out, closed, reset, malformed answer
            held.close()
            why = f"{stage} {request.method} {url}: {type(exc).__name__}: {exc}"
            raise _error(exc, stage == "sending")(why) from exc
        if resp.will_close:
            held.close()
        held.idle_since = time.monotonic()
        return httpx.Response(
            resp.status,
            headers=resp.getheaders(),
            stream=httpx.ByteStream(content),
            extensions={"http_version": b"HTTP/1.1" if resp.version == 11 else b"HTTP/1.0",
                        "reason_phrase": resp.reason.encode("ascii", "replace")},
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held, self._open = [c for _, c in self._open.values()], {}
        for c in held:
            c.close()
