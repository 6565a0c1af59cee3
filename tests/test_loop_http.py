"""engine.llm.loop_http: POSTs from one event-loop thread on keep-alive connections, against the scripted
local server of test_thread_transport (127.0.0.1, counts the connections it accepts) and a raw socket
server for what http.server cannot do (close an idle connection unannounced, lie about a length)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest
from test_thread_transport import server  # noqa: F401 (the fixture)

from engine.llm.loop_http import LoopHTTP
from engine.llm.openai_http import OpenAIGenerator

BODY = json.dumps({"a": 1}).encode()
BOMB = gzip.compress(b"0" * 5000)  # 5000 bytes in fewer than 100


def _post(client: LoopHTTP, path: str, headers: dict[str, str] | None = None) -> Any:
    return client.run(client.post(path, BODY, headers or {})).result(timeout=10)


def test_answers_are_read_whatever_their_framing_and_connections_are_kept(server: Any) -> None:  # noqa: F811
    client = LoopHTTP(server.url, timeout_s=10, max_in_flight=4, max_body=2**20)
    try:
        for path in ("/plain", "/gzip", "/chunked", "/plain"):
            answer = _post(client, path, {"Authorization": "Bearer k"})
            assert answer.status == 200
            assert json.loads(answer.content) == {"path": path, "got": {"a": 1}}
        assert server.connections == 1  # one keep-alive connection for all four
        _post(client, "/close")  # the server says Connection: close
        _post(client, "/plain")
        assert server.connections == 2
        path, headers, body = server.seen[0]
        assert headers["Authorization"] == "Bearer k" and headers["Content-Type"] == "application/json"
        assert "Accept-Encoding" not in headers and body == BODY
    finally:
        client.close()
    under = LoopHTTP(server.url + "/v1/", timeout_s=10, max_in_flight=1, max_body=2**20)
    assert json.loads(_post(under, "/chat/completions").content)["path"] == "/v1/chat/completions"
    under.close()


def test_requests_beyond_the_limit_wait_their_turn(server: Any) -> None:  # noqa: F811
    client = LoopHTTP(server.url, timeout_s=10, max_in_flight=3, max_body=2**20)
    try:
        futures = [client.run(client.post("/slow" if i < 3 else "/plain", BODY, {})) for i in range(9)]
        assert all(f.result(timeout=20).status == 200 for f in futures)
        assert server.connections == 3  # never more sockets than the limit
    finally:
        client.close()


def test_timeouts_hangups_and_bad_headers_are_httpx_errors(server: Any) -> None:  # noqa: F811
    client = LoopHTTP(server.url, timeout_s=0.2, max_in_flight=2, max_body=2**20)
    try:
        with pytest.raises(httpx.ReadTimeout):
            _post(client, "/slow")
        with pytest.raises(httpx.RemoteProtocolError, match="without an answer"):
            _post(client, "/hangup")
        with pytest.raises(httpx.LocalProtocolError, match="line break"):
            _post(client, "/plain", {"Authorization": "Bearer k\r\nX-Evil: 1"})
        assert _post(client, "/plain").status == 200  # still usable
    finally:
        client.close()
    small = LoopHTTP(server.url, timeout_s=5, max_in_flight=1, max_body=10)
    try:
        with pytest.raises(httpx.RemoteProtocolError, match="outside 0..10"):
            _post(small, "/plain")
        with pytest.raises(httpx.RemoteProtocolError, match="longer than 10"):
            _post(small, "/chunked")
    finally:
        small.close()
    with pytest.raises(httpx.ConnectError):
        dead = LoopHTTP(f"http://127.0.0.1:{_free_port()}", timeout_s=5, max_in_flight=1, max_body=100)
        try:
            _post(dead, "/x")
        finally:
            dead.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def raw_server() -> Iterator[Any]:
    """Answers each connection's first request with `reply` (keep-alive promised), then closes it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    state: dict[str, Any] = {"connections": 0,
                             "reply": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{}"}

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            state["connections"] += 1
            with conn:
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(BODY):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(state["reply"])

    threading.Thread(target=serve, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield state
    sock.close()


def test_a_connection_closed_while_idle_is_replaced_without_an_error(raw_server: Any) -> None:
    client = LoopHTTP(raw_server["url"], timeout_s=5, max_in_flight=1, max_body=100)
    try:
        for _ in range(3):
            assert _post(client, "/x").content == b"{}"
        assert raw_server["connections"] == 3
    finally:
        client.close()


@pytest.mark.parametrize("reply,error", [
    (b"SPDY/9 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}", "in the middle of its answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n{}", "outside 0..100"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}", "unsupported Content-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(BOMB), BOMB),
     "longer than 100 bytes once inflated"),
])
def test_a_malformed_answer_is_a_protocol_error(raw_server: Any, reply: bytes, error: str) -> None:
    raw_server["reply"] = reply
    client = LoopHTTP(raw_server["url"], timeout_s=5, max_in_flight=1, max_body=100)
    try:
        with pytest.raises(httpx.RemoteProtocolError, match=error):
            _post(client, "/x")
    finally:
        client.close()


