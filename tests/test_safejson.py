"""engine.safejson: the bounded parser every model answer and server reply goes through."""

from __future__ import annotations

import json

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
