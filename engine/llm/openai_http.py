"""`OpenAIGenerator`: a `Generator` over any OpenAI-compatible HTTP server.

Targets `vllm serve`, `transformers serve` and hosted APIs, which differ in what they honour:
- `n`: vLLM honours it; `transformers serve` (5.24) and some hosted APIs ignore it and return one
  choice. We ask for `n`, then send further calls for the missing ones (each call returns >= 1
  choice, so a request costs at most n calls). When the request has a seed, call j sends
  `seed + j`: a server that ignores `n` but honours `seed` would otherwise repeat one sample.
- log-probs: asked for (`logprobs: true` / `logprobs: 1`); a server that returns none gives
  `logprob=None`, never a made-up number. vLLM reports RAW model log-probs by default
  (`--logprobs-mode raw_logprobs`); hosted APIs report whatever they report.
- `stop`: OpenAI semantics exclude the stop string; `transformers serve` includes it (and
  matches it across the prompt boundary). We cut the text at the first stop string; if that
  removes text, token log-probs can no longer be aligned with it and become None.

Concurrency: at most `max_concurrency` calls in flight per generator, shared by `sample` (a batch)
and `submit` (one request, a future; search's no-barrier scheduler). On a plain http:// server
(vLLM / SGLang, where hundreds are in flight) every call runs on ONE event-loop thread
(`engine.llm.loop_http`): a request costs a write, a read and the parse, with no thread per
request (a pool thread each cost ~2x the client CPU; docs/decisions.md). On https:// (hosted APIs),
behind a proxy named in the environment, or with `client="threads"`, calls run on a bounded thread
pool with a sync `httpx.Client`, each pool thread keeping its own keep-alive connection
(`engine.llm.thread_transport`); `logprobs()` scores on that pool in every case. Either way the
caller's thread never blocks and no asyncio loop of the caller's is used (search loops, Streamlit
and notebooks may run their own, where `asyncio.run` fails). The limit is a spec setting
(`openai:URL#MODEL?concurrency=64`); its default is fitted to the server kind: 64 for a plain
http:// server (vLLM / SGLang batch continuously, and a low limit leaves them idle), 8 for https://
(hosted APIs rate-limit).

Retries: 429, 5xx, 408, connection errors and timeouts are retried `retries` times with
exponential backoff (`backoff_s * 2**attempt`, jittered); other errors fail at once with a
`GeneratorError` naming the URL and model. The API key is read from `api_key_env` at each call
(so it can be set or rotated after construction) and never stored, logged or put in messages. It
is never sent over plain http to a host that is not loopback (anyone on the way could read it)
unless `allow_http_key=True` (the CLI's `--allow-http-key`, or `ORCHARD_ALLOW_HTTP_KEY=1`).

`logprobs()` scores with the completions API (`echo` + `logprobs`, token-id prompt), which
vLLM supports; servers that do not (transformers serve, most hosted APIs) yield None per item.
It needs a local tokenizer (the `tokenizer_dir`, by default `model` when that is a folder) to
build the same token ids as `HFGenerator`: chat-templated prompt + completion + EOS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import random
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Self

import httpx

from engine import safejson
from engine.llm.base import Completion, GeneratorError, Prompt, PromptTooLong, SampleRequest, gather
from engine.llm.loop_http import Driver, LoopHTTP
from engine.llm.openai_reply import Api, decode_choices, echo_logprob, parse_choices
from engine.llm.thread_transport import ThreadTransport

log = logging.getLogger(__name__)

Reader = Callable[[str, bytes], Any]  # (url, a good answer's body) -> what the call returns
# Completion replies read with the typed schema first (engine/llm/openai_reply.py); False reads every reply
# the generic way (bench/scale.py's `--replies generic` arm: the before of docs/experiments.md 2026-12-07 (later)).
TYPED_REPLIES = True

_RETRY_STATUS = frozenset({408, 429})
_DETAIL_CHARS = 300
SELF_HOSTED_CONCURRENCY = 64  # http:// servers: vLLM / SGLang continuous batching
HOSTED_CONCURRENCY = 8  # https:// APIs: rate limits
CLIENTS = ("auto", "loop", "threads")  # auto: the event loop for http://, the thread pool otherwise


def _client_kind(value: str) -> str:
    if value not in CLIENTS:
        raise ValueError(f"option client={value!r} is not one of {', '.join(CLIENTS)}")
    return value


SPEC_OPTIONS: dict[str, Callable[[str], Any]] = {"concurrency": int, "timeout": float, "retries": int, "client": _client_kind}  # ?key=value


def default_concurrency(base_url: str) -> int:
    """The concurrency limit fitted to the server kind (see the module docstring)."""
    return HOSTED_CONCURRENCY if base_url.startswith("https://") else SELF_HOSTED_CONCURRENCY


def parse_spec(spec: str) -> tuple[list[str], str, dict[str, Any]]:
    """"openai:URL[,URL...]#MODEL[?key=value&...]" -> (urls, model, options); ValueError names the
    part that is wrong."""
    prefix = "openai:"
    rest = spec[len(prefix) :] if spec.startswith(prefix) else ""
    urls, sep, model = rest.partition("#")
    model, _, query = model.partition("?")
    if not sep or not urls or not model:
        raise ValueError(
            f"expected 'openai:BASE_URL#MODEL' (e.g. openai:http://127.0.0.1:8000/v1#m), got {spec!r}"
        )
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, eq, value = item.partition("=")
        if key not in SPEC_OPTIONS or not eq:
            raise ValueError(f"unknown option {item!r} after '?' (known: {', '.join(SPEC_OPTIONS)}=VALUE)")
        try:
            options[key] = SPEC_OPTIONS[key](value)
        except ValueError as exc:
            raise ValueError(str(exc) if key == "client" else f"option {key}={value!r} is not a number") from None
    return [u.strip() for u in urls.split(",") if u.strip()], model, options


def spec_query(options: dict[str, Any]) -> str:
    """The '?key=value' tail that `parse_spec` reads back ('' when there is none)."""
    return "?" + "&".join(f"{k}={v}" for k, v in options.items()) if options else ""


def _is_loopback(host: str) -> bool:
    """localhost or a loopback address (127.0.0.0/8, ::1): traffic that never leaves the machine."""
    if host.lower() in ("localhost", "localhost.") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HTTPStatusError(GeneratorError):
    """A final HTTP error answer; `status` lets callers tell "unsupported" (400/422) from outages."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServerUnavailable(GeneratorError):
    """The server could not be reached or gave no answer (after the retries): an outage, not a bad
    request, so a multi-server client moves the request to another server."""


