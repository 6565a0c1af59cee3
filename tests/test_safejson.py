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
