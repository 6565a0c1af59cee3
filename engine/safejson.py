"""Bounded JSON parsing for untrusted text: model answers and server replies.

WHY: the `json` module recurses once per nesting level, so `[[[[...` a few thousand levels deep
raises RecursionError, and a 5000-digit number raises a plain ValueError; callers that catch only
`JSONDecodeError` let both through as a traceback that ends the run. A reply can also be large
enough to cost real time before any check runs, or hold a lone surrogate (`"\\ud800"`) that parses
fine and then breaks every later UTF-8 write (files, SQLite). Here size and depth are checked
BEFORE the parser runs (a linear scan that stops at the first level too deep), and every problem is
a `JSONLimitError`, a `json.JSONDecodeError` subclass, so existing `except json.JSONDecodeError` /
`except ValueError` handlers treat it as one more malformed answer.

Parsing runs on orjson where it is installed (a core dependency; 1.9x the json-module path on a reply
with log-probs, docs/decisions.md): a document it refuses (NaN, a BOM, UTF-16, a lone surrogate,
extra data) or one with a 19-digit run (orjson reads an integer past 64 bits as a float, `json` as
an int) goes through the `json` module, so every value and every error is the `json` module's.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

try:
    import orjson
except ImportError:  # a GPU machine's bare python: the json module alone, same values and errors
    orjson = None  # type: ignore[assignment]

MAX_DEPTH = 64  # OpenAI / AgentGym replies nest < 10 levels, refinement scripts < 6
MAX_CHARS = 16 * 2**20  # a reply with many long completions and logprobs stays far below this

_SPECIAL = re.compile(r'[\[\]{}"\\]')
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
# `_within_depth`, on the UTF-8 bytes: every byte but brackets and quotes deleted, `{}` read as `[]`
# (a UTF-8 multi-byte character never holds an ASCII byte); then a string is a quote, the brackets
# it held, and its closing quote (or the end: never a failed match, so linear).
_NOT_STRUCTURAL = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_CURLY_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
_BRACKETED_STRINGS = re.compile(rb'"[^"]*"?')
_STEP = {ord("["): 1, ord("]"): -1}
_DECODER = json.JSONDecoder()
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")  # a 19-digit run: b"0" * 19 after translate
_LONG_RUN = b"0" * 19


class JSONLimitError(json.JSONDecodeError):
    """Untrusted JSON past a limit (size, depth, digits) or not valid text."""


def check_depth(text: str, pos: int = 0, max_depth: int = MAX_DEPTH) -> None:
    """Raise JSONLimitError when the JSON value starting at `pos` nests deeper than `max_depth`.
    Scans only that value (up to its closing bracket); a scalar at `pos` has no depth to check."""
    if pos >= len(text) or text[pos] not in "[{":
        return
    depth, in_string, skip = 0, False, -1
    for m in _SPECIAL.finditer(text, pos):
        i, c = m.start(), m.group()
        if i == skip:  # the character after a backslash inside a string
            continue
        if in_string:
            if c == "\\":
                skip = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > max_depth:
                raise JSONLimitError(f"nesting deeper than {max_depth} levels", text, i)
        elif c in "]}":
            depth -= 1
            if depth <= 0:
                return


def _within_depth(text: str | bytes, max_depth: int) -> bool:
    """True when no point of the whole of `text` lies more than `max_depth` brackets deep outside
    strings: the nesting the parser meets. Linear and C-level (`check_depth` walks every bracket and
    quote in Python: ~2 ms for a reply with a few hundred log-probs; a regex over every character
    ~0.2 ms for 80 vLLM log-probs, this ~0.03 ms); False: `check_depth` decides. Escaped backslashes,
    then escaped quotes, are deleted first, so every quote left opens or closes a string (exact for
    any text the parser accepts); then bytes.replace passes strip matched innermost pairs, one nesting
    level per pass, and only text that does not reduce to nothing is summed bracket by bracket."""
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = raw.translate(_CURLY_AS_SQUARE, _NOT_STRUCTURAL).replace(b'""', b"")  # (close, open): one string
    if b'"' in brackets:
        brackets = _BRACKETED_STRINGS.sub(b"", brackets)
    left = brackets
    for _ in range(max_depth):
        if not left:
            return True
        inner_removed = left.replace(b"[]", b"")
        if len(inner_removed) == len(left):
            break
        left = inner_removed
    if not left:
        return True
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0) <= max_depth


def _check_text(value: Any, doc: str) -> None:
    """Every string (keys included) must be valid Unicode: no lone surrogates. Iterative: the
    depth is already bounded, but a stack is cheaper than recursion and cannot overflow."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            items = [v]
        elif isinstance(v, dict):
            items = list(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
            continue
        else:
            continue
        for s in items:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise JSONLimitError("a string holds a lone surrogate (not valid text)", doc, 0) from None


def raw_decode(text: str, pos: int = 0, max_depth: int = MAX_DEPTH) -> tuple[Any, int]:
    """`json.JSONDecoder().raw_decode(text, pos)` with the depth bound and no error other than
    `json.JSONDecodeError` (JSONLimitError for the limits)."""
    check_depth(text, pos, max_depth)
    return _decode(text, pos)


def _decode(text: str, pos: int) -> tuple[Any, int]:
    """`raw_decode` once the depth is checked."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        raise
    except RecursionError:  # only when called from an already deep stack
        raise JSONLimitError("nesting too deep to parse", text, pos) from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise JSONLimitError(str(e).split(";")[0], text, pos) from None
    if _MAYBE_SURROGATE.search(text, pos, end):
        _check_text(value, text)
    return value, end


def loads(data: str | bytes, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` for untrusted replies: at most `max_chars` characters (bytes for bytes input,
    decoded as `json.loads` does), at most `max_depth` levels, valid text only."""
    if len(data) > max_chars:
        raise JSONLimitError(f"reply of {len(data)} characters is longer than {max_chars}", "", 0)
    if orjson is not None:
        raw = bytes(data) if isinstance(data, bytes | bytearray) else data.encode("utf-8", "surrogatepass")
        if _LONG_RUN not in raw.translate(_DIGITS_AS_ZERO) and _within_depth(raw, max_depth):
            try:
                return orjson.loads(raw)  # bytes: a lone surrogate's bytes are not UTF-8, refused
            except orjson.JSONDecodeError:
                pass  # the json module's path below accepts it (NaN) or says why not, as before
    if isinstance(data, bytes | bytearray):
        try:
            data = data.decode(json.detect_encoding(data), "strict")
        except UnicodeDecodeError as e:
            raise JSONLimitError(f"not valid text ({e.reason} at byte {e.start})", "", 0) from None
    text = data.lstrip(" \t\n\r\ufeff")
    if _within_depth(text, max_depth):
        value, end = _decode(text, 0)
    else:
        value, end = raw_decode(text, 0, max_depth)
    if text[end:].strip(" \t\n\r"):
        raise JSONLimitError("extra data after the JSON value", text, end)
    return value


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON for a request body: the bytes of `json.dumps(value, ensure_ascii=False,
    separators=(",", ":"), allow_nan=False).encode()` (what httpx's `json=` sends) up to float spelling
    (`1e16` for `1e+16`), 5x faster on orjson (a 3 KB body). orjson writes NaN as `null` where the json module refuses
    it, so output holding `null` (a None, a NaN, or the word in a string) is encoded again by the json
    module, as are the values orjson refuses (lone surrogates, integers past 64 bits)."""
    if orjson is not None:
        try:
            out = orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
        else:
            if b"null" not in out:
                return out
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
