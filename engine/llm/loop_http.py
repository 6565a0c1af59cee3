"""`LoopHTTP`: JSON POSTs over plain HTTP/1.1 from ONE asyncio event loop on its own thread, each on
a keep-alive connection of a small pool, the request written in one call and the answer read by a
minimal parser (status line, headers, Content-Length or chunked body).

WHY: with 64-256 trees in flight the search keeps as many requests open. Sent from a pool thread each
(`engine.llm.thread_transport`), the client cost ~1.2 ms of CPU per request on the 2-core host, about
half of it the threads themselves (GIL hand-offs and wake-ups among hundreds of threads, a future
and a queue hop per request) and the rest httpx's request and response objects around
`http.client` (docs/experiments.md 2026-12-05). One loop thread waits on every socket at once: a
request costs a write, a read and the parse, whatever the number in flight.

Scope: http:// only (a local vLLM / SGLang server, where hundreds of requests are in flight); https
(hosted APIs, limit 8) and a proxy named in the environment keep httpx (`engine.llm.openai_http`).
No `Accept-Encoding` is sent; a compressed answer (gzip / deflate) is still decoded. Errors are
httpx's exception types, so the generator's retry logic reads both paths alike; a connection the
server closed while idle (EOF or reset before any byte of the answer) is retried once on a fresh
one, as httpcore does. `timeout_s` bounds each attempt as a whole (connect, write and read).

The loop thread starts on first use and runs the callers' coroutines (`run`); their futures'
done callbacks run on it, so they must be short (the search's only queue the result).

A caller that both sends and handles the answers (the search's scheduler) can instead run a loop of its
own on its thread (`driven`): its posts start on that loop at once, `Driver.wait` runs the loop until
an answer it waits for has landed, and the answers' callbacks run on the caller's thread. No hand-off
between threads then: no self-pipe write to wake the loop thread, no queue wake-up of the caller, no
GIL passed back and forth, per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, NamedTuple, TypeVar

import httpx

KEEPALIVE_S = 5.0  # as httpx's default keepalive_expiry: an idle connection older than this is closed
MAX_HEAD = 64 * 1024  # status line + headers
T = TypeVar("T")


class Answer(NamedTuple):
    """One HTTP answer: status, headers (names lower-cased) and the decoded body."""

    status: int
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _Conn(NamedTuple):
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float


class _Stale(Exception):
    """A reused connection answered nothing (closed or reset by the server while idle)."""


class LoopHTTP:
    """POSTs to one `http://host:port` origin from one event-loop thread, at most `max_in_flight` at
    once (the others wait their turn, untimed, as behind a thread pool). `max_body`: the largest
    answer body accepted (a larger Content-Length is refused before it is read). `close()` ends the
    thread; the next `run` starts a new one."""

    def __init__(self, base_url: str, timeout_s: float, max_in_flight: int, max_body: int) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"LoopHTTP serves http:// URLs only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.base_path = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = f"{host}:{self.port}" if parts.port else host
        self.timeout_s = timeout_s
        self.max_body = max_body
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._thread_lane: _Lane | None = None
        self._lanes: dict[asyncio.AbstractEventLoop, _Lane] = {}  # every loop's lane: the thread's, the driven ones
        self._local = threading.local()  # .lane: the calling thread's driven lane, if any

    # ------------------------------------------------------------ the loop thread

    def _running_loop(self) -> _Lane:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                    finally:
                        loop.close()

                self._thread = threading.Thread(target=serve, name="openai-http-loop", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
                self._thread_lane = self._lanes[loop] = _Lane(loop, self._thread.ident, self.max_in_flight)
            assert self._thread_lane is not None
            return self._thread_lane

    def run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run `coro` on the calling thread's driven loop (`driven`), else on the loop thread; its result
        or error lands in the returned future."""
        lane = getattr(self._local, "lane", None)
        return (lane or self._running_loop()).put(coro)

    @contextlib.contextmanager
    def driven(self, driver: Driver | None = None) -> Iterator[Driver | None]:
        """While inside, what the calling thread posts runs on a loop of its own, which only runs in the
        yielded `Driver`'s calls (the module docstring); with `driver` (another client's, entered on this
        thread), on that driver's loop, so one thread drives several clients (one per server). Yields None
        where the thread cannot drive (it is inside a running loop already, or drives this client already).
        On exit what this client still has in flight there is cancelled (its futures end cancelled) and
        its connections there closed; the driver that made the loop closes it."""
        if asyncio._get_running_loop() is not None or getattr(self._local, "lane", None) is not None:
            yield None
            return
        own = driver is None
        drive = Driver(asyncio.new_event_loop()) if driver is None else driver
        lane = _Lane(drive.loop, threading.get_ident(), self.max_in_flight, drive)
        with self._lock:
            self._lanes[drive.loop] = lane
        self._local.lane = lane
        try:
            yield drive
        finally:
            lane.closed = True  # a callback run by the shutdown that asks again gets a cancelled future,
            try:  # not a request sent from the loop thread after this thread has left
                drive.loop.run_until_complete(self._shutdown(lane))
            finally:
                self._local.lane = None
                if own:
                    drive.loop.close()

    def close(self) -> None:
        """Cancel what is in flight (its futures end cancelled), close every connection, stop the
        thread."""
        with self._lock:
            loop, thread, lane = self._loop, self._thread, self._thread_lane
            self._loop = self._thread = self._thread_lane = None
        if loop is None or thread is None or lane is None:
            return
        if thread is threading.current_thread():  # closed from a done callback: the loop ends after it
            loop.create_task(self._shutdown(lane, stop=True))
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(lane), loop).result()
        loop.call_soon_threadsafe(loop.stop)  # after the sockets' own close callbacks, queued before it
        thread.join()

    async def _shutdown(self, lane: _Lane, stop: bool = False) -> None:
        lane.cancel_queued()
        tasks = list(lane.tasks)  # this client's only: a driven loop may carry other clients' too
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with self._lock:  # only now: a task started before the cancel still looks its lane up in `post`
            self._lanes.pop(lane.loop, None)
        idle, lane.idle = lane.idle, []
        for c in idle:
            c.writer.close()
        if stop:
            asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)

    # ------------------------------------------------------------ one POST (on the loop thread)

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        """POST `body` (JSON) to base path + `path`. Raises httpx.TimeoutException or
        httpx.TransportError subclasses, as httpx's own transport would."""
        head = [f"POST {self.base_path}{path} HTTP/1.1", f"Host: {self._host_header}",
                "Content-Type: application/json", f"Content-Length: {len(body)}"]
        for name, value in headers.items():
            if any(c in name or c in value for c in "\r\n"):
                raise httpx.LocalProtocolError(f"header {name!r} holds a line break")
            head.append(f"{name}: {value}")
        message = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        lane = self._lanes[asyncio.get_running_loop()]
        async with lane.slots:
            return await self._post(path, message, lane.idle)

    async def _post(self, path: str, message: bytes, idle: list[_Conn]) -> Answer:
        try:
            async with asyncio.timeout(self.timeout_s):
                while idle:  # the freshest idle connection first
                    conn = idle.pop()
                    if time.monotonic() - conn.idle_since >= KEEPALIVE_S or conn.reader.at_eof():
                        conn.writer.close()
                        continue
                    try:
                        return await self._exchange(conn, message, idle, reused=True)
                    except _Stale:
                        continue  # closed while idle: the next one, or a fresh connection
                return await self._exchange(await self._connect(), message, idle, reused=False)
        except TimeoutError:
            raise httpx.ReadTimeout(f"POST {self.base_path}{path}: no answer within {self.timeout_s} s") from None

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD)
        except OSError as exc:  # refused, unreachable, name not resolved
            raise httpx.ConnectError(f"connecting to {self.host}:{self.port}: {exc}") from exc
        return _Conn(reader, writer, time.monotonic())

    async def _exchange(self, conn: _Conn, message: bytes, idle: list[_Conn], reused: bool) -> Answer:
        reader, writer, _ = conn
        got_bytes = False
        try:
            writer.write(message)
            if writer.transport.get_write_buffer_size():
                await writer.drain()
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if reused and not exc.partial:
                    raise _Stale from None
                raise httpx.RemoteProtocolError("the server closed the connection without an answer") from None
            got_bytes = True
            status, headers, version = _parse_head(head)
            content = await self._body(reader, headers)
        except _Stale:
            writer.close()
            raise
        except (ConnectionResetError, BrokenPipeError) as exc:
            writer.close()
            if reused and not got_bytes:
                raise _Stale from None
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from None
        except asyncio.LimitOverrunError:
            writer.close()
            raise httpx.RemoteProtocolError(f"answer headers longer than {MAX_HEAD} bytes") from None
        except asyncio.IncompleteReadError:
            writer.close()
            raise httpx.RemoteProtocolError("the server closed the connection in the middle of its answer") from None
        except OSError as exc:
            writer.close()
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:  # cancelled (a timeout, or close()) or a malformed answer
            writer.close()
            raise
        connection = headers.get("connection", "").lower()
        if connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive") or (
                "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")):
            writer.close()
        else:
            idle.append(_Conn(reader, writer, time.monotonic()))
        return Answer(status, headers, _decoded(content, headers.get("content-encoding", ""), self.max_body))

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts: list[bytes] = []
            size = 0
            while True:
                line = await reader.readuntil(b"\r\n")
                try:
                    n = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"malformed chunk size {line[:40]!r}") from None
                size += n
                if n < 0 or size > self.max_body:
                    raise httpx.RemoteProtocolError(f"answer body longer than {self.max_body} bytes")
                if n == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, then the blank line
                        pass
                    return b"".join(parts)
                parts.append(await reader.readexactly(n))
                if await reader.readexactly(2) != b"\r\n":
                    raise httpx.RemoteProtocolError("a chunk does not end in CRLF")
        if "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                raise httpx.RemoteProtocolError(f"Content-Length {headers['content-length'][:40]!r}") from None
            if not 0 <= n <= self.max_body:
                raise httpx.RemoteProtocolError(f"Content-Length {n} outside 0..{self.max_body}")
            return await reader.readexactly(n)
        data = await reader.read(self.max_body + 1)  # neither: the body ends with the connection
        while len(data) <= self.max_body and (more := await reader.read(self.max_body + 1 - len(data))):
            data += more
        if len(data) > self.max_body:
            raise httpx.RemoteProtocolError(f"answer body longer than {self.max_body} bytes")
        return data