def test_close_cancels_what_is_in_flight_and_the_client_starts_again(server: Any) -> None:  # noqa: F811
    client = LoopHTTP(server.url, timeout_s=10, max_in_flight=2, max_body=2**20)
    slow = client.run(client.post("/slow", BODY, {}))
    client.close()
    assert slow.cancelled()
    assert _post(client, "/plain").status == 200  # a new loop thread
    closed: Future[bool] = Future()

    def close_from_the_loop(_: Any) -> None:  # a done callback runs on the loop thread
        client.close()
        closed.set_result(True)

    client.run(client.post("/plain", BODY, {})).add_done_callback(close_from_the_loop)
    assert closed.result(timeout=10)
    assert _post(client, "/plain").status == 200
    client.close()


def test_a_driven_thread_runs_its_own_posts_and_its_answers_land_on_it(server: Any) -> None:  # noqa: F811
    client = LoopHTTP(server.url, timeout_s=10, max_in_flight=2, max_body=2**20)
    me = threading.get_ident()
    try:
        with client.driven() as driver:
            assert driver is not None
            landed_on: list[int] = []
            futures = [client.run(client.post("/plain", BODY, {})) for _ in range(3)]
            for f in futures:
                f.add_done_callback(lambda _: landed_on.append(threading.get_ident()))
            driver.send()  # out now; the answers are read only while the driver waits
            threading.Event().wait(0.3)
            assert not any(f.done() for f in futures)
            driver.wait(lambda: all(f.done() for f in futures))
            assert [f.result().status for f in futures] == [200] * 3 and landed_on == [me] * 3
            assert client._thread is None  # no loop thread: this one ran the loop
            other: Future[int] = Future()  # another thread's post goes to the loop thread, undriven
            threading.Thread(target=lambda: other.set_result(_post(client, "/plain").status)).start()
            assert other.result(timeout=10) == 200 and client._thread is not None
            with client.driven() as again:
                assert again is None  # this thread drives already
            slow = client.run(client.post("/slow", BODY, {}))
            driver.send()
        assert slow.cancelled()  # what was in flight at the exit
        assert _post(client, "/plain").status == 200  # and the client goes on, on its loop thread
    finally:
        client.close()


def test_a_callback_that_posts_while_the_driven_exit_shuts_down_gets_a_cancelled_future(server: Any) -> None:  # noqa: F811
    """A request that ended in the driver's last pass has its callbacks run by the exit's shutdown; one that
    posts again (a re-ask, a fail-over) must not start the loop thread and send after the thread has left."""
    client = LoopHTTP(server.url, timeout_s=10, max_in_flight=2, max_body=2**20)
    again: list[Future[Any]] = []
    try:
        with client.driven() as driver:
            assert driver is not None
            lane = client._local.lane
            first = client.run(client.post("/plain", BODY, {}))
            first.add_done_callback(lambda _: again.append(client.run(client.post("/plain", BODY, {}))))
            for _ in range(2000):  # passes until the answer's task is done and its callbacks not yet run
                driver.send()
                if any(t.done() for t in lane.tasks):
                    break
                threading.Event().wait(0.002)
            assert any(t.done() for t in lane.tasks) and not first.done()
        assert first.result().status == 200  # the answer that landed is kept
        assert len(again) == 1 and again[0].cancelled()  # the post from its callback is not sent
        assert client._thread is None
    finally:
        client.close()


def test_two_clients_share_one_driver_and_each_exit_cancels_its_own(server: Any) -> None:  # noqa: F811
    a = LoopHTTP(server.url, timeout_s=10, max_in_flight=2, max_body=2**20)
    b = LoopHTTP(server.url, timeout_s=10, max_in_flight=2, max_body=2**20)
    try:
        with a.driven() as driver:
            assert driver is not None
            with b.driven(driver) as same:
                assert same is driver
                pair = [a.run(a.post("/plain", BODY, {})), b.run(b.post("/plain", BODY, {}))]
                driver.wait(lambda: all(f.done() for f in pair))  # one loop serves both clients
                assert [f.result().status for f in pair] == [200, 200]
                slow_a, slow_b = a.run(a.post("/slow", BODY, {})), b.run(b.post("/slow", BODY, {}))
                driver.send()
            assert slow_b.cancelled() and not slow_a.done()  # b's exit cancels b's request only
            driver.wait(slow_a.done)
            assert slow_a.result().status == 200
        assert a._thread is None and b._thread is None
    finally:
        a.close()
        b.close()


def test_the_generator_uses_the_loop_for_plain_http_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert OpenAIGenerator("http://127.0.0.1:9/v1", "m")._loop_http is not None
    assert OpenAIGenerator("https://127.0.0.1:9/v1", "m")._loop_http is None
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    assert OpenAIGenerator("http://127.0.0.1:9/v1", "m")._loop_http is None


def test_the_client_is_a_spec_option(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    threads = OpenAIGenerator.from_spec("openai:http://127.0.0.1:9/v1#m?concurrency=4&client=threads")
    assert threads._loop_http is None and threads.name.endswith("?concurrency=4&client=threads")
    assert OpenAIGenerator.from_spec("openai:http://127.0.0.1:9/v1#m?client=loop")._loop_http is not None
    with pytest.raises(ValueError, match="client=loop serves plain http://"):
        OpenAIGenerator.from_spec("openai:https://127.0.0.1:9/v1#m?client=loop")
    with pytest.raises(ValueError, match="client='fast' is not one of auto, loop, threads"):
        OpenAIGenerator.from_spec("openai:http://127.0.0.1:9/v1#m?client=fast")
