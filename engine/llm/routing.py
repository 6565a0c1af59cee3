"""`RoutedGenerator`: one model served by several OpenAI-compatible servers, with tree affinity.

Spec: `openai:URL1,URL2,...#MODEL[?concurrency=N&...]` (options apply to each server). Requests
carry an affinity key (search passes the tree's task id): a key stays on one server while that
server is healthy, so its prefix cache keeps holding the tree's shared history (system prompt,
task, earlier steps). A new key goes to the server with the fewest keys (load balanced across
trees). A request that fails with an outage (no connection, timeout, 5xx / 429 after the
server's own retries) marks the server down, moves every key on it to the others as they next
ask, and is sent again there, so no request is lost; a bad request (4xx) fails as it would with
one server. A down server takes new keys again after `cooldown_s`. Without a key (a batched
`sample` from a caller that names no tree) the first two prompt messages are the key: the prefix
a server can reuse.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Hashable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Self

from engine.llm.base import Completion, GeneratorError, Prompt, SampleRequest, gather
from engine.llm.loop_http import Driver
from engine.llm.openai_http import OpenAIGenerator, _init_options, is_outage, parse_spec, spec_query

COOLDOWN_S = 30.0


def prefix_key(request: SampleRequest) -> int:
    """A stable key for a request that names no tree: its first two messages."""
    head = "\x00".join(str(m.get("content", "")) for m in request.prompt[:2])
    return zlib.crc32(head.encode())


class RoutedGenerator:
    """See the module docstring. `routes[key]` lists the servers (indices) that answered the key,
    in order: one entry while affinity held, one more per move."""

    name: str

    def __init__(self, servers: Sequence[OpenAIGenerator], name: str | None = None,
                 cooldown_s: float = COOLDOWN_S) -> None:
        if not servers:
            raise ValueError("RoutedGenerator needs at least one server")
        self.servers = list(servers)
        self.name = name or "openai:" + ",".join(s.base_url for s in self.servers) + f"#{self.servers[0].model}"
        self.cooldown_s = cooldown_s
        self._down_at: list[float | None] = [None] * len(self.servers)
        self._assigned: dict[Hashable, int] = {}
        self._keys = [0] * len(self.servers)
        self._lock = threading.Lock()
        self.routes: dict[Hashable, list[int]] = {}
        self.moves = 0
        self.outages = 0

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> RoutedGenerator:
        urls, model, options = parse_spec(spec)
        servers = [OpenAIGenerator(url, model, **_init_options(options), **kwargs) for url in urls]
        name = "openai:" + ",".join(s.base_url for s in servers) + f"#{model}" + spec_query(options)
        return cls(servers, name=name)

    def close(self) -> None:
        for s in self.servers:
            s.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- routing

    def _up(self, i: int, now: float) -> bool:
        down = self._down_at[i]
        return down is None or now - down >= self.cooldown_s

    def _route(self, key: Hashable) -> int:
        with self._lock:
            now = time.monotonic()
            i = self._assigned.get(key)
            if i is not None and self._up(i, now):
                return i
            up = [j for j in range(len(self.servers)) if self._up(j, now)]
            if not up:  # every server is down: try the one that failed longest ago
                up = [min(range(len(self.servers)), key=lambda j: self._down_at[j] or 0.0)]
            j = min(up, key=lambda j: (self._keys[j], j))
            if i is not None:
                self._keys[i] -= 1
                self.moves += 1
            self._assigned[key] = j
            self._keys[j] += 1
            return j

    def _failed(self, i: int) -> None:
        with self._lock:
            if self._down_at[i] is None or self._up(i, time.monotonic()):
                self.outages += 1
            self._down_at[i] = time.monotonic()

    def _answered(self, key: Hashable, i: int) -> None:
        with self._lock:  # a down server stays down for cooldown_s (a late answer does not revive it)
            route = self.routes.setdefault(key, [])
            if not route or route[-1] != i:
                route.append(i)

    # ---------------------------------------------------------------- Generator

    def submit(self, request: SampleRequest, affinity: Hashable | None = None) -> Future[list[Completion]]:
        """Send `request` to its key's server; on an outage, to another (each server once at most)."""
        key = affinity if affinity is not None else prefix_key(request)
        out: Future[list[Completion]] = Future()
        out.set_running_or_notify_cancel()
        tried: set[int] = set()

        def attempt() -> None:
            i = self._route(key)
            tried.add(i)
            self.servers[i].submit(request, key).add_done_callback(lambda f: landed(f, i))

        def landed(fut: Future[list[Completion]], i: int) -> None:
            exc = fut.exception()
            if exc is None:
                self._answered(key, i)
                out.set_result(fut.result())
                return
            if is_outage(exc):
                self._failed(i)
                if len(tried) < len(self.servers):
                    try:
                        attempt()
                    except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                        out.set_exception(e)
                    return
                exc = GeneratorError(f"every server of {self.name} failed; the last: {exc}")
            out.set_exception(exc)

        attempt()
        return out

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        return gather([self.submit(r) for r in requests])

    @contextlib.contextmanager
    def driven(self) -> Iterator[Driver | None]:
        """`SupportsDriven`: every server's client on one event loop the calling thread drives; None where
        a server's client has no event loop (https, a proxy, client=threads) or this thread cannot drive."""
        if any(s._loop_http is None for s in self.servers):
            yield None
            return
        with contextlib.ExitStack() as stack:
            driver = stack.enter_context(self.servers[0].driven())
            for server in self.servers[1:] if driver is not None else ():
                if stack.enter_context(server.driven(driver)) is None:  # drives this one already: all or none
                    raise RuntimeError(f"{self.name}: server {server.base_url} is driven on this thread already")
            yield driver

    def logprobs(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float | None]:
        """Scored by the first server that answers (scoring has no tree to keep together)."""
        last: BaseException | None = None
        for s in self.servers:
            try:
                return s.logprobs(prompts, completions)
            except GeneratorError as e:
                if not is_outage(e):
                    raise
                last = e
        raise GeneratorError(f"every server of {self.name} failed; the last: {last}")
