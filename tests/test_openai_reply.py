"""The typed reply read (`openai_reply.decode_choices`) against the generic one (`safejson.loads` +
`parse_choices`): the same completions for every reply it takes, a decline (None) for every reply it
cannot read exactly, and the generic read's one-line refusals for malformed choices."""

from __future__ import annotations

import json
import random

import pytest
from canned_http import canned_server
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import safejson
from engine.llm import openai_http
from engine.llm.base import GeneratorError, SampleRequest, SamplingParams
from engine.llm.openai_http import OpenAIGenerator
from engine.llm.openai_reply import decode_choices, echo_logprob, parse_choices

pytest.importorskip("msgspec")

PROMPT = [{"role": "user", "content": "craft a stick"}]


def generic(body: bytes, api: str, stop: tuple[str, ...] = ()) -> list:
    return parse_choices(safejson.loads(body), api, stop)  # type: ignore[arg-type]


def vllm_chat(texts: list[str], tokens: int, order: list[int] | None = None) -> dict:
    """A vLLM-shaped chat answer: every per-token entry with token, logprob, bytes and top_logprobs."""
    choices = [{"index": i, "finish_reason": "length" if i % 2 else "stop",
                "message": {"role": "assistant", "content": t, "tool_calls": []},
                "logprobs": {"content": [{"token": "ab", "logprob": -0.25 * (j + 1), "bytes": [97, 98],
                                          "top_logprobs": [{"token": "x", "logprob": -3.0, "bytes": [120]}]}
                                         for j in range(tokens)]}}
               for i, t in enumerate(texts)]
    if order:
        choices = [choices[i] for i in order]
    return {"id": "c", "object": "chat.completion", "model": "m", "choices": choices,
            "usage": {"prompt_tokens": 9, "completion_tokens": tokens * len(texts), "total_tokens": 99}}