class _Lane:
    """One event loop's side of the client: the coroutines handed to it, its keep-alive connections and
    in-flight slots, what it has in flight, and, on a loop a caller drives (`LoopHTTP.driven`), the driver
    it tells when a request ends.

    From another thread coroutines queue, and one wake-up of the loop (a write to its self-pipe) starts
    all that queued meanwhile; from the loop's own thread (a done callback submitting the next request,
    or the thread that drives it) they start at once, with no wake-up at all."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ident: int | None, max_in_flight: int,
                 driver: Driver | None = None) -> None:
        self.loop = loop
        self.ident = ident
        self.driver = driver
        self.lock = threading.Lock()
        self.queued: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]] = []
        self.idle: list[_Conn] = []
        self.slots = asyncio.Semaphore(max_in_flight)  # binds to the loop on first use
        self.tasks: set[asyncio.Task[Any]] = set()  # in flight
        self.closed = False  # a driven lane being shut down: nothing new starts

    def put(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self.closed:
            coro.close()
            fut.cancel()
            return fut
        if threading.get_ident() == self.ident:
            self._start(coro, fut)
            return fut
        with self.lock:
            self.queued.append((coro, fut))
            wake = len(self.queued) == 1
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop has been closed meanwhile
                self.cancel_queued()
        return fut

    def _drain(self) -> None:
        with self.lock:
            queued, self.queued = self.queued, []
        for coro, fut in queued:
            self._start(coro, fut)

    def _start(self, coro: Coroutine[Any, Any, Any], fut: concurrent.futures.Future[Any]) -> None:
        if fut.cancelled():
            coro.close()
            return
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(functools.partial(self._landed, fut))

    def _landed(self, fut: concurrent.futures.Future[Any], task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        _settle(fut, task)
        if self.driver is not None:  # a driver may be waiting: it checks what landed
            self.driver.landed()

    def cancel_queued(self) -> None:
        with self.lock:
            queued, self.queued = self.queued, []
        for coro, fut in queued:
            coro.close()
            fut.cancel()


class Driver:
    """Runs a driven loop on the calling thread (`LoopHTTP.driven`): one per thread, shared by the
    clients entered with it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waker: asyncio.Future[None] | None = None

    def wait(self, until: Callable[[], object]) -> None:
        """Run the loop until `until()` is true, checked at start and after each request lands. The
        caller must have something in flight that makes it hold, or this waits for ever."""
        while not until():
            self._waker = self.loop.create_future()
            try:
                self.loop.run_until_complete(self._waker)
            finally:
                self._waker = None

    def landed(self) -> None:
        """A request of one of the clients ended: a `wait` in progress checks its condition again."""
        if self._waker is not None and not self._waker.done():
            self._waker.set_result(None)

    def send(self) -> None:
        """One pass of the loop without waiting: the requests posted since the last pass go out now
        (their coroutines run to their first wait for the server), not at the next `wait`."""
        self.loop.call_soon(self.loop.stop)
        self.loop.run_forever()


