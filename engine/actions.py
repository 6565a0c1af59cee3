"""Composite actions (Agent Q, arXiv 2408.07199; docs/algorithms.md §1): PLAN / THOUGHT / ACTION /
EXPLANATION / STATUS.

One structured text per agent step. `render` writes the canonical form every prompt and every
training row uses; `parse` reads what a model actually wrote, tolerating case, spacing, markdown
decoration, missing optional parts and extra prose, and returns a `FormatError` (never raises)
for text it cannot read, because an unreadable completion is data, not a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

STATUSES = ("CONTINUE", "SUCCESS", "FAILURE", "ASK_USER")
SECTIONS = ("PLAN", "THOUGHT", "ACTION", "EXPLANATION", "STATUS")
MAX_COMMAND_CHARS = 500

# A section header at the start of a line: optional markdown (#, >, -, bold/italic around the name,
# closed before or after the colon), the name, then a colon. "ACTION (command):" and "Command:" are read as ACTION.
_HEADER = re.compile(
    r"^[ \t>#\-]*(?P<md>\*\*|__|\*|_)?(?P<name>plan|thoughts?|action|command|explanation|status)"
    r"(?:[ \t]*\([^)\n]*\))?(?:(?P=md))?[ \t]*:(?:(?P=md))?[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
_ALIASES = {"thoughts": "THOUGHT", "command": "ACTION"}
_WRAP = re.compile(r"^(`+|\"|')(?P<inner>.*)\1$")


@dataclass(frozen=True)
class CompositeAction:
    """One agent step. `plan` is given on the first step only; the rest on every step."""

    thought: str
    command: str
    explanation: str = ""
    status: str = "CONTINUE"
    plan: str | None = None

    def to_dict(self) -> dict:
        return {"plan": self.plan, "thought": self.thought, "command": self.command,
                "explanation": self.explanation, "status": self.status}

    @classmethod
    def from_dict(cls, d: dict) -> CompositeAction:
        return cls(
            thought=d.get("thought", ""),
            command=d["command"],
            explanation=d.get("explanation", ""),
            status=d.get("status", "CONTINUE"),
            plan=d.get("plan"),
        )


@dataclass(frozen=True)
class FormatError:
    """Why a completion could not be read as a composite action."""

    reason: str

    def __bool__(self) -> bool:  # so `if parsed:` reads naturally
        return False


def render(action: CompositeAction) -> str:
    """Canonical text of a composite action, in the part order of docs/algorithms.md §1 (kept on the
    action: histories re-render the same actions at every step, and a cache keyed by the action would
    hash all five fields on every look-up)."""
    text = action.__dict__.get("_rendered")
    if text is None:
        text = _render(action)
        object.__setattr__(action, "_rendered", text)  # not a field: eq, hash, repr and to_dict ignore it
    return text


def _render(action: CompositeAction) -> str:
    parts = []
    if action.plan:
        parts.append(f"PLAN:\n{action.plan.strip()}")
    parts.append(f"THOUGHT: {action.thought.strip()}")
    parts.append(f"ACTION: {action.command.strip()}")
    parts.append(f"EXPLANATION: {action.explanation.strip()}")
    parts.append(f"STATUS: {action.status}")
    return "\n".join(parts)


def normalize_command(command: str) -> str:
    """The form used to decide that two commands are the same (dedupe of siblings)."""
    return " ".join(command.lower().split())


def _normalize_status(text: str) -> str | None:
    if text in STATUSES:
        return text
    word = re.sub(r"[\s\-]+", "_", text.strip().strip("`*_.\"'").strip()).upper()
    return word if word in STATUSES else None


def parse(text: str) -> CompositeAction | FormatError:
    """Read a composite action from model output; a `FormatError` says why not (see `_parse`).
    Cached by text: identical completions are common (siblings and rollouts sampled from the same
    state), and both results are immutable."""
    return _parse_cached(text) if isinstance(text, str) else _parse(text)


def _section_spans(text: str) -> dict[str, tuple[int, int]]:
    """Each section's body as a (start, end) span of `text`: the first occurrence of each name wins."""
    spans: dict[str, tuple[int, int]] = {}
    matches = list(_HEADER.finditer(text))
    for i, m in enumerate(matches):
        name = m.group("name").lower()
        name = _ALIASES.get(name, name.upper())
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        spans.setdefault(name, (m.end(), end))
    return spans


def command_span(text: str) -> tuple[int, int] | None:
    """Where in `text` the command `parse` reads lies, as a (start, end) span (the ACTION section's first
    non-empty line, stripped), or None for text `parse` refuses: what an action-only SFT loss trains on."""
    if isinstance(parse(text), FormatError):
        return None
    start, end = _section_spans(text)["ACTION"]
    at = start
    for line in text[start:end].splitlines(keepends=True):  # the line breaks `parse` splits at (\r, \u2028 too)
        if line.strip():
            return at + len(line) - len(line.lstrip()), at + len(line.rstrip())
        at += len(line)
    return None


def _parse(text: str) -> CompositeAction | FormatError:
    """Read a composite action from model output; a `FormatError` says why not.

    Rules: ACTION is required and must be non-empty; THOUGHT, EXPLANATION and PLAN may be missing
    (empty / None); STATUS defaults to CONTINUE when missing but must be a known status when given.
    Prose before the first header is ignored; the first occurrence of each section wins; only the
    first non-empty line of ACTION is the command.
    """
    if not isinstance(text, str):
        return FormatError(f"completion is {type(text).__name__}, not text")
    if not text.strip():
        return FormatError("empty completion")
    if "\x00" in text:
        return FormatError("completion contains NUL bytes (binary output)")

    found = {name: text[a:b].strip() for name, (a, b) in _section_spans(text).items()}

    if "ACTION" not in found:
        return FormatError("no ACTION section (expected a line 'ACTION: <command>')")
    lines = [ln.strip() for ln in found["ACTION"].splitlines() if ln.strip()]
    if not lines:
        return FormatError("ACTION section is empty")
    command = lines[0]
    wrapped = _WRAP.match(command) if command[0] in "`\"'" else None
    if wrapped:
        command = wrapped.group("inner").strip()
    if not command:
        return FormatError("ACTION section is empty")
    if len(command) > MAX_COMMAND_CHARS:
        return FormatError(f"ACTION command is {len(command)} characters (limit {MAX_COMMAND_CHARS})")

    status = "CONTINUE"
    if "STATUS" in found:
        raw_status = found["STATUS"].splitlines()[0] if found["STATUS"] else ""
        status = _normalize_status(raw_status) or ""
        if not status:
            return FormatError(f"unknown STATUS {raw_status[:40]!r} (expected one of {', '.join(STATUSES)})")

    plan = found.get("PLAN") or None
    return CompositeAction(
        thought=found.get("THOUGHT", ""),
        command=command,
        explanation=found.get("EXPLANATION", ""),
        status=status,
        plan=plan,
    )


_parse_cached = lru_cache(maxsize=1 << 14)(_parse)