CHAT_BODIES = [
    vllm_chat(["ACTION: get 1 stick", "ACTION: craft 4 oak planks STOP more"], 5, order=[1, 0]),
    vllm_chat(["only"], 3),
    {"choices": [{"message": {"content": "x"}, "logprobs": {"content": [{"logprob": -1}, {"logprob": None}]}}],
     "usage": {"completion_tokens": 2}},  # an entry without a log-prob: none for the choice; usage counts
    {"choices": [{"message": None, "logprobs": None, "finish_reason": None}]},
    {"choices": [{"message": {"content": None}}, {"index": 1}], "usage": None},
    {"choices": []},
    {"choices": [{"index": 3, "message": {"content": "é ü 😀"}, "logprobs": {"content": []}}]},
]
TEXT_BODIES = [
    {"choices": [{"index": 1, "text": "b", "finish_reason": "length", "logprobs": {"token_logprobs": [-1.0, -2],
                                                                                   "tokens": ["b", "c"]}},
                 {"index": 0, "text": "a STOP b", "finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}]},
    {"choices": [{"text": "t", "logprobs": {"token_logprobs": [None, -0.5]}}], "usage": {"completion_tokens": 7}},
    {"choices": [{"text": None}]},
]


@pytest.mark.parametrize(("api", "body"), [("chat", b) for b in CHAT_BODIES] + [("completions", b) for b in TEXT_BODIES])
def test_typed_read_gives_the_generic_reads_completions(api: str, body: dict) -> None:
    raw = json.dumps(body).encode()
    typed = decode_choices(raw, api, ("STOP",))  # type: ignore[arg-type]
    assert typed is not None
    assert typed == generic(raw, api, ("STOP",))


def test_typed_read_of_a_vllm_answer_keeps_index_order_logprobs_and_the_cut() -> None:
    raw = json.dumps(vllm_chat(["first", "second STOP tail"], 4, order=[1, 0])).encode()
    a, b = decode_choices(raw, "chat", ("STOP",))  # type: ignore[misc]
    assert (a.text, a.n_tokens, a.finish_reason) == ("first", 4, "stop")
    assert a.token_logprobs == (-0.25, -0.5, -0.75, -1.0) and a.logprob == -2.5
    assert (b.text, b.logprob, b.token_logprobs, b.finish_reason) == ("second ", None, None, "stop")  # cut: no lps


@pytest.mark.parametrize("raw", [
    b'{"choices": [{"message": {"content": "\\ud800"}}]}',  # a lone surrogate (breaks every later UTF-8 write)
    b'{"choices": [{"message": {"content": "\xff"}}]}',  # not UTF-8
    b'{"choices": [{"logprobs": {"content": [{"logprob": NaN}]}}]}',  # the json module's NaN
    b'{"choices": [{"index": "0"}]}',  # a field of another type
    b'{"choices": [{"logprobs": {"content": [{"logprob": "-1.5"}]}}]}',
    b'{"choices": [{"index": true}]}',
    b'{"choices": [{"message": {"content": 5}}]}',
    b'{"choices": "none"}',
    b'{"object": "error"}',  # no choices list: the generic read says why
    b'[1, 2]',
    b'{"choices": []} trailing',
    b'\xef\xbb\xbf{"choices": []}',  # a BOM
    b'{"choices": [], "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # deeper than anyone answers
])
def test_typed_read_declines_what_it_cannot_read_exactly(raw: bytes) -> None:
    assert decode_choices(raw, "chat", ()) is None


def test_typed_read_declines_an_answer_over_the_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = json.dumps(vllm_chat(["x"], 50)).encode()
    monkeypatch.setattr(safejson, "MAX_CHARS", len(raw) - 1)
    assert decode_choices(raw, "chat", ()) is None
    with pytest.raises(ValueError, match="longer than"):  # and the generic read says why
        safejson.loads(raw, max_chars=len(raw) - 1)


def test_generic_read_refuses_malformed_choices_in_one_line() -> None:
    with pytest.raises(GeneratorError, match="no 'choices' list of objects"):
        parse_choices({"choices": [1]}, "chat", ())
    with pytest.raises(GeneratorError, match="text is int, not a string"):
        parse_choices({"choices": [{"message": {"content": 5}}]}, "chat", ())
    # a log-prob that is not a number, an entry that is not an object: no log-probs, never a made-up number
    (c,) = parse_choices({"choices": [{"message": {"content": "x"}, "logprobs": {"content": [{"logprob": "-1.5"}]}}]},
                         "chat", ())
    assert c.logprob is None and c.text == "x"
    (c,) = parse_choices({"choices": [{"message": "x", "logprobs": {"content": [1]}}], "usage": [3]}, "chat", ())
    assert (c.text, c.logprob, c.n_tokens) == ("", None, 0)
    # numbers a float cannot hold, and JSON true, are no log-probs or token counts either (no OverflowError)
    huge = safejson.loads('{"choices": [{"message": {"content": "x"}, "logprobs": {"content": [{"logprob": -1'
                          + "0" * 400 + '}]}}]}')
    assert parse_choices(huge, "chat", ())[0].logprob is None
    (c,) = parse_choices({"choices": [{"text": "x", "logprobs": {"token_logprobs": [True]}}],
                          "usage": {"completion_tokens": True}}, "completions", ())
    assert (c.logprob, c.n_tokens) == (None, 0)
    # choices in index order; an index that is not a whole number is refused in one line, not a TypeError
    two = [{"index": 1, "message": {"content": "b"}}, {"message": {"content": "a"}}]
    assert [c.text for c in parse_choices({"choices": two}, "chat", ())] == ["a", "b"]
    for bad in ("x", True, 1.5):
        with pytest.raises(GeneratorError, match="index is .*, not a whole number"):
            parse_choices({"choices": [{"index": bad, "message": {"content": "a"}}, two[0]]}, "chat", ())


def test_echoed_prompt_logprobs_read_from_any_answer_without_an_error() -> None:
    good = {"choices": [{"logprobs": {"token_logprobs": [None, -1.0, -0.5, -0.25]}}]}
    assert echo_logprob(good, 2, 2) == -0.75
    for body in ({"choices": {"a": 1}}, {"choices": 5}, {},
                 {"choices": [{"logprobs": {"token_logprobs": [None, -1.0, -10**400]}}]},
                 {"choices": [{"logprobs": {"token_logprobs": [None, True, -1.0]}}]}):
        assert echo_logprob(body, 1, 2) is None


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-5, 0, allow_nan=False), st.text(max_size=3))
_entry = st.one_of(st.fixed_dictionaries({}, optional={"logprob": _scalar, "token": st.text(max_size=2)}), _scalar)
_choice = st.fixed_dictionaries({}, optional={
    "index": st.one_of(st.integers(0, 5), _scalar),
    "finish_reason": st.one_of(st.sampled_from(["stop", "length"]), _scalar),
    "message": st.one_of(st.fixed_dictionaries({}, optional={"content": st.one_of(st.text(max_size=12), _scalar)}), _scalar),
    "text": st.one_of(st.text(max_size=12), _scalar),
    "logprobs": st.one_of(st.fixed_dictionaries({}, optional={"content": st.one_of(st.lists(_entry, max_size=4), _scalar),
                                                              "token_logprobs": st.one_of(st.lists(_scalar, max_size=4), _scalar)}),
                          _scalar),
})
_body = st.fixed_dictionaries({}, optional={"choices": st.one_of(st.lists(_choice, max_size=3), _scalar),
                                            "usage": st.one_of(st.fixed_dictionaries({}, optional={"completion_tokens": _scalar}), _scalar)})


_lp = st.one_of(st.none(), st.integers(-9, 0), st.floats(-9, 0, allow_nan=False))
_typed_choice = st.fixed_dictionaries({}, optional={
    "index": st.integers(0, 2**70),
    "finish_reason": st.one_of(st.none(), st.sampled_from(["stop", "length", "eos"])),
    "message": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"content": st.one_of(st.none(), st.text(max_size=12)),
                                                                        "role": st.text(max_size=3)})),
    "text": st.one_of(st.none(), st.text(max_size=12)),
    "logprobs": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "content": st.one_of(st.none(), st.lists(st.fixed_dictionaries({}, optional={"logprob": _lp, "bytes": st.lists(st.integers(0, 255))}),
                                                 max_size=5)),
        "token_logprobs": st.one_of(st.none(), st.lists(_lp, max_size=5))})),
})
_typed_body = st.fixed_dictionaries({"choices": st.lists(_typed_choice, max_size=3)}, optional={
    "usage": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"completion_tokens": st.one_of(st.none(), st.integers(0, 99))}))})