def is_outage(exc: BaseException) -> bool:
    """True for errors that say the server is down or overloaded rather than the request wrong."""
    if isinstance(exc, ServerUnavailable):
        return True
    return isinstance(exc, HTTPStatusError) and (exc.status >= 500 or exc.status in _RETRY_STATUS)


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


# How servers word "the prompt does not fit" (vLLM, OpenAI, transformers serve, llama.cpp, TGI): a 400 that
# says so is that one request's fault (engine.llm.base.PromptTooLong), not a broken client.
_CONTEXT_WORDS = re.compile(
    r"context length|context window|context_length|max[-_ ]model[-_ ]len|prompt (?:is )?too long|"
    r"prompt has \d+ tokens|too many (?:input )?tokens|exceeds? the (?:model's )?(?:maximum|available) context",
    re.IGNORECASE,
)


def _server_detail(content: bytes, secret: str | None) -> str:
    """The server's own error message (FastAPI `detail`, OpenAI `error.message`), shortened."""
    try:
        body = safejson.loads(content)
    except ValueError:
        body = None
    raw = content.decode("utf-8", "replace")
    if isinstance(body, dict):
        err = body.get("error")
        detail = body.get("detail") or (err.get("message") if isinstance(err, dict) else err)
        text = str(detail) if detail else raw
    else:
        text = raw
    return _redact(text.strip(), secret)[:_DETAIL_CHARS]


