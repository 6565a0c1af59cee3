"""The composite action as a grammar, for constrained decoding (docs/algorithms.md §1.1).

WHY: an unreadable completion ends its episode (search and evaluation treat it as terminal), and a
small policy's commonest failures are a broken format or a command that names something the task
does not have. Constrained decoding removes both at the source: the model may only write

    [PLAN:\\n(N. line\\n)+] THOUGHT: line\\n ACTION: <command>\\n EXPLANATION: line\\n STATUS: <status>

where <command> is the env's own pattern of commands for the task when it has one
(`command_pattern(task)`, e.g. TextCraft: `get N <an ingredient of its crafting commands>`, `craft N
<item> using <its recipe's ingredients>`, `inventory`), else any one line. The same grammar is one
regex (`ActionGrammar.regex`, for vLLM's structured outputs) and a line-by-line matcher
(`ActionGrammar.viable`, for the HF backend's token masks, engine/llm/hf_constrain.py); the tests
check that both accept the same texts.
It is a stored option of a run and of an evaluation (`constrained`), off by default: figures are
reported with and without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import regex

from engine.actions import STATUSES

# Every regex here is TEXT escapes only (r"\n", not a newline character): xgrammar refuses a character
# class holding a literal newline ("Character class should not contain newline"), and vLLM's auto
# backend would then fall back to guidance for every request (tests/test_grammar_backends.py compiles
# each grammar with the real xgrammar and llguidance).
ANY_COMMAND = r"[^\n\x00]*[^\s\x00]"  # one non-blank line (the parser takes an ACTION's first line)
NUMBER = "[1-9][0-9]?"  # a count (TextCraft counts stay under 100)
_FREE = r"[^\n\x00]*"  # free text: one line, no NUL (parse refuses NUL bytes)

# One line grammar per place in the action: (name, line regex, places that may follow a newline).
# "plan0" is right after "PLAN:" (at least one numbered line must follow).
_STATUS = "(?:" + "|".join(STATUSES) + ")"
_NUMBERED = r"[0-9]+\. "
# place -> the line starts after which the rest of the line is free text (None: constrained to the end)
_FREE_HEADS = {
    "start": re.compile("THOUGHT: "), "plan0": re.compile(_NUMBERED), "plan": re.compile(f"{_NUMBERED}|THOUGHT: "),
    "action": None, "explanation": re.compile("EXPLANATION: "), "status": None,
}


@dataclass(frozen=True)
class ActionGrammar:
    """The composite-action grammar with `command` (a regex without newlines) as the ACTION line."""

    command: str = ANY_COMMAND

    @cached_property
    def regex(self) -> str:
        """The whole completion as one regex (no anchors; match it in full)."""
        return (f"(?:PLAN:\\n(?:[0-9]+\\. {_FREE}\\n)+)?THOUGHT: {_FREE}\\nACTION: (?:{self.command})\\n"
                f"EXPLANATION: {_FREE}\\nSTATUS: {_STATUS}")

    @cached_property
    def _lines(self) -> dict[str, tuple[Any, tuple[tuple[str, str], ...]]]:
        """place -> (compiled line regex, ((line prefix, next place), ...)): after a finished line
        that starts with the prefix, the next line is at that place."""
        c = regex.compile
        return {
            "start": (c(f"PLAN:|THOUGHT: {_FREE}"), (("PLAN:", "plan0"), ("THOUGHT: ", "action"))),
            "plan0": (c(f"[0-9]+\\. {_FREE}"), (("", "plan"),)),
            "plan": (c(f"[0-9]+\\. {_FREE}|THOUGHT: {_FREE}"), (("THOUGHT: ", "action"), ("", "plan"))),
            "action": (c(f"ACTION: (?:{self.command})"), (("", "explanation"),)),
            "explanation": (c(f"EXPLANATION: {_FREE}"), (("", "status"),)),
            "status": (c(f"STATUS: {_STATUS}"), ()),  # the last line: no newline after it
        }

    def place(self, text: str) -> tuple[str, str] | None:
        """(place of the current line, the current line) after `text`, or None when `text` has left
        the grammar (a finished line that does not match its place)."""
        where: str | None = "start"
        *done, current = text.split("\n")
        for line in done:
            where = self.after(where, line) if where is not None else None
            if where is None:
                return None
        return where, current  # type: ignore[return-value]

    def after(self, where: str, line: str) -> str | None:
        """The place of the next line once `line` (at `where`) is finished by a newline, or None
        when `line` is not a whole line there (or no line may follow it)."""
        pattern, nexts = self._lines[where]
        if pattern.fullmatch(line) is None:
            return None
        return next((place for prefix, place in nexts if line.startswith(prefix)), None)

    def viable(self, where: str, line: str) -> bool:
        """Can the current line, at `where`, still become a line of the grammar?"""
        return self._lines[where][0].fullmatch(line, partial=True) is not None

    def complete(self, where: str, line: str) -> bool:
        """Is the current line a whole line of its place (may a newline, or at the end EOS, follow)?"""
        return self._lines[where][0].fullmatch(line) is not None

    def free_tail(self, where: str, line: str) -> bool:
        """Is the rest of the current line free text (any characters but a newline)? Then a token
        mask needs no per-token check but the newline's (engine/llm/hf_constrain.py)."""
        if where == "action" and self.command == ANY_COMMAND:  # any non-blank line: free but its newline
            return line.startswith("ACTION: ")
        heads = _FREE_HEADS[where]
        return heads is not None and heads.match(line) is not None

    def accepts(self, text: str) -> bool:
        """Does the whole `text` match the grammar (what a finished constrained completion is)?"""
        return regex.fullmatch(self.regex, text) is not None


_SPECIAL = frozenset("\\.^$*+?{}[]|()")


def literal(text: str) -> str:
    """`text` as a regex matching exactly it, escaping only the characters that are special outside
    a class. Not `re.escape`: it also escapes spaces, `-`, `#`, `&` and `~`, which xgrammar warns
    about ("Escape sequence '\\ ' is not recognized") once per escape in every request's grammar."""
    if any(ch in text for ch in "\n\r\x00"):
        raise ValueError(f"a grammar literal is one line without NUL: {text!r}")
    return "".join("\\" + ch if ch in _SPECIAL else ch for ch in text)


def alternatives(commands: Iterable[str]) -> str:
    """A command regex for a fixed list of commands (an env's `valid_commands()`); a command that is
    not one line (the parser reads an ACTION's first line only) cannot be written, and is left out."""
    lines = {c for c in commands if c.strip() and not any(ch in c for ch in "\n\r\x00")}
    return "|".join(literal(c) for c in sorted(lines, key=lambda c: (-len(c), c)))


def grammar_for(env: Any, task: Any) -> ActionGrammar:
    """The grammar of `task` in `env`: its `command_pattern(task)` where the env has one, else any line."""
    pattern = getattr(env, "command_pattern", None)
    command = pattern(task) if callable(pattern) else None
    return ActionGrammar(command) if command else ActionGrammar()
