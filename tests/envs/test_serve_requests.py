"""`serve-env` against hostile HTTP requests, over raw sockets to a real server on 127.0.0.1: every
case of tests/data/fuzz/http_requests.py gets one JSON 4xx; a request whose body was not read whole
closes its connection (the leftover bytes, which hide a `POST /close`, never run); the others leave
the connection usable."""

from __future__ import annotations

import json
import runpy
import socket
import threading
import time
from pathlib import Path

import pytest
from doubles import LineEnv

from engine.envs import serve
from engine.envs.serve import EnvService, make_server

CORPUS = runpy.run_path(str(Path(__file__).resolve().parents[1] / "data" / "fuzz" / "http_requests.py"))
FIRST = "Your goal: reach position 4\ncommands: left, right, wait\nYou are at 0. The goal is 4."  # after reset


@pytest.fixture
def server(monkeypatch):
    """A server with instances 0 and 1, both reset (so `"id": true` or 1.9 would find instance 1)."""
    monkeypatch.setattr(serve, "MAX_BODY", CORPUS["MAX_BODY"])
    yield from _serving(idle_timeout_s=10.0)


def _serving(idle_timeout_s: float):
    service = EnvService(LineEnv, "line", max_envs=8)
    for i in (0, 1):
        assert service.handle("POST", "/create", {}, {})["id"] == i
        service.handle("POST", "/reset", {}, {"id": i, "data_idx": 3})
    srv = make_server(service, request_timeout_s=CORPUS["REQUEST_TIMEOUT_S"], idle_timeout_s=idle_timeout_s)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1], service
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def idle_server():
    """The same server closing keep-alive connections idle for 0.5 s."""
    yield from _serving(idle_timeout_s=0.5)


def read_response(f) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response from the buffered reader `f` (status, lower-cased headers, body)."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1."), f"not a status line: {status_line[:80]!r}"
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b"\n", b""):
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, f.read(int(headers.get("content-length", 0)))


@pytest.mark.parametrize("case", CORPUS["REQUESTS"], ids=lambda c: c.name)
def test_hostile_request_gets_one_json_4xx(server, case):
    port, service = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as f:
        sock.sendall(case.raw)
        status, headers, body = read_response(f)
        assert status == case.status, body
        assert headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert isinstance(error, str) and error and "\n" not in error and "Traceback" not in error
        if case.closes:
            assert headers.get("connection") == "close"
            try:
                rest = f.read()
            except TimeoutError:
                pytest.fail("the server kept the connection open after a body it did not read")
            assert rest == b"", f"the leftover bytes were answered as a request: {rest[:200]!r}"
        else:  # the connection is still in step: the next request on it is answered as itself
            sock.sendall(b"GET /observation?id=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            status, _, body = read_response(f)
            assert status == 200 and json.loads(body) == FIRST
    assert sorted(service._instances) == [0, 1], "a request hidden in a body was executed"
    assert [service._instances[i].observation for i in (0, 1)] == [FIRST] * 2


def test_valid_requests_still_work_on_one_keep_alive_connection(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as f:
        for raw, want in [
            (CORPUS["step"](b'{"id": 1, "action": "right"}'), "You are at 1."),
            (CORPUS["step"](b'{"env_idx": "1", "action": "right"}'), "You are at 2."),
            (CORPUS["request"]("GET", "/observation?id=1"), "You are at 2."),  # after two steps
            (CORPUS["request"]("POST", "/close", b'{"id": 0}'), None),
        ]:
            sock.sendall(raw)
            status, headers, body = read_response(f)
            assert status == 200 and "connection" not in headers, body
            answer = json.loads(body)
            assert (answer["observation"] if isinstance(answer, dict) and want and "observation" in answer
                    else answer) == (want if want else {"closed": True})


def _trickle(sock: socket.socket, data: bytes, gap_s: float) -> threading.Thread:
    """Send `data` one byte every `gap_s` seconds from a thread (each gap far under the deadline)."""
    def send() -> None:
        try:
            for i in range(len(data)):
                sock.sendall(data[i:i + 1])
                time.sleep(gap_s)
        except OSError:  # the server answered and closed: the rest is not wanted
            pass
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("part", ["body", "headers"])
def test_a_request_trickled_a_byte_at_a_time_is_cut_off_at_the_whole_request_deadline(server, part):
    port, service = server
    body = b'{"id": 1, "action": "right"}' + b" " * 12
    raw = CORPUS["step"](body)
    head, payload = raw[:len(raw) - len(body)], raw[len(raw) - len(body):]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as f:
        start = time.monotonic()
        if part == "body":  # headers at once, then 40 bytes over 2 s
            sock.sendall(head)
            _trickle(sock, payload, 0.05)
        else:  # the headers themselves, over 4 s
            _trickle(sock, raw, 0.05)
        status, headers, answer = read_response(f)
        took = time.monotonic() - start
    assert status == 408 and headers.get("connection") == "close", answer
    assert "within 0.5 s" in json.loads(answer)["error"]
    assert took < 1.5, f"answered after {took:.1f} s: the deadline is per read, not per request"
    assert service._instances[1].observation == FIRST, "the trickled step ran"


def test_an_idle_keep_alive_connection_is_closed(idle_server):
    port, _ = idle_server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as f:
        sock.sendall(CORPUS["request"]("GET", "/observation?id=1"))
        status, _, body = read_response(f)
        assert status == 200 and json.loads(body) == FIRST
        start = time.monotonic()
        try:
            rest = f.read()
        except TimeoutError:
            pytest.fail("an idle keep-alive connection stayed open")
        assert rest == b"" and time.monotonic() - start < 2
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # one that never sends a byte
        try:
            assert sock.recv(1) == b""
        except TimeoutError:
            pytest.fail("a connection that sent nothing stayed open")