class _Submission:
    """One `submit`: its request's HTTP calls (more when a server returns fewer choices than asked) and the
    future they resolve. A class, not closures that call each other: those formed a reference cycle per
    request (with the futures, locks and events they held, ~50 objects) that only the cyclic collector
    freed, and its passes over a search's large heap cost a fifth of the driver's CPU (docs/experiments.md
    2026-12-07 (later))."""

    def __init__(self, gen: OpenAIGenerator, request: SampleRequest, abort: threading.Event,
                 out: Future[list[Completion]]) -> None:
        self.gen, self.request, self.abort, self.out = gen, request, abort, out
        self.lock = threading.RLock()  # a call that is done already runs its callback in the caller
        self.got: list[Completion] = []
        self.asked_in_flight = 0
        self.calls = 0
        self.per_call = 0  # most choices one call has returned so far

    def start(self) -> None:
        with self.lock:
            self.launch([self.request.n])

    def launch(self, sizes: list[int]) -> None:
        gen, calls = self.gen, []
        for n in sizes:  # counted before any can land (a done call's callback runs at once)
            calls.append((n, self.calls))
            self.calls += 1
            self.asked_in_flight += n
        for n, call in calls:
            if gen._loop_http is not None:
                fut = gen._loop_http.run(gen._call_async(self.request, n, call, self.abort))
            else:
                fut = gen._executor().submit(gen._call, self.request, n, call, self.abort)
            fut.add_done_callback(functools.partial(self.landed, n))

    def landed(self, n: int, fut: Future[list[Completion]]) -> None:
        out = self.out
        with self.lock:
            if out.done():
                return
            exc = fut.exception() if not fut.cancelled() else GeneratorError(f"{self.gen.name}: cancelled")
            if exc is not None:
                out.set_exception(exc)
                return
            got = fut.result()[:n]
            self.asked_in_flight -= n
            self.got.extend(got)
            self.per_call = max(self.per_call, len(got))
            missing = self.request.n - len(self.got) - self.asked_in_flight
            sizes = []
            while missing > 0:  # the server returned fewer than asked: ask again
                sizes.append(min(self.per_call, missing))
                missing -= sizes[-1]
            try:
                self.launch(sizes)
            except RuntimeError as e:  # the pool was shut down (generator closed)
                out.set_exception(GeneratorError(f"{self.gen.name}: closed while a request was in flight ({e})"))
                return
            if self.asked_in_flight == 0 and not out.done():
                out.set_result(self.got[: self.request.n])