@settings(max_examples=300, deadline=None)
@given(body=_typed_body, api=st.sampled_from(["chat", "completions"]), stop=st.sampled_from([(), ("b",), ("ST", "a")]))
def test_every_well_typed_answer_reads_the_same_either_way(body: dict, api: str, stop: tuple) -> None:
    raw = json.dumps(body, ensure_ascii=False).encode()
    typed = decode_choices(raw, api, stop)  # type: ignore[arg-type]
    assert typed is not None
    assert typed == generic(raw, api, stop)


@settings(max_examples=300, deadline=None)
@given(body=_body, api=st.sampled_from(["chat", "completions"]), stop=st.sampled_from([(), ("b",), ("ST", "a")]))
def test_every_answer_the_typed_read_takes_reads_the_same_generically(body: dict, api: str, stop: tuple) -> None:
    raw = json.dumps(body).encode()
    typed = decode_choices(raw, api, stop)  # type: ignore[arg-type]
    if typed is not None:
        assert typed == generic(raw, api, stop)


def test_the_client_returns_the_same_completions_either_read(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    answers = [vllm_chat([f"ACTION: get {rng.randint(1, 9)} stick" for _ in range(3)], 6, order=[2, 0, 1]),
               {"choices": [{"message": {"content": "x"}, "logprobs": {"content": [{"logprob": float("nan")}]}}]}]

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        return 200, json.dumps(answers[json.loads(body)["seed"]]).encode()  # NaN: written as the json module does

    got = {}
    with canned_server(answer) as base:
        for typed in (True, False):
            monkeypatch.setattr(openai_http, "TYPED_REPLIES", typed)
            with OpenAIGenerator(f"{base}/v1", "m", retries=0, timeout_s=10) as gen:
                got[typed] = [gen.sample([SampleRequest(PROMPT, n=3 - 2 * s, params=SamplingParams(seed=s))])[0]
                              for s in (0, 1)]
    assert repr(got[True]) == repr(got[False])  # repr: the NaN answer's log-prob compares unequal to itself
    assert [c.text for c in got[True][0]] == [c["message"]["content"] for c in answers[0]["choices"][1:] + answers[0]["choices"][:1]]
