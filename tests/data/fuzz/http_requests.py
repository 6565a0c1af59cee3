"""Hostile HTTP requests for `orchard serve-env` (engine/envs/serve.py), as raw bytes.

Each case: the bytes a client sends on a fresh connection, the status the server must answer (always
a JSON {"error": ...}) and whether it must then close the connection (its body was not read whole;
the bytes left over must never be parsed as a request). The server under test holds instances 0 and
1 (both reset); a hidden `POST /close` for instance 0 travels inside several bodies and must never
run. MAX_BODY and REQUEST_TIMEOUT_S are the limits the server is started with (small, so the corpus
stays small). Loaded with runpy by tests/envs/test_serve_requests.py; reusable by any HTTP fuzzer.
"""

from __future__ import annotations

from typing import NamedTuple

MAX_BODY = 4096
REQUEST_TIMEOUT_S = 0.5

HIDDEN = b'POST /close HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\n{"id": 0}'


class Case(NamedTuple):
    name: str
    raw: bytes
    status: int
    closes: bool


def request(method: str, path: str, body: bytes = b"", headers: tuple[str, ...] = (), length: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: t", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def step(body: bytes) -> bytes:
    return request("POST", "/step", body, ("Content-Type: application/json",))


CHUNKED = f"{len(HIDDEN):x}\r\n".encode() + HIDDEN + b"\r\n0\r\n\r\n"

REQUESTS = [
    # framing: a body the server cannot or must not read is answered, then the connection closes
    Case("negative-length", request("POST", "/step", HIDDEN, ("Content-Length: -1",), length=False), 400, True),
    Case("non-numeric-length", request("POST", "/step", HIDDEN, ("Content-Length: abc",), length=False), 400, True),
    Case("signed-length", request("POST", "/step", b'{"id": 0}', ("Content-Length: +9",), length=False), 400, True),
    Case("huge-length", request("POST", "/step", HIDDEN, ("Content-Length: " + "9" * 40,), length=False), 413, True),
    Case("conflicting-lengths", request("POST", "/step", b'{"id": 0, "action": "right"}' + HIDDEN,
                                        ("Content-Length: 28", "Content-Length: 9"), length=False), 400, True),
    Case("over-cap-body-hides-a-request", request("POST", "/step", HIDDEN + b" " * MAX_BODY), 413, True),
    Case("chunked-body-hides-a-request", request("POST", "/step", CHUNKED, ("Transfer-Encoding: chunked",),
                                                 length=False), 411, True),
    Case("chunked-and-length", request("POST", "/step", CHUNKED, ("Transfer-Encoding: chunked",
                                                                  f"Content-Length: {len(CHUNKED)}"), length=False),
         411, True),
    Case("body-shorter-than-length", request("POST", "/step", b'{"id": 0}', ("Content-Length: 50",), length=False),
         408, True),
    # header lines a lenient parser misreads (it drops the field, then reads the body as a request)
    Case("space-before-colon-length", request("POST", "/step", HIDDEN, (f"Content-Length : {len(HIDDEN)}",),
                                              length=False), 400, True),
    Case("tab-before-colon-length", request("POST", "/step", HIDDEN, (f"Content-Length\t: {len(HIDDEN)}",),
                                            length=False), 400, True),
    Case("space-before-colon-chunked", request("POST", "/step", CHUNKED, ("Transfer-Encoding : chunked",),
                                               length=False), 400, True),
    Case("length-after-a-bad-line", request("POST", "/step", HIDDEN, ("X Y: 1", f"Content-Length: {len(HIDDEN)}"),
                                            length=False), 400, True),
    Case("header-name-not-a-token", request("POST", "/step", HIDDEN, ("X(A): 1",)), 400, True),
    Case("folded-header", request("POST", "/step", HIDDEN, ("X-A: 1", " Content-Length: 0"), length=False),
         400, True),
    Case("nul-in-header-value", request("GET", "/", headers=("X-A: a\x00b",)), 400, True),
    Case("garbage-request-line", b"HELLO\r\n\r\n" + HIDDEN, 400, True),
    Case("unknown-method", request("PUT", "/step", b'{"id": 0}'), 405, True),
    Case("request-line-too-long", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414, True),
    Case("header-line-too-long", request("GET", "/", headers=("X-Big: " + "y" * 70_000,)), 431, True),
    Case("too-many-headers", request("GET", "/", headers=tuple(f"X-{i}: y" for i in range(120))), 431, True),
    # bodies read whole: a JSON 4xx, and the connection stays in step (the next request on it works)
    Case("get-with-a-body", request("GET", "/nothing", HIDDEN), 404, False),
    Case("id-true", step(b'{"id": true, "action": "right"}'), 400, False),
    Case("id-false", step(b'{"id": false, "action": "right"}'), 400, False),
    Case("id-fraction", step(b'{"id": 1.9, "action": "right"}'), 400, False),
    Case("id-float-whole", step(b'{"id": 1.0, "action": "right"}'), 400, False),
    Case("id-overflow", step(b'{"id": 1e400, "action": "right"}'), 400, False),
    Case("id-nan", step(b'{"id": NaN, "action": "right"}'), 400, False),
    Case("id-infinity-string", step(b'{"id": "Infinity", "action": "right"}'), 400, False),
    Case("id-list", step(b'{"id": [1], "action": "right"}'), 400, False),
    Case("id-object", step(b'{"id": {"id": 1}, "action": "right"}'), 400, False),
    Case("id-negative", step(b'{"id": -1, "action": "right"}'), 404, False),
    Case("id-huge", step(b'{"id": ' + b"9" * 400 + b', "action": "right"}'), 404, False),
    Case("env-idx-true", step(b'{"env_idx": true, "action": "right"}'), 400, False),
    Case("query-id-fraction", request("GET", "/observation?id=1.9"), 400, False),
    Case("query-id-sign", request("GET", "/observation?id=%2B1"), 400, False),
    Case("data-idx-true", request("POST", "/reset", b'{"id": 0, "data_idx": true}'), 400, False),
    Case("data-idx-overflow", request("POST", "/reset", b'{"id": 0, "data_idx": 1e400}'), 400, False),
    Case("action-not-a-string", step(b'{"id": 0, "action": ["right"]}'), 400, False),
    Case("deeply-nested-json", step(b"[" * 2000 + b"]" * 2000), 400, False),
    Case("invalid-utf8", step(b'{"id": 0, "action": "\xff\xfe"}'), 400, False),
    Case("not-an-object", step(b'[{"id": 0, "action": "right"}]'), 400, False),
    Case("trailing-garbage", step(b'{"id": 0, "action": "right"} {"x"'), 400, False),
]