class OpenAIGenerator:
    """See the module docstring. `tokenizer_dir` (optional) is a local folder with the model's
    tokenizer, needed for `api="completions"` (to render chat prompts) and for `logprobs()`.
    `client` (spec `?client=`): auto (the event loop on plain http, else the thread pool), loop, or
    threads (the thread pool everywhere: the baseline `bench/scale.py --drive --clients` compares)."""

    name: str

    def __init__(
        self,
        base_url: str,
        model: str,
        api: Api = "chat",
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int | None = None,
        timeout_s: float = 60,
        retries: int = 3,
        backoff_s: float = 0.5,
        tokenizer_dir: str | Path | None = None,
        allow_http_key: bool = False,
        client: str = "auto",
    ) -> None:
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', not {api!r}")
        if max_concurrency is None:
            max_concurrency = default_concurrency(base_url)
        if max_concurrency < 1 or retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError("need max_concurrency >= 1, retries >= 0, timeout_s > 0, backoff_s >= 0")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api: Api = api
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.allow_http_key = allow_http_key
        self.name = f"openai:{self.base_url}#{model}"
        self._pool: ThreadPoolExecutor | None = None
        self._urls: dict[str, httpx.URL] = {}  # path -> parsed URL (httpx parses a str on every call)
        self._pool_lock = threading.Lock()
        self._key()  # a key that may not go to this URL is refused now, before any work is done
        if tokenizer_dir is None and Path(model).is_dir():
            tokenizer_dir = model
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        if api == "completions" and self.tokenizer_dir is None:
            raise GeneratorError(
                f"{self.name}: api='completions' sends text prompts, so it needs the model's chat "
                "template: pass tokenizer_dir (a local folder with the tokenizer)"
            )
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        self._echo_supported: bool | None = None
        self._client = _client(timeout_s, max_concurrency)
        # sample / submit on a plain-http server: one event-loop thread instead of the thread pool
        # (`client`: "threads" keeps the pool; "loop" where it cannot serve is refused)
        plain = self.base_url.startswith("http://") and not _env_proxies()
        if _client_kind(client) == "loop" and not plain:
            raise ValueError(f"{self.base_url}: client=loop serves plain http:// without a proxy only")
        self._loop_http = (LoopHTTP(self.base_url, timeout_s, max_concurrency, safejson.MAX_CHARS)
                           if plain and client != "threads" else None)

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> OpenAIGenerator:
        """Build from "openai:BASE_URL#MODEL[?concurrency=N&timeout=S&retries=R]" (the form `name`
        takes); kwargs go to __init__. Several URLs: `engine.llm.routing.RoutedGenerator`."""
        urls, model, options = parse_spec(spec)
        if len(urls) != 1:
            raise ValueError(f"one base URL expected, got {len(urls)} in {spec!r}")
        gen = cls(urls[0], model, **_init_options(options), **kwargs)
        gen.name += spec_query(options)
        return gen

    def __repr__(self) -> str:
        return (
            f"OpenAIGenerator({self.base_url!r}, {self.model!r}, api={self.api!r}, "
            f"api_key_env={self.api_key_env!r})"
        )

    def driven(self, driver: Driver | None = None) -> contextlib.AbstractContextManager[Driver | None]:
        """`SupportsDriven`: inside, this thread's `submit`s run on an event loop the thread drives itself
        (`LoopHTTP.driven`; `driver`: another client's, whose loop this one joins); yields None where this
        client has no event loop (https, a proxy, client=threads)."""
        return self._loop_http.driven(driver) if self._loop_http is not None else contextlib.nullcontext()

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if self._loop_http is not None:
            self._loop_http.close()
        self._client.close()

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="openai-http")
            return self._pool

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- HTTP

    def _key(self) -> str | None:
        """The API key to send, or None; refuses (GeneratorError) a key over plain http to a host
        that is not loopback, unless `allow_http_key`."""
        key = os.environ.get(self.api_key_env) or None
        if key is None or self.allow_http_key:
            return key
        parts = urllib.parse.urlsplit(self.base_url)
        host = parts.hostname or ""
        if parts.scheme == "http" and not _is_loopback(host):
            raise GeneratorError(
                f"{self.base_url}: refusing to send ${self.api_key_env} over plain http to {host!r}, which is "
                f"not loopback (anyone on the way could read it): use https, unset ${self.api_key_env}, or "
                "pass --allow-http-key (ORCHARD_ALLOW_HTTP_KEY=1 for any command) if you mean it"
            )
        return key

    def _post(self, path: str, payload: dict[str, Any], abort: threading.Event, read: Reader | None = None) -> Any:
        """POST with retries from the calling thread (httpx); returns the good answer read by `read` (by
        default its JSON object) or raises GeneratorError (key never shown)."""
        url = f"{self.base_url}{path}"
        target = self._urls.get(path) or self._urls.setdefault(path, httpx.URL(url))  # parsed once
        attempts = self.retries + 1
        for attempt in range(attempts):
            key = self._key()
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            try:
                resp = self._client.post(target, json=payload, headers=headers)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                why = self._unreachable(url, exc, key, attempt)
            else:
                body, why = self._judge(url, resp.status_code, resp.content, key, attempt, read)
                if body is not None:
                    return body
            if abort.wait(self._backoff(url, why, attempt)):
                raise GeneratorError(f"{url}: cancelled (another call of the same batch failed)")
        raise AssertionError("unreachable")

    async def _post_async(self, path: str, payload: dict[str, Any], abort: threading.Event,
                          read: Reader | None = None) -> Any:
        """`_post` on the event-loop client (`engine.llm.loop_http`): the same retries and errors."""
        assert self._loop_http is not None
        url = f"{self.base_url}{path}"
        data = safejson.dumps(payload)  # as httpx sends json=
        for attempt in range(self.retries + 1):
            key = self._key()
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            try:
                answer = await self._loop_http.post(path, data, headers)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                why = self._unreachable(url, exc, key, attempt)
            else:
                body, why = self._judge(url, answer.status, answer.content, key, attempt, read)
                if body is not None:
                    return body
            if await _sleep_unless(abort, self._backoff(url, why, attempt)):
                raise GeneratorError(f"{url}: cancelled (another call of the same batch failed)")
        raise AssertionError("unreachable")

    def _unreachable(self, url: str, exc: Exception, key: str | None, attempt: int) -> str:
        """A timeout or transport error: why to retry, or ServerUnavailable after the last attempt."""
        attempts = self.retries + 1
        if attempt < attempts - 1:
            return "timeout" if isinstance(exc, httpx.TimeoutException) else type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            raise ServerUnavailable(f"{url}: no answer within timeout_s={self.timeout_s} after {attempts} attempts "
                                    f"({type(exc).__name__})") from None
        raise ServerUnavailable(f"cannot reach {url} after {attempts} attempts: "
                                f"{type(exc).__name__}: {_redact(str(exc), key)}") from None

    def _judge(self, url: str, status: int, content: bytes, key: str | None,
               attempt: int, read: Reader | None = None) -> tuple[Any, str]:
        """An answer: (what `read` makes of it, or its JSON object, "") when it is good, (None, why) to retry,
        else the error raised."""
        if status < 400:
            if read is not None:
                return read(url, content), ""
            return self._json_object(url, content), ""
        retryable = status in _RETRY_STATUS or status >= 500
        if not retryable or attempt == self.retries:
            detail = _server_detail(content, key)
            if status in (400, 413, 422) and _CONTEXT_WORDS.search(detail):
                raise PromptTooLong(self._http_message(url, status, detail, attempt + 1))
            raise self._http_error(url, status, detail, attempt + 1)
        return None, f"HTTP {status}"

    @staticmethod
    def _json_object(url: str, content: bytes) -> dict[str, Any]:
        """A good answer's body as a JSON object, or the GeneratorError that says why it is not one."""
        try:
            body = safejson.loads(content)
        except ValueError as e:  # engine.safejson bounds size and depth: the reply is untrusted
            raise GeneratorError(
                f"{url}: answer is not acceptable JSON ({getattr(e, 'msg', e)}): "
                f"{content[:4 * _DETAIL_CHARS].decode('utf-8', 'replace')[:_DETAIL_CHARS]!r}"
            ) from None
        if not isinstance(body, dict):
            raise GeneratorError(f"{url}: unexpected answer {str(body)[:_DETAIL_CHARS]}")
        return body

    def _backoff(self, url: str, why: str, attempt: int) -> float:
        delay = self.backoff_s * 2**attempt * random.uniform(0.5, 1.0)
        log.warning("%s: %s, retry %d/%d in %.2fs", url, why, attempt + 1, self.retries, delay)
        return delay

    def _http_error(self, url: str, status: int, detail: str, attempts: int) -> HTTPStatusError:
        return HTTPStatusError(self._http_message(url, status, detail, attempts), status)

    def _http_message(self, url: str, status: int, detail: str, attempts: int) -> str:
        if status in (401, 403):
            has_key = bool(os.environ.get(self.api_key_env))
            hint = (
                f"the server rejected the API key in ${self.api_key_env}"
                if has_key
                else f"no API key was sent: set ${self.api_key_env}"
            )
            return f"{url}: HTTP {status} unauthorized; {hint}. Server said: {detail}"
        if status == 404:
            return (
                f"{url}: HTTP 404, model {self.model!r} or URL not found (base_url usually ends in /v1). "
                f"Server said: {detail}"
            )
        if status == 429:
            return (
                f"{url}: HTTP 429 rate limited, gave up after {attempts} attempts (lower max_concurrency "
                f"or raise retries/backoff_s). Server said: {detail}"
            )
        if status >= 500:
            return f"{url}: HTTP {status} server error after {attempts} attempts: {detail}"
        return f"{url}: HTTP {status}, request for model {self.model!r} rejected: {detail}"

    # ---------------------------------------------------------------- sampling

    def _tok(self) -> Any:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                assert self.tokenizer_dir is not None
                try:
                    self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir, local_files_only=True)
                except (OSError, ValueError) as exc:
                    raise GeneratorError(
                        f"{self.name}: cannot load a tokenizer from {self.tokenizer_dir}: {exc}"
                    ) from exc
            return self._tokenizer

    def _prompt_text(self, prompt: Prompt) -> str:
        return self._tok().apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)

    def _payload(self, req: SampleRequest, n: int, call: int) -> dict[str, Any]:
        p = req.params
        if p.grammar is not None:
            # Servers differ in how (and whether) they take a regex; one that ignored it would
            # return unconstrained samples under a constrained run's name.
            raise GeneratorError(f"{self.name}: constrained decoding needs an hf: or vllm: model (an HTTP "
                                 "server's structured outputs are not used)")
        payload: dict[str, Any] = {
            "model": self.model,
            "n": n,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
        }
        if p.stop:
            payload["stop"] = list(p.stop)
        if p.seed is not None:
            payload["seed"] = p.seed + call
        if self.api == "chat":
            payload["messages"] = req.prompt
            payload["logprobs"] = True
        else:
            payload["prompt"] = self._prompt_text(req.prompt)
            payload["logprobs"] = 1
        return payload

    def _call(self, req: SampleRequest, n: int, call: int, abort: threading.Event) -> list[Completion]:
        if abort.is_set():  # queued behind the pool when another request of its batch failed
            raise GeneratorError(f"{self.base_url}: cancelled (another call of the same batch failed)")
        path = "/chat/completions" if self.api == "chat" else "/completions"
        return self._post(path, self._payload(req, n, call), abort, self._reader(req))

    async def _call_async(self, req: SampleRequest, n: int, call: int, abort: threading.Event) -> list[Completion]:
        if abort.is_set():
            raise GeneratorError(f"{self.base_url}: cancelled (another call of the same batch failed)")
        path = "/chat/completions" if self.api == "chat" else "/completions"
        return await self._post_async(path, self._payload(req, n, call), abort, self._reader(req))

    def _reader(self, req: SampleRequest) -> Reader:
        """How a good answer to `req` becomes its completions: the typed read (`openai_reply.decode_choices`),
        else the generic one, which gives the same completions or says why the answer is refused."""
        stop = req.params.stop

        def read(url: str, content: bytes) -> list[Completion]:
            got = decode_choices(content, self.api, stop) if TYPED_REPLIES else None
            if got is None:
                got = parse_choices(self._json_object(url, content), self.api, stop)
            if not got:
                raise GeneratorError(f"{url}: no choices in the answer for model {self.model!r}")
            return got

        return read

    def submit(
        self, request: SampleRequest, affinity: Hashable | None = None, abort: threading.Event | None = None
    ) -> Future[list[Completion]]:
        """Start one request on the shared pool; the future resolves to its `request.n` completions.
        A server that returns fewer choices than asked is asked again for the rest (module docstring).
        `affinity` is for multi-server routing; one server ignores it."""
        if request.n < 0:
            raise ValueError("n must be >= 0")
        out: Future[list[Completion]] = Future()
        out.set_running_or_notify_cancel()
        if request.n == 0:
            out.set_result([])
            return out
        _Submission(self, request, abort or threading.Event(), out).start()
        return out

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        """For each request, `request.n` completions, in order (see the module docstring for `n`).
        The first failure cancels the batch's other calls and is raised once they have ended, except a
        prompt the server finds too long: the others are answered and ContextOverflow names it."""
        for i, req in enumerate(requests):
            if req.n < 0:
                raise ValueError(f"request {i}: n must be >= 0")
        abort = threading.Event()
        return gather([self.submit(req, abort=abort) for req in requests], abort)

    # ---------------------------------------------------------------- scoring

    def logprobs(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float | None]:
        """Teacher-forced sum of log-probs of completion + EOS (as HFGenerator), via `echo`;
        None per item when the server cannot echo prompt log-probs or no tokenizer is at hand."""
        if len(prompts) != len(completions):
            raise ValueError("prompts and completions differ in length")
        if not prompts:
            return []
        if self._echo_supported is False:
            return [None] * len(prompts)
        if self.tokenizer_dir is None:
            log.warning("%s: logprobs() needs tokenizer_dir (a local tokenizer); returning None", self.name)
            return [None] * len(prompts)
        tok = self._tok()
        eos = tok.eos_token_id
        items = []
        for prompt, text in zip(prompts, completions, strict=True):
            p = tok(self._prompt_text(prompt), add_special_tokens=False)["input_ids"]
            c = tok(text, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
            items.append((p, c))
        abort = threading.Event()
        futures = [self._executor().submit(self._echo, p, c, abort) for p, c in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            abort.set()
            wait(futures)
            raise

    def _echo(self, p: list[int], c: list[int], abort: threading.Event) -> float | None:
        if self._echo_supported is False:
            return None
        payload = {
            "model": self.model,
            "prompt": p + c,
            "echo": True,
            "logprobs": 1,
            "max_tokens": 1,
            "temperature": 0,
        }
        try:
            body = self._post("/completions", payload, abort)
        except HTTPStatusError as exc:
            # 400/422: the server rejects token-id prompts or `echo`; anything else is a real error.
            if exc.status in (400, 422):
                log.warning(
                    "%s: no prompt log-probs from this server (%s); logprobs() gives None", self.name, exc
                )
                self._echo_supported = False
                return None
            raise
        value = echo_logprob(body, len(p), len(c))
        if value is None:
            log.warning("%s: the server ignores echo/logprobs; logprobs() gives None", self.name)
            self._echo_supported = False
        return value


def _env_proxies() -> bool:
    """True when the environment names an HTTP proxy (HTTP(S)_PROXY, ALL_PROXY, either case), which
    httpx's own transport honours and `ThreadTransport` does not."""
    return any(k != "no" for k in urllib.request.getproxies())


def _client(timeout_s: float, max_concurrency: int) -> httpx.Client:
    """The generator's client: one connection per pool thread (`ThreadTransport`), or, when the
    environment names a proxy, httpx's own pool shared by all threads, as before."""
    if _env_proxies():
        return shared_pool_client(timeout_s, max_concurrency)
    return httpx.Client(timeout=httpx.Timeout(timeout_s), transport=ThreadTransport())


def shared_pool_client(timeout_s: float, max_concurrency: int) -> httpx.Client:
    """httpx's own connection pool, shared by every thread (the client before `ThreadTransport`;
    bench/driver_cpu.py's baseline)."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
    )


def _init_options(options: dict[str, Any]) -> dict[str, Any]:
    """Spec options (`parse_spec`) -> OpenAIGenerator keyword arguments."""
    names = {"concurrency": "max_concurrency", "timeout": "timeout_s", "retries": "retries", "client": "client"}
    return {names[k]: v for k, v in options.items()}


async def _sleep_unless(abort: threading.Event, seconds: float) -> bool:
    """Sleep `seconds` on the event loop unless `abort` is set first (checked every 50 ms); True when set."""
    end = time.monotonic() + seconds
    while not abort.is_set() and (left := end - time.monotonic()) > 0:
        await asyncio.sleep(min(left, 0.05))
    return abort.is_set()