def _settle(fut: concurrent.futures.Future[Any], task: asyncio.Task[Any]) -> None:
    """Copy a finished task's outcome into the caller's future (as `asyncio.run_coroutine_threadsafe`)."""
    if task.cancelled():
        fut.cancel()
    if not fut.set_running_or_notify_cancel():
        return
    exc = task.exception()
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(task.result())


def _parse_head(head: bytes) -> tuple[int, dict[str, str], str]:
    """(status, headers with lower-cased names, version) of an answer's head; RemoteProtocolError when
    it is not HTTP/1.x."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return int(code), headers, version


def _decoded(content: bytes, encoding: str, max_body: int) -> bytes:
    """The body without its Content-Encoding (gzip / deflate), at most `max_body` bytes once
    inflated (a small compressed body can inflate to gigabytes)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return content
    if encoding not in ("gzip", "deflate", "x-gzip"):
        raise httpx.RemoteProtocolError(f"unsupported Content-Encoding {encoding!r}")
    try:
        out = zlib.decompressobj(wbits=47).decompress(content, max_body + 1)  # 47: gzip or zlib header
    except zlib.error as exc:
        raise httpx.RemoteProtocolError(f"{encoding} body: {exc}") from None
    if len(out) > max_body:
        raise httpx.RemoteProtocolError(f"answer body longer than {max_body} bytes once inflated")
    return out
