"""engine.llm.thread_transport: one keep-alive connection per thread under an httpx.Client, against a
scripted local HTTP server (127.0.0.1) that records each connection it accepts."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from engine.llm import thread_transport
from engine.llm.openai_http import OpenAIGenerator, shared_pool_client
from engine.llm.thread_transport import ThreadTransport


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.seen.append((self.path, dict(self.headers), body))
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/hangup":  # no answer at all
            self.close_connection = True
            return
        data = json.dumps({"path": self.path, "got": json.loads(body or b"null")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path == "/gzip":
            data = gzip.compress(data)
            self.send_header("Content-Encoding", "gzip")
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (data[:5], data[5:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[Any]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.handle_error = lambda request, address: None  # /slow writes after the client gave up
    srv.lock, srv.connections, srv.seen = threading.Lock(), 0, []
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _client(timeout: float = 10) -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(timeout), transport=ThreadTransport())


def test_requests_keep_one_connection_per_thread_and_send_httpx_headers(server: Any) -> None:
    with _client() as client:
        answers = [client.post(f"{server.url}/a?q=1", json={"i": i}).json() for i in range(5)]
        with ThreadPoolExecutor(4) as pool:  # 4 threads, 8 requests each: at most 4 more connections
            list(pool.map(lambda i: client.post(f"{server.url}/b", json={"i": i}).json(), range(32)))
    assert answers == [{"path": "/a?q=1", "got": {"i": i}} for i in range(5)]
    assert 2 <= server.connections <= 5
    _, headers, body = server.seen[0]
    assert headers["Content-Type"] == "application/json" and headers["Host"] == server.url.removeprefix("http://")
    assert json.loads(body) == {"i": 0}


def test_gzip_and_chunked_answers_are_decoded(server: Any) -> None:
    with _client() as client:
        assert client.post(f"{server.url}/gzip", json=[1, 2]).json() == {"path": "/gzip", "got": [1, 2]}
        assert client.post(f"{server.url}/chunked", json="x").json() == {"path": "/chunked", "got": "x"}
        assert client.post(f"{server.url}/again", json=3).json()["got"] == 3  # still in step after both
    assert server.connections == 1


def test_a_closed_or_expired_connection_is_replaced_before_it_is_used(server: Any, monkeypatch) -> None:
    with _client() as client:
        assert client.post(f"{server.url}/close", json=1).json()["got"] == 1  # server said Connection: close
        assert client.post(f"{server.url}/x", json=2).json()["got"] == 2
        assert server.connections == 2
        monkeypatch.setattr(thread_transport, "KEEPALIVE_S", 0.0)  # idle past the keep-alive expiry
        assert client.post(f"{server.url}/x", json=3).json()["got"] == 3
        assert server.connections == 3


def test_errors_are_httpx_errors_the_generator_retries(server: Any) -> None:
    with _client(timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post(f"{server.url}/slow", json=1)
        with pytest.raises(httpx.RemoteProtocolError):
            client.post(f"{server.url}/hangup", json=1)
        assert client.post(f"{server.url}/fine", json=4).json()["got"] == 4  # a new connection after each
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _client() as client, pytest.raises(httpx.ConnectError):
        client.post(f"http://127.0.0.1:{port}/x", json=1)
    with _client() as client, pytest.raises(httpx.LocalProtocolError, match="line break"):
        client.post(f"{server.url}/x", json=1, headers={"X-Bad": "a\r\nInjected: yes"})


def test_close_closes_every_threads_connection(server: Any) -> None:
    transport = ThreadTransport()
    client = httpx.Client(timeout=httpx.Timeout(5), transport=transport)
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda i: client.post(f"{server.url}/x", json=i), range(9)))
    socks = [c.sock for _, c in transport._open.values()]
    assert socks and all(s is not None for s in socks)
    client.close()
    assert all(s.fileno() == -1 for s in socks)  # closed sockets
    with pytest.raises(RuntimeError):  # httpx refuses a closed client
        client.post(f"{server.url}/x", json=1)


def test_generator_uses_it_unless_a_proxy_is_configured(monkeypatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    gen = OpenAIGenerator("http://127.0.0.1:9/v1", "m")
    assert isinstance(gen._client._transport, ThreadTransport)
    gen.close()
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    gen = OpenAIGenerator("http://127.0.0.1:9/v1", "m")  # httpx's own pool honours the proxy
    assert type(gen._client._transport) is type(shared_pool_client(1, 1)._transport)
    assert not isinstance(gen._client._transport, ThreadTransport)
    gen.close()
