"""An OpenAI-compatible completion reply, read into `Completion`s: the typed fast path and the generic one.

WHY a typed path: a reply with log-probs carries one JSON object per generated token (vLLM's chat entries
hold `token`, `logprob`, `bytes` and `top_logprobs`), and building a Python dict for each of them, after
`engine.safejson`'s size, depth and digit scans, was the largest single cost of a search's driver at
hundreds of requests in flight (docs/experiments.md). `decode_choices` reads the reply with msgspec into
the few fields used (each choice's index, text, finish reason and token log-probs; the usage count), so
nothing else is materialised and the result's depth is fixed by the schema. It is exact or it declines:
any reply it cannot read as well-typed JSON (bad UTF-8, a lone surrogate, NaN, a field of another type, a
missing `choices` list, too large) returns None, and the caller reads it with `safejson.loads` +
`parse_choices`, which accept or refuse it as before — so both paths give the same completions for every
reply the typed one takes (tests/test_openai_reply.py), and every refusal keeps its one-line message.
Fields it does not read are skipped unchecked: a reply whose only fault lies there (bad UTF-8, nesting
past safejson's depth, a long run of digits) is read as if that field were absent, where the generic
read refuses the whole reply.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Literal

from engine import safejson
from engine.llm.base import Completion, GeneratorError

try:
    import msgspec
except ImportError:  # a GPU machine's bare python: the generic path alone, same completions
    msgspec = None  # type: ignore[assignment]

Api = Literal["chat", "completions"]
_DETAIL_CHARS = 300


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` up to its first stop string (OpenAI semantics: the stop string excluded), and whether it was cut."""
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def _number(v: object) -> bool:
    """A JSON number a float holds: not a bool (JSON true is no log-prob), not an integer past float's range."""
    if isinstance(v, float):
        return True
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= sys.float_info.max


def _completion(text: str, token_lps: list | None, finish_reason: Any, n_choices: int, usage_tokens: Any,
                stop: Sequence[str]) -> Completion:
    """One choice's completion from its read fields (both paths end here)."""
    if not isinstance(token_lps, list) or None in token_lps:  # C-level scan: ~200 per reply
        token_lps = None
    text, cut = cut_at_stop(text, stop)
    finish = "length" if finish_reason == "length" and not cut else "stop"
    if token_lps is not None:
        n_tokens = len(token_lps)
    else:  # usage sums over choices: it counts one completion's tokens only when alone
        n_tokens = usage_tokens if n_choices == 1 and isinstance(usage_tokens, int) and not isinstance(
            usage_tokens, bool) else 0
    if cut:
        token_lps = None
    floats = tuple(map(float, token_lps)) if token_lps is not None else None
    return Completion(
        text=text,
        logprob=float(sum(floats)) if floats is not None else None,
        token_logprobs=floats,
        n_tokens=n_tokens,
        finish_reason=finish,
    )


def parse_choices(body: dict[str, Any], api: Api, stop: Sequence[str]) -> list[Completion]:
    """Completions from one chat / completions response body (any parsed JSON object), in `index` order."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise GeneratorError(f"malformed response: no 'choices' list of objects in {str(body)[:_DETAIL_CHARS]}")
    usage = body.get("usage")
    usage_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    indices = [c.get("index") for c in choices]
    for i in indices:
        if i is not None and (not isinstance(i, int) or isinstance(i, bool)):
            raise GeneratorError(f"malformed response: a choice's index is {str(i)[:40]!r}, not a whole number")
    out = []
    for j in sorted(range(len(choices)), key=lambda j: indices[j] or 0):  # stable: ties keep their order
        choice = choices[j]
        lp = choice.get("logprobs")
        if api == "chat":
            message = choice.get("message")
            text = (message.get("content") if isinstance(message, dict) else None) or ""
            entries = lp.get("content") if isinstance(lp, dict) else None
            token_lps = ([e.get("logprob") if isinstance(e, dict) else None for e in entries]
                         if isinstance(entries, list) else None)
        else:
            text = choice.get("text") or ""
            token_lps = lp.get("token_logprobs") if isinstance(lp, dict) else None
        if not isinstance(text, str):
            raise GeneratorError(f"malformed response: a choice's text is {type(text).__name__}, not a string")
        if isinstance(token_lps, list) and not all(v is None or _number(v) for v in token_lps):
            token_lps = None  # a log-prob that is not a number: none for this choice, never a made-up one
        out.append(_completion(text, token_lps, choice.get("finish_reason"), len(choices), usage_tokens, stop))
    return out


def echo_logprob(body: dict[str, Any], n_prompt: int, n_completion: int) -> float | None:
    """Sum of the log-probs of tokens [n_prompt, n_prompt + n_completion) of an echoed prompt,
    or None when the response carries no (or too few) prompt log-probs."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        return None
    lp = choices[0].get("logprobs") if choices and isinstance(choices[0], dict) else None
    values = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if not isinstance(values, list) or len(values) < n_prompt + n_completion:
        return None
    part = values[n_prompt : n_prompt + n_completion]
    if not all(_number(v) for v in part):
        return None
    return float(sum(part))


if msgspec is not None:

    class _Entry(msgspec.Struct, gc=False):
        logprob: float | None = None

    class _ChatLogprobs(msgspec.Struct, gc=False):
        content: list[_Entry] | None = None

    class _TextLogprobs(msgspec.Struct, gc=False):
        token_logprobs: list[float | None] | None = None

    class _Message(msgspec.Struct, gc=False):
        content: str | None = None

    class _ChatChoice(msgspec.Struct, gc=False):
        index: int = 0
        finish_reason: str | None = None
        message: _Message | None = None
        logprobs: _ChatLogprobs | None = None

    class _TextChoice(msgspec.Struct, gc=False):
        index: int = 0
        finish_reason: str | None = None
        text: str | None = None
        logprobs: _TextLogprobs | None = None

    class _Usage(msgspec.Struct, gc=False):
        completion_tokens: int | None = None

    class _ChatReply(msgspec.Struct, gc=False):
        choices: list[_ChatChoice] | None = None
        usage: _Usage | None = None

    class _TextReply(msgspec.Struct, gc=False):
        choices: list[_TextChoice] | None = None
        usage: _Usage | None = None

    _DECODERS: dict[str, Any] = {"chat": msgspec.json.Decoder(_ChatReply), "completions": msgspec.json.Decoder(_TextReply)}


def decode_choices(content: bytes, api: Api, stop: Sequence[str]) -> list[Completion] | None:
    """The completions of a good answer's raw body, read with the typed schema; None when this path cannot
    read it exactly (no msgspec, or anything but well-typed JSON in the fields used): then the caller parses
    it with `safejson.loads` + `parse_choices`, which give the same completions or a one-line refusal (fields
    this path does not read are skipped unchecked: see the module docstring)."""
    if msgspec is None or len(content) > safejson.MAX_CHARS:
        return None
    try:
        reply = _DECODERS[api].decode(content)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if reply.choices is None:
        return None
    usage_tokens = reply.usage.completion_tokens if reply.usage is not None else None
    n = len(reply.choices)
    out = []
    for c in sorted(reply.choices, key=lambda c: c.index):
        if api == "chat":
            text = (c.message.content if c.message is not None else None) or ""
            entries = c.logprobs.content if c.logprobs is not None else None
            token_lps = [e.logprob for e in entries] if entries is not None else None
        else:
            text = c.text or ""
            token_lps = c.logprobs.token_logprobs if c.logprobs is not None else None
        out.append(_completion(text, token_lps, c.finish_reason, n, usage_tokens, stop))
    return out
