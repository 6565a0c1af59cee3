"""Composite action render/parse (docs/algorithms.md §1): round trips, tolerance, typed errors."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.actions import STATUSES, CompositeAction, FormatError, normalize_command, parse, render

# text that cannot itself look like a section header or contain NUL
_line = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=60).filter(
    lambda s: s.strip() and ":" not in s
)
_command = _line.filter(lambda s: not (s.strip()[0] in "`\"'" and s.strip()[-1] in "`\"'"))


@st.composite
def actions(draw):
    plan_lines = draw(st.lists(_line, min_size=1, max_size=4))
    plan = "\n".join(f"{i}. {p.strip()}" for i, p in enumerate(plan_lines, 1)) if draw(st.booleans()) else None
    return CompositeAction(
        thought=draw(_line).strip(),
        command=draw(_command).strip(),
        explanation=draw(_line).strip(),
        status=draw(st.sampled_from(STATUSES)),
        plan=plan,
    )


@settings(max_examples=300, deadline=None)
@given(actions())
def test_render_parse_roundtrip(action):
    assert parse(render(action)) == action


@settings(max_examples=100, deadline=None)
@given(actions(), st.sampled_from([str.lower, str.upper, str.title]))
def test_roundtrip_survives_header_case_and_spacing(action, case):
    text = render(action)
    for name in ("PLAN", "THOUGHT", "ACTION", "EXPLANATION", "STATUS"):
        text = text.replace(f"{name}:", f"  {case(name)} :  ")
    assert parse(text) == action


def test_tolerates_markdown_prose_and_missing_optional_parts():
    text = (
        "Sure! Here is my next step.\n\n**Thought:** I need planks.\n**Action:** `craft 4 oak planks using 1 oak log`\n"
        "Some trailing chatter."
    )
    a = parse(text)
    assert a == CompositeAction(thought="I need planks.", command="craft 4 oak planks using 1 oak log")
    assert a.status == "CONTINUE" and a.plan is None and a.explanation == ""
    b = parse("ACTION (command): inventory\nstatus: ask user")
    assert b.command == "inventory" and b.status == "ASK_USER"
    c = parse("### THOUGHTS: x\nCommand: get 1 oak log\nSTATUS: success.")
    assert c.command == "get 1 oak log" and c.thought == "x" and c.status == "SUCCESS"


def test_first_occurrence_wins_and_command_is_first_line():
    a = parse("THOUGHT: a\nACTION: get 1 oak log\nthen maybe more\nACTION: inventory\nSTATUS: CONTINUE")
    assert a.command == "get 1 oak log"


def test_typed_errors_with_reasons():
    cases = {
        "": "empty",
        "   \n ": "empty",
        "I think I should get wood.": "no ACTION",
        "THOUGHT: x\nACTION:\nSTATUS: CONTINUE": "empty",
        "ACTION: get 1 log\nSTATUS: MAYBE": "unknown STATUS",
        "ACTION: x\x00y": "NUL",
        "ACTION: " + "a" * 600: "characters",
    }
    for text, reason in cases.items():
        out = parse(text)
        assert isinstance(out, FormatError), text[:30]
        assert reason in out.reason, (text[:30], out.reason)
        assert not out
    assert isinstance(parse(None), FormatError)  # type: ignore[arg-type]
    assert isinstance(parse(b"ACTION: x"), FormatError)  # type: ignore[arg-type]


def test_one_megabyte_of_text_is_fast():
    junk = ("lorem ipsum dolor sit amet " * 40 + "\n") * 1000  # ~1 MB, no headers
    t = time.perf_counter()
    assert isinstance(parse(junk), FormatError)
    big = "THOUGHT: " + junk + "ACTION: inventory\nSTATUS: CONTINUE"
    assert parse(big).command == "inventory"
    assert time.perf_counter() - t < 1.0


def test_normalize_command():
    assert normalize_command("  Get   1 OAK log ") == "get 1 oak log"


def test_command_span_is_the_command_parse_reads() -> None:
    from engine.actions import command_span

    cases = [
        "PLAN:\n1. get it\nTHOUGHT: a\nACTION:   get 1 string  \nEXPLANATION: e\nSTATUS: CONTINUE",
        "THOUGHT: x\n**Action:**\n\n  craft 1 y using 2 z\nmore prose\nSTATUS: SUCCESS",
        "Sure! Command: look\nACTION: not this one",  # "Command:" is ACTION's alias: the first occurrence wins
        "THOUGHT: x\nACTION: get 1 stick\rSTATUS: DONE? no",  # a line break parse splits at, and \\n does not
        "ACTION: \u2028  get 2 a \u2028more",
    ]
    for text in cases:
        span = command_span(text)
        parsed = parse(text)
        assert span is not None and not isinstance(parsed, FormatError)
        assert text[span[0]:span[1]] == parsed.command
    assert command_span("THOUGHT: no action here") is None
    assert command_span("ACTION:\n\nSTATUS: CONTINUE") is None
