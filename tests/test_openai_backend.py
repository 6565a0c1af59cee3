"""OpenAIGenerator against a REAL OpenAI-compatible server (`transformers serve` on a tiny random
model, 127.0.0.1 only), plus a scripted local HTTP server for the paths that are about OUR
client's handling (401/429/5xx/timeouts/partial `n`), which a healthy real server never takes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from canned_http import canned_server
from fuzz_data import model_outputs
from serve_fixture import free_port, record_posts, transformers_serve
from tiny_model_fixture import build_tiny_model

from engine.llm.base import ContextOverflow, GeneratorError, SampleRequest, SamplingParams
from engine.llm.openai_http import OpenAIGenerator, echo_logprob, parse_choices

PROMPT = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "TASK: craft a wooden pickaxe. Step 1: give your composite action."},
]
FAST = {"retries": 2, "backoff_s": 0.01, "timeout_s": 30}


# ---------------------------------------------------------------- the real server


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def server(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    with transformers_serve(tiny_dir, tmp_path_factory.mktemp("serve")) as srv:
        yield srv


@pytest.mark.slow
def test_server_ignores_n_and_client_collects_n(server: SimpleNamespace) -> None:
    posts: list[str] = []
    gen = OpenAIGenerator(server.base_url, server.model, max_concurrency=4, **FAST)
    record_posts(gen, posts)
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=7)
    with gen:
        out = gen.sample(
            [SampleRequest(PROMPT, n=3, params=params), SampleRequest(PROMPT[1:], n=3, params=params)]
        )
    assert [len(c) for c in out] == [3, 3]
    # The server answered one choice per call, so each request took 3 calls (seeds 7, 8, 9).
    assert posts == ["/v1/chat/completions"] * 6
    assert "Ignoring unsupported fields" in server.log.read_text() and "'n'" in server.log.read_text()
    for comps in out:
        assert len({c.text for c in comps}) > 1, "samples should differ"
        for c in comps:
            assert c.logprob is None and c.token_logprobs is None  # the server sends no log-probs
            assert c.finish_reason in ("stop", "length") and 1 <= c.n_tokens <= 8


def test_completions_api_cuts_at_stop_string(server: SimpleNamespace) -> None:
    # Same seed, one call each: the server samples the same tokens until the stop string.
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
    with OpenAIGenerator(server.base_url, server.model, api="completions", **FAST) as gen:
        full = gen.sample([SampleRequest(PROMPT, params=params)])[0][0]
        assert full.finish_reason == "length"
        # An ASCII stop string first seen inside the text (not at its start, where transformers
        # serve would also match it across the prompt boundary).
        k = next(
            i
            for i in range(2, len(full.text) - 1)
            if full.text[i : i + 2].isalpha() and full.text.find(full.text[i : i + 2]) == i
        )
        stop = full.text[k : k + 2]
        cut = gen.sample(
            [SampleRequest(PROMPT, params=SamplingParams(1.0, max_tokens=16, stop=(stop,), seed=3))]
        )
    # transformers serve keeps the stop string in its text; the client removes it (OpenAI semantics).
    assert (cut[0][0].text, cut[0][0].finish_reason) == (full.text[:k], "stop")


def test_logprobs_none_when_server_cannot_echo(server: SimpleNamespace) -> None:
    with OpenAIGenerator(server.base_url, server.model, **FAST) as gen:
        assert gen.logprobs([PROMPT, PROMPT], ["ACTION: get 1 stick", ""]) == [None, None]
        assert gen.logprobs([PROMPT], ["x"]) == [None]  # remembered: no further calls
    with OpenAIGenerator(server.base_url, "served-model-name", **FAST) as gen:  # no local tokenizer
        assert gen.logprobs([PROMPT], ["x"]) == [None]


def test_wrong_model_is_a_clear_error(server: SimpleNamespace) -> None:
    with (
        OpenAIGenerator(server.base_url, "no-such-model", **FAST) as gen,
        pytest.raises(GeneratorError) as err,
    ):
        gen.sample([SampleRequest(PROMPT)])
    msg = str(err.value)
    assert "no-such-model" in msg and f"{server.base_url}/chat/completions" in msg and "HTTP 400" in msg


def test_wrong_url_path_is_a_clear_404(server: SimpleNamespace) -> None:
    base = server.base_url.removesuffix("/v1")
    gen = OpenAIGenerator(base, server.model, **FAST)
    with pytest.raises(GeneratorError, match=r"HTTP 404, model .* or URL not found .*ends in /v1"):
        gen.sample([SampleRequest(PROMPT)])


def test_closed_port_fails_fast_after_bounded_retries() -> None:
    gen = OpenAIGenerator(f"http://127.0.0.1:{free_port()}/v1", "m", retries=2, backoff_s=0.01, timeout_s=2)
    start = time.monotonic()
    with pytest.raises(GeneratorError, match=r"cannot reach .* after 3 attempts: ConnectError"):
        gen.sample([SampleRequest(PROMPT, n=2)])
    assert time.monotonic() - start < 3


# ---------------------------------------------------------------- a scripted server for error paths


def _chat_body(texts: list[str], logprobs: list[list[float]] | None = None) -> dict[str, Any]:
    choices = []
    for i, text in enumerate(texts):
        lp = {"content": [{"token": "t", "logprob": x} for x in logprobs[i]]} if logprobs else None
        message = {"role": "assistant", "content": text}
        choices.append({"index": i, "message": message, "finish_reason": "stop", "logprobs": lp})
    return {"choices": choices, "usage": {"completion_tokens": 3}}


Reply = tuple[int, bytes | dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]], float]


class Scripted:
    """Answers POST number k with script[k] (the last entry repeats): (status, body or
    body-from-payload, delay seconds). Records payloads and headers, and peak concurrency."""

    def __init__(self, script: list[Reply]) -> None:
        self.script, self.payloads, self.headers = script, [], []
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    status, body, delay = outer.script[min(len(outer.payloads), len(outer.script) - 1)]
                    outer.payloads.append(payload)
                    outer.headers.append(dict(self.headers))
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                time.sleep(delay)
                data = body if isinstance(body, bytes) else json.dumps(body(payload) if callable(body) else body).encode()
                with lock:
                    outer.in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client timed out and hung up
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted() -> Iterator[Callable[[list[Reply]], Scripted]]:
    servers: list[Scripted] = []

    def make(script: list[Reply]) -> Scripted:
        servers.append(Scripted(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


SECRET = "sk-test-SECRET-0123456789"


def test_401_names_the_env_var_never_the_key(scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = scripted([(401, {"error": {"message": f"Incorrect API key provided: {SECRET}"}}, 0)])
    monkeypatch.delenv("ORCHARD_TEST_KEY", raising=False)
    gen = OpenAIGenerator(srv.url, "m", api_key_env="ORCHARD_TEST_KEY", **FAST)
    with pytest.raises(GeneratorError, match=r"no API key was sent: set \$ORCHARD_TEST_KEY"):
        gen.sample([SampleRequest(PROMPT)])
    monkeypatch.setenv("ORCHARD_TEST_KEY", SECRET)  # read at call time, after construction
    with pytest.raises(GeneratorError) as err:
        gen.sample([SampleRequest(PROMPT)])
    msg = str(err.value)
    assert "HTTP 401" in msg and "$ORCHARD_TEST_KEY" in msg and "Incorrect API key provided: ***" in msg
    assert SECRET not in msg and SECRET not in repr(gen) and SECRET not in gen.name
    assert srv.headers[-1]["Authorization"] == f"Bearer {SECRET}"
    assert len(srv.payloads) == 2  # 401 is not retried


def test_429_is_retried_then_succeeds(scripted) -> None:
    srv = scripted(
        [(429, {"error": "slow down"}, 0), (429, {"error": "slow down"}, 0), (200, _chat_body(["ok"]), 0)]
    )
    out = OpenAIGenerator(srv.url, "m", **FAST).sample([SampleRequest(PROMPT)])
    assert [c.text for c in out[0]] == ["ok"] and len(srv.payloads) == 3


def test_429_gives_up_after_retries(scripted) -> None:
    srv = scripted([(429, {"error": {"message": "rate limit"}}, 0)])
    with pytest.raises(GeneratorError, match=r"HTTP 429 rate limited, gave up after 3 attempts.*rate limit"):
        OpenAIGenerator(srv.url, "m", **FAST).sample([SampleRequest(PROMPT)])
    assert len(srv.payloads) == 3


def test_5xx_gives_up_after_retries_and_4xx_is_not_retried(scripted) -> None:
    srv = scripted([(503, {"detail": "overloaded"}, 0)])
    with pytest.raises(GeneratorError, match=r"HTTP 503 server error after 3 attempts: overloaded"):
        OpenAIGenerator(srv.url, "m", **FAST).sample([SampleRequest(PROMPT)])
    assert len(srv.payloads) == 3
    srv = scripted([(422, {"detail": "Unexpected fields"}, 0)])
    with pytest.raises(GeneratorError, match=r"HTTP 422, request for model 'm' rejected: Unexpected fields"):
        OpenAIGenerator(srv.url, "m", **FAST).sample([SampleRequest(PROMPT)])
    assert len(srv.payloads) == 1


def test_timeout_is_retried_then_reported(scripted) -> None:
    srv = scripted([(200, _chat_body(["late"]), 1.5)])
    gen = OpenAIGenerator(srv.url, "m", timeout_s=0.2, retries=1, backoff_s=0.01)
    start = time.monotonic()
    with pytest.raises(GeneratorError, match=r"no answer within timeout_s=0.2 after 2 attempts"):
        gen.sample([SampleRequest(PROMPT)])
    assert time.monotonic() - start < 1.4 and len(srv.payloads) == 2


@pytest.mark.parametrize("body", model_outputs())
def test_hostile_reply_bodies_are_one_line_generator_errors(scripted, body: str) -> None:
    """Server replies are untrusted (tests/data/fuzz/model_outputs.json): as a 200 answer or as an
    error body, deep nesting / huge numbers / lone surrogates give a GeneratorError, no traceback."""
    raw = body.encode("utf-8", "surrogatepass")
    for status, match in ((200, r"answer is not acceptable JSON|unexpected answer|malformed response"),
                          (400, r"HTTP 400")):
        srv = scripted([(status, raw, 0)])
        with pytest.raises(GeneratorError, match=match):
            OpenAIGenerator(srv.url, "m", **FAST).sample([SampleRequest(PROMPT)])


def test_partial_n_is_topped_up_with_distinct_seeds(scripted) -> None:
    # A server that caps n at 2 per call (some hosted APIs cap n).
    srv = scripted([(200, lambda p: _chat_body(["s"] * min(p["n"], 2), [[-0.5, -0.25]] * min(p["n"], 2)), 0)])
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=5, stop=("\n",), seed=10)
    out = OpenAIGenerator(srv.url, "m", **FAST).sample([SampleRequest(PROMPT, n=5, params=params)])
    assert len(out[0]) == 5 and all(c.logprob == -0.75 and c.token_logprobs == (-0.5, -0.25) for c in out[0])
    assert sorted(p["n"] for p in srv.payloads) == [1, 2, 5] and sorted(p["seed"] for p in srv.payloads) == [
        10,
        11,
        12,
    ]
    first = srv.payloads[0]
    assert first["messages"] == PROMPT and first["logprobs"] is True and first["stop"] == ["\n"]
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (0.7, 0.9, 5)


def test_concurrency_is_bounded(scripted) -> None:
    srv = scripted([(200, _chat_body(["x"]), 0.1)])
    out = OpenAIGenerator(srv.url, "m", max_concurrency=3, **FAST).sample([SampleRequest(PROMPT)] * 8)
    assert len(out) == 8 and 2 <= srv.max_in_flight <= 3
    assert OpenAIGenerator(srv.url, "m").sample([SampleRequest(PROMPT, n=0)]) == [[]]
    assert len(srv.payloads) == 8


def test_logprobs_via_echo_where_the_server_supports_it(scripted, tiny_dir: Path) -> None:
    # vLLM's answer to a token-id prompt with echo: one log-prob per prompt token (the first is
    # None), then the one generated token.
    def echo(p: dict[str, Any]) -> dict[str, Any]:
        values = [None] + [-0.5] * (len(p["prompt"]) - 1) + [-9.0]
        return {"choices": [{"text": "", "logprobs": {"token_logprobs": values}}]}

    srv = scripted([(200, echo, 0)])
    gen = OpenAIGenerator(srv.url, "served-name", tokenizer_dir=tiny_dir, **FAST)
    scores = gen.logprobs([PROMPT, PROMPT], ["get 1 stick", ""])
    tok = gen._tok()
    n_text = len(tok("get 1 stick", add_special_tokens=False)["input_ids"])
    assert scores == [-0.5 * (n_text + 1), -0.5]  # completion tokens + EOS, as HFGenerator scores
    templated = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    n_prompt = len(tok(templated, add_special_tokens=False)["input_ids"])
    assert sorted(len(p["prompt"]) for p in srv.payloads) == [n_prompt + 1, n_prompt + n_text + 1]
    assert all(p["echo"] is True and p["prompt"][-1] == tok.eos_token_id for p in srv.payloads)


# ---------------------------------------------------------------- pure parts


def test_from_spec_round_trips_and_rejects_bad_specs() -> None:
    gen = OpenAIGenerator.from_spec("openai:http://127.0.0.1:8000/v1/#org/model-7b", max_concurrency=2)
    assert (gen.base_url, gen.model, gen.max_concurrency) == ("http://127.0.0.1:8000/v1", "org/model-7b", 2)
    assert gen.name == "openai:http://127.0.0.1:8000/v1#org/model-7b"
    assert OpenAIGenerator.from_spec(gen.name).name == gen.name
    for bad in ("openai:http://h/v1", "openai:#m", "hf:/models/x", "openai:ftp://h#m"):
        with pytest.raises(ValueError):
            OpenAIGenerator.from_spec(bad)


def test_parse_completions_choices_and_echo_logprobs() -> None:
    body = {
        "choices": [
            {
                "index": 1,
                "text": "b",
                "finish_reason": "length",
                "logprobs": {"token_logprobs": [-1.0, -2.0]},
            },
            {"index": 0, "text": "a STOP b", "finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}},
        ]
    }
    a, b = parse_choices(body, "completions", stop=("STOP",))
    assert (a.text, a.logprob, a.token_logprobs, a.finish_reason) == ("a ", None, None, "stop")
    assert (b.text, b.logprob, b.n_tokens, b.finish_reason) == ("b", -3.0, 2, "length")
    # vLLM's echo answer: one entry per prompt token (the first is None) then the generated one.
    echoed = {"choices": [{"logprobs": {"token_logprobs": [None, -0.5, -1.0, -2.0, -4.0, -9.0]}}]}
    assert echo_logprob(echoed, n_prompt=3, n_completion=2) == -6.0
    assert echo_logprob({"choices": [{"text": "", "logprobs": None}]}, 3, 2) is None
    assert echo_logprob(echoed, n_prompt=4, n_completion=3) is None  # too few entries


def _offline(gen: OpenAIGenerator, seen: list[httpx.Request]) -> OpenAIGenerator:
    """Answer every request in-process (httpx.MockTransport): nothing leaves this machine, whatever host."""
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=_chat_body(["ok"]))

    gen._client.close()
    gen._client = httpx.Client(transport=httpx.MockTransport(answer))
    gen._loop_http = None  # every call through the mock (the event loop would connect to the host)
    return gen


@pytest.mark.parametrize("url,sent", [
    ("http://models.example.com/v1", False),
    ("http://10.1.2.3:8000/v1", False),
    ("http://127.0.0.1.example.com/v1", False),
    ("http://127.0.0.1:8000/v1", True),
    ("http://127.9.9.9:8000/v1", True),
    ("http://localhost:8000/v1", True),
    ("http://[::1]:8000/v1", True),
    ("https://models.example.com/v1", True),
])
def test_a_key_goes_over_plain_http_only_to_loopback(monkeypatch: pytest.MonkeyPatch, url: str, sent: bool) -> None:
    """A key over http to another host is readable by anyone on the way: refused, at construction
    and (for a key set later) before each request, unless allow_http_key."""
    seen: list[httpx.Request] = []
    monkeypatch.delenv("ORCHARD_TEST_KEY", raising=False)
    gen = _offline(OpenAIGenerator(url, "m", api_key_env="ORCHARD_TEST_KEY", **FAST), seen)
    monkeypatch.setenv("ORCHARD_TEST_KEY", SECRET)
    if sent:
        assert gen.sample([SampleRequest(PROMPT)])[0][0].text == "ok"
        assert seen[-1].headers["Authorization"] == f"Bearer {SECRET}"
        return
    with pytest.raises(GeneratorError, match=r"refusing to send \$ORCHARD_TEST_KEY over plain http.*--allow-http-key"):
        gen.sample([SampleRequest(PROMPT)])
    assert seen == []
    with pytest.raises(GeneratorError, match="refusing to send"):
        OpenAIGenerator(url, "m", api_key_env="ORCHARD_TEST_KEY", **FAST)
    allowed = _offline(OpenAIGenerator(url, "m", api_key_env="ORCHARD_TEST_KEY", allow_http_key=True, **FAST), seen)
    assert allowed.sample([SampleRequest(PROMPT)])[0][0].text == "ok"
    assert seen[-1].headers["Authorization"] == f"Bearer {SECRET}" and SECRET not in repr(allowed)


@pytest.mark.parametrize("said", [
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens",  # vLLM / OpenAI
    "The prompt has 4917 tokens, but the model takes at most 4096, prompt and answer (`--max-model-len`).",
    "the request exceeds the available context size, try increasing it",  # llama.cpp
])
def test_a_prompt_too_long_fails_alone_and_the_rest_of_the_batch_is_answered(said: str) -> None:
    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if "LONG" in json.loads(body)["messages"][-1]["content"]:
            return 400, json.dumps({"error": {"message": said}}).encode()
        return 200, json.dumps(_chat_body(["ok"])).encode()

    long = [{"role": "user", "content": "LONG"}]
    with canned_server(answer) as base:
        gen = OpenAIGenerator(f"{base}/v1", "m", **FAST)
        with pytest.raises(ContextOverflow) as err:
            gen.sample([SampleRequest(PROMPT), SampleRequest(long), SampleRequest(PROMPT, n=2)])
        assert list(err.value.overflowed) == [1] and said[:40] in err.value.overflowed[1]
        assert [[c.text for c in o] if o else None for o in err.value.partial] == [["ok"], None, ["ok", "ok"]]
        assert "1 of 3 prompts do not fit" in str(err.value) and "\n" not in str(err.value)


def test_a_400_about_something_else_still_fails_the_batch() -> None:
    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        return 400, json.dumps({"error": {"message": "unknown field 'foo'"}}).encode()

    with canned_server(answer) as base:
        with pytest.raises(GeneratorError, match="unknown field") as err:
            OpenAIGenerator(f"{base}/v1", "m", **FAST).sample([SampleRequest(PROMPT)])
        assert not isinstance(err.value, ContextOverflow)


def test_a_request_leaves_no_reference_cycle_behind() -> None:
    """Each request's futures, calls and completions are freed by reference counting when it ends: a cycle per
    request left them to the cyclic collector, whose passes over a search's heap cost a fifth of its driver."""
    import gc

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        return 200, json.dumps(_chat_body(["a", "b"], [[-1.0, -2.0], [-0.5]])).encode()

    with canned_server(answer) as base, OpenAIGenerator(f"{base}/v1", "m", **FAST) as gen:
        gen.sample([SampleRequest(PROMPT, n=2)])  # the client's one-time set-up first
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                got = gen.sample([SampleRequest(PROMPT, n=2), SampleRequest(PROMPT, n=3)])  # n=3: asked again
                assert [len(c) for c in got] == [2, 3]
            del got
            gc.collect()
            cyclic = [type(o).__name__ for o in gc.garbage
                      if type(o).__name__ in ("_Submission", "_Pending", "Future", "SampleRequest", "Completion")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert cyclic == []
