"""engine.safejson: the bounded parser every model answer and server reply goes through."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from fuzz_data import model_outputs

from engine import safejson
from engine.safejson import MAX_DEPTH, JSONLimitError


def test_depth_bound_is_exact_and_ignores_brackets_inside_strings() -> None:
    assert safejson.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(JSONLimitError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        safejson.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    text = json.dumps({"a": "[[[[\\\"{{{{" * 100, "b": [1, {"c": "]]]}}}"}]})
    assert safejson.loads(text) == json.loads(text)
    assert safejson.loads(b'  {"x": [1, 2]}\n') == {"x": [1, 2]}
    with pytest.raises(JSONLimitError, match="extra data"):
        safejson.loads('{"x": 1} {"y": 2}')
    with pytest.raises(JSONLimitError, match="longer than 10"):
        safejson.loads("[" + "1," * 10 + "1]", max_chars=10)


@pytest.mark.parametrize("text", model_outputs())
def test_hostile_text_raises_only_decode_errors(text: str) -> None:
    try:
        value = safejson.loads(text)
    except json.JSONDecodeError as e:
        assert "\n" not in e.msg
    else:
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # what parses is valid, writable text


def _outcome(text: str) -> tuple[str, object]:
    try:
        return "value", safejson.loads(text)
    except json.JSONDecodeError as e:
        return type(e).__name__, e.msg


_TRICKY = [
    "[" * MAX_DEPTH + "]" * MAX_DEPTH, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "[" * 100_000,
    '{"a": "' + "[" * 200 + '"}', '{"a": "\\"' + "[" * 200 + '"}', '["\\\\"' + ", [" * 70 + "]" * 70 + "]",
    '"' + '\\"' * 5000, '["' + '\\"' * 5000 + '"]', '["a" ' + "[" * 80, "]]]", '{"a": [1, {"b": "}}}"}]}',
    '[1, "x\\', '"[[["' + "[" * 70, "[" * 70 + '"' + "]" * 70, '{"x": 1} ' + "[" * 100,
]


@pytest.mark.parametrize("text", [*(p.values[0] for p in model_outputs()), *_TRICKY])
def test_whole_document_depth_check_agrees_with_the_exact_scan(text: str, monkeypatch) -> None:
    """loads' fast whole-document check only skips the bracket-by-bracket scan: the same value or
    the same error either way."""
    fast = _outcome(text)
    monkeypatch.setattr(safejson, "_within_depth", lambda text, max_depth: False)
    assert fast == _outcome(text)


def test_whole_document_depth_check_is_linear_on_unclosed_strings() -> None:
    """An unclosed string ends at the end of the text (no match that fails and restarts at each
    later quote): 200k escaped quotes parse as one failed document, not a quadratic scan."""
    with pytest.raises(json.JSONDecodeError):
        safejson.loads('["' + '\\"' * 200_000)
    assert safejson._within_depth('["' + '\\"' * 200_000, MAX_DEPTH)
    assert not safejson._within_depth("[" * (MAX_DEPTH + 1), MAX_DEPTH)


def test_whole_document_depth_check_is_exact_on_random_valid_documents() -> None:
    """On any document the parser accepts, the fast check says True exactly when the bracket-by-bracket
    scan finds no level past the bound: strings full of brackets, quotes and backslashes, non-ASCII text."""
    rng = random.Random(0)

    def value(depth: int) -> Any:
        r = rng.random()
        if depth > 8 or r < 0.3:
            return rng.choice([1, "s[", '\\"]{', "é}", None, "\\\\", '"', "[[", True])
        if r < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["k", "[", '\\"', "}", '"{']) + str(j): value(depth + 1) for j in range(rng.randint(0, 3))}

    for _ in range(3000):
        text = json.dumps(value(0), ensure_ascii=rng.random() < 0.5)
        bound = rng.randint(0, 9)
        try:
            safejson.check_depth(text, 0, bound)
            within = True
        except safejson.JSONLimitError:
            within = False
        assert safejson._within_depth(text, bound) == within, (text, bound)


def _both_paths(text: str | bytes, monkeypatch) -> tuple[object, object]:
    fast = _outcome(text)
    with monkeypatch.context() as m:
        m.setattr(safejson, "orjson", None)
        slow = _outcome(text)
    return fast, slow


@pytest.mark.skipif(safejson.orjson is None, reason="orjson not installed")
def test_orjson_path_gives_the_json_modules_values_and_errors(monkeypatch) -> None:
    """With orjson installed, every value and every error is the json module's: floats to the last bit,
    integers past 64 bits still ints, NaN accepted, a BOM skipped, lone surrogates and extra data refused."""
    rng = random.Random(1)

    def value(depth: int) -> Any:
        r = rng.random()
        if depth > 6 or r < 0.4:
            return rng.choice([rng.random() * 10 ** rng.randint(-320, 300), -rng.randint(0, 2**64), rng.random(),
                               "é\\u0001[", '"', None, True, 0, -0.0, 2**63 - 1, 10**30, "\U0001f600"])
        if r < 0.7:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {f"k{j}": value(depth + 1) for j in range(rng.randint(0, 4))}

    for _ in range(2000):
        text = json.dumps(value(0), ensure_ascii=rng.random() < 0.5)
        data = text.encode() if rng.random() < 0.5 else text
        fast, slow = _both_paths(data, monkeypatch)
        assert fast == slow and repr(fast) == repr(slow), text
    for text in ["NaN", "[1e400, -Infinity]", "12345678901234567890123", '"\\ud800"', '"\\udc00x"',
                 "\ufeff[1]", '{"x": 1} {"y": 2}', "[1,]", "", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)]:
        for data in (text, text.encode("utf-8"), text.encode("utf-16")):
            fast, slow = _both_paths(data, monkeypatch)
            assert fast == slow, data
    assert _both_paths('["\ud800"]', monkeypatch)[0] == _both_paths('["\ud800"]', monkeypatch)[1]  # a raw lone surrogate
    assert type(safejson.loads(b"[12345678901234567890123]")[0]) is int


def test_dumps_sends_what_the_json_module_sends(monkeypatch) -> None:
    """A request body reads back as the json module's (float spelling aside); NaN is refused, not sent as null;
    what orjson refuses (a lone surrogate, an integer past 64 bits) is the json module's outcome."""
    reference = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    for v in [{"model": "m", "messages": [{"role": "user", "content": "é\n\"null\" [x]"}], "temperature": 0.7, "n": 2},
              {"seed": 2**70, "top_p": 1e16}, {"stop": None}, [0.1, -0.0, 5e-324, "\U0001f600"]]:
        assert json.loads(safejson.dumps(v)) == json.loads(reference(v))
    with pytest.raises(ValueError, match="Out of range float"):
        safejson.dumps({"temperature": float("nan")})
    with pytest.raises(UnicodeEncodeError):
        safejson.dumps({"content": "\ud800"})
    monkeypatch.setattr(safejson, "orjson", None)
    assert safejson.dumps({"a": [1, "é"]}) == reference({"a": [1, "é"]})
