"""AgentRefine refinement data (docs/algorithms.md §5): the script self-check, one test per trajectory-verifier
rule with canned model outputs, the continuation / regeneration flows and budgets through a
scripted Generator, the Sample rows and their loss flags, the CLI, and (slow) the whole pipeline
against a real local OpenAI-compatible server."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from fuzz_data import model_outputs
from serve_fixture import record_posts, transformers_serve
from tiny_model_fixture import build_tiny_model

from engine.cli import refine as refine_cli
from engine.config import ConfigError
from engine.datasets.refine import (
    DEFAULT_PERSONAS,
    EXAMPLE_SCRIPT,
    EXAMPLE_TRAJECTORY,
    Persona,
    RefineConfig,
    Script,
    Violation,
    check_script,
    generate,
    load_personas,
    parse_script,
    parse_turns,
    sample_personas,
    to_row,
    verify_trajectory,
)
from engine.datasets.samples import to_conversations
from engine.llm.base import Completion, ContextOverflow, GeneratorError, Prompt, SampleRequest, SamplingParams

SCRIPT = check_script(EXAMPLE_SCRIPT)
assert isinstance(SCRIPT, Script)


def traj() -> list[dict]:
    return copy.deepcopy(EXAMPLE_TRAJECTORY)


def chatty(value: object) -> str:
    """A model answer the way instruction models write them: prose around a fenced block."""
    return f"Sure! Here it is:\n```json\n{json.dumps(value, indent=2)}\n```\nLet me know if you need more."


def verify_text(text: str, script: Script = SCRIPT, **config: int):
    turns, error = parse_turns(text)
    return verify_trajectory(turns, script, RefineConfig(**config), error)


# ---------------------------------------------------------------- script self-check


def test_good_script_passes_and_parses_through_prose_and_fences() -> None:
    script = parse_script(chatty(EXAMPLE_SCRIPT))
    assert isinstance(script, Script)
    assert [a.name for a in script.actions] == ["go", "take", "bake", "put"]
    assert script.actions[0].parameters == {"place": ("counter", "pantry", "kitchen")}


def _with_action(**changes: object) -> dict:
    data = copy.deepcopy(EXAMPLE_SCRIPT)
    data["actions"][0].update(changes)
    return data


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        (_with_action(pattern=r"go to (?P<place>[a-z ]+"), "pattern_invalid"),  # unbalanced
        (_with_action(pattern=r"go to (?P<place>\p{L}+)"), "pattern_invalid"),  # not Python `re`
        (_with_action(examples=["walk to pantry"]), "example_mismatch"),
        (_with_action(examples=["go to attic"]), "example_parameter"),
        (_with_action(parameters={"room": ["pantry"]}), "parameters_mismatch"),
        (_with_action(parameters={"place": []}), "script_schema"),
        (_with_action(name="take"), "duplicate_action"),
        (_with_action(pattern="go to (?P<place>" + "[a-z]" * 60 + ")"), "pattern_too_long"),
        (_with_action(pattern=r".*", parameters={}, examples=["go to pantry"]), "pattern_too_broad"),
        ({**EXAMPLE_SCRIPT, "task": ""}, "script_schema"),
        ({**EXAMPLE_SCRIPT, "actions": []}, "script_schema"),
    ],
)
def test_bad_scripts_are_rejected_with_the_rule(data: dict, rule: str) -> None:
    v = check_script(data)
    assert isinstance(v, Violation) and v.rule == rule, v


def test_script_without_json_is_rejected() -> None:
    v = parse_script("I would love to write a script about bees!")
    assert isinstance(v, Violation) and v.rule == "script_json"


@pytest.mark.parametrize("text", model_outputs())
def test_hostile_model_answers_are_rejected_attempts_and_the_run_goes_on(text: str) -> None:
    """Model output is untrusted (tests/data/fuzz/model_outputs.json: deep nesting, 5000-digit
    numbers, lone surrogates, oversized answers): each answer is a counted rejected attempt, never
    a traceback, and the other personas' samples are kept, at the script and trajectory stages."""
    start = time.monotonic()
    assert isinstance(parse_script(text), Violation)
    parse_turns(text)  # never raises
    hostile_script = dataclasses.replace(SCRIPT, task="HOSTILE task")

    def respond(kind: str, prompt: Prompt) -> str:
        if "persona number 0" in prompt[0]["content"] or "HOSTILE task" in prompt[0]["content"]:
            return text
        return good(kind, prompt)

    result = generate(Scripted(respond), PERSONAS)
    assert [s.task.id for s in result.samples] == ["p1", "p2"]
    assert [f["persona"]["id"] for f in result.failures] == ["p0"] and result.failures[0]["stage"] == "script"
    assert sum(result.stats.script_rejections.values()) == RefineConfig().script_attempts
    result = generate(Scripted(respond), PERSONAS, scripts=[hostile_script, SCRIPT, SCRIPT])
    assert [s.task.id for s in result.samples] == ["p1", "p2"]
    assert [f["persona"]["id"] for f in result.failures] == ["p0"] and result.failures[0]["stage"] == "trajectory"
    assert sum(result.stats.trajectory_rejections.values()) == result.failures[0]["cost"]["calls"]
    json.dumps([to_row(s) for s in result.samples], ensure_ascii=False).encode("utf-8")  # writable rows
    assert time.monotonic() - start < 10


def test_catastrophic_pattern_is_bounded_by_the_timeout() -> None:
    # (a|aa)+ backtracks exponentially on a's followed by a mismatch; `re` would hang for hours.
    data = copy.deepcopy(EXAMPLE_SCRIPT)
    data["actions"].append({"name": "chant", "pattern": r"(?P<word>(a|aa)+)", "parameters": {"word": ["aaaa"]},
                            "examples": ["aaaa"]})
    script = check_script(data)
    assert isinstance(script, Script)
    turns = traj()
    turns[5]["action"] = "a" * 60 + "!"  # valid-looking for nothing; the DM did not flag it
    start = time.monotonic()
    v = verify_trajectory(turns, script)
    assert time.monotonic() - start < 2
    assert v.violation is not None and v.violation.rule == "action" and v.violation.turn == 5


# ---------------------------------------------------------------- the verifier, one test per rule


def test_verifier_accepts_the_prompt_example_with_two_corrections() -> None:
    v = verify_text(chatty(EXAMPLE_TRAJECTORY))
    assert v.ok and v.complete and v.corrections == 2 and v.flagged == (3, 7) and len(v.turns) == 17


def test_rule_json_no_list_at_all() -> None:
    v = verify_text("As an AI I would rather describe the game in prose.")
    assert v.violation == Violation("json", 0, "the answer contains no JSON list of turns") and v.turns == ()


def test_rule_json_cut_off_keeps_the_verified_prefix() -> None:
    text = json.dumps(traj())
    cut = text[: text.index('"grab flour"') + 5]  # inside player turn 3
    v = verify_text(cut)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("json", 3)
    assert [t["role"] for t in v.turns] == ["dm", "player", "dm"]


def test_rule_json_broken_mid_list() -> None:
    text = json.dumps(traj()).replace('"take flour"}', '"take flour"} oops', 1)
    v = verify_text(text)
    assert v.violation is not None and v.violation.rule == "json" and v.violation.turn == 6
    assert len(v.turns) == 5  # turn 5 (player) has no DM evaluation yet: not verified


def test_rule_structure_missing_field_and_bad_error_label() -> None:
    turns = traj()
    del turns[4]["observation"]
    v = verify_trajectory(turns, SCRIPT)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("structure", 4)
    assert len(v.turns) == 3  # the player turn 3 needs turn 4's evaluation, so it is dropped
    turns = traj()
    turns[6]["evaluation"]["error"] = "typo"
    v = verify_trajectory(turns, SCRIPT)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("structure", 6)
    assert "typo" in v.violation.detail


def test_rule_alternation() -> None:
    turns = traj()
    turns.insert(2, {"role": "player", "thought": "again", "action": "go to pantry"})
    v = verify_trajectory(turns, SCRIPT)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("alternation", 2)
    assert len(v.turns) == 1
    turns = traj()
    turns[0]["role"] = "player"
    assert verify_trajectory(turns, SCRIPT).violation.rule == "alternation"  # the DM opens


def test_rule_action_unflagged_invalid_action_or_parameter() -> None:
    turns = traj()
    turns[5]["action"] = "fly to the moon"  # the DM's evaluation at turn 6 says "none"
    v = verify_trajectory(turns, SCRIPT)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("action", 5)
    assert "matches none of the actions" in v.violation.detail and len(v.turns) == 5
    turns = traj()
    turns[1]["action"] = "Go to   ATTIC"  # matches `go`, but attic is no valid place
    v = verify_trajectory(turns, SCRIPT)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("action", 1)
    assert "place='ATTIC' is not one of" in v.violation.detail and len(v.turns) == 1


def test_invalid_actions_the_dm_flagged_are_allowed_and_case_is_ignored() -> None:
    turns = traj()
    assert turns[3]["action"] == "grab flour" and turns[4]["evaluation"]["error"] == "parameter"
    turns[5]["action"] = "TAKE Flour"
    v = verify_trajectory(turns, SCRIPT)
    assert v.ok and v.turns[5]["action"] == "TAKE Flour"


def test_rule_task_complete_at_the_last_turn() -> None:
    turns = traj()
    turns[-1]["task_complete"] = False
    v = verify_trajectory(turns, SCRIPT)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("task_complete", 16)
    assert len(v.turns) == 17 and not v.complete
    v = verify_trajectory(traj()[:-1], SCRIPT)  # ends on a player turn
    assert v.violation is not None and v.violation.rule == "task_complete" and len(v.turns) == 15


def test_rule_corrections_needs_two_error_then_correction_episodes() -> None:
    turns = traj()
    turns[8]["evaluation"] = {"error": "none", "detail": ""}  # only one flagged mistake left
    v = verify_trajectory(turns, SCRIPT)
    assert v.complete and v.corrections == 1 and v.flagged == (3,)
    assert v.violation is not None and (v.violation.rule, v.violation.turn) == ("corrections", 17)
    assert verify_trajectory(turns, SCRIPT, RefineConfig(min_corrections=1)).ok
    # Mistakes in a row then a fix make ONE episode.
    turns = traj()
    turns[6]["evaluation"] = {"error": "logic", "detail": "x"}
    v = verify_trajectory(turns, SCRIPT)
    assert v.flagged == (3, 5, 7) and v.corrections == 1


def test_turns_after_the_completing_dm_turn_are_dropped() -> None:
    turns = traj() + [{"role": "player", "thought": "more", "action": "dance"}]
    v = verify_trajectory(turns, SCRIPT)
    assert v.ok and v.dropped == 1 and len(v.turns) == 17


def test_parse_turns_accepts_an_object_wrapper_and_reports_cut_lists() -> None:
    turns, error = parse_turns(json.dumps({"turns": traj()}))
    assert error is None and turns == traj()
    turns, error = parse_turns(json.dumps(traj())[:-40])
    assert len(turns) == 16 and "cut off after 16 turns" in error


# ---------------------------------------------------------------- the pipeline, with a scripted model


class Scripted:
    """A Generator answering each prompt with `respond(kind, prompt, persona_tag)`; `kind` is read
    from the prompt's last user message. Records every batch; n_tokens = words of the answer."""

    name = "scripted-refine"

    def __init__(self, respond: Callable[[str, Prompt], str]) -> None:
        self.respond = respond
        self.batches: list[list[SampleRequest]] = []

    @staticmethod
    def kind(prompt: Prompt) -> str:
        last = prompt[-1]["content"]
        for marker, kind in (("The script failed a check", "script_retry"), ("Persona:", "script"),
                             ("The log was checked", "continuation"), ("The log was rejected", "restart"),
                             ("You will write the complete log", "trajectory")):
            if last.startswith(marker) or (marker == "Persona:" and marker in last):
                return kind
        raise AssertionError(f"unknown prompt: {last[:80]}")

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        self.batches.append(list(requests))
        out = []
        for req in requests:
            text = self.respond(self.kind(req.prompt), req.prompt)
            out.append([Completion(text=text, n_tokens=len(text.split()), finish_reason="stop")])
        return out

    def logprobs(self, prompts, completions):
        return [None] * len(completions)


PERSONAS = [Persona(f"p{i}", f"persona number {i}") for i in range(3)]


def good(kind: str, prompt: Prompt) -> str:
    return chatty(EXAMPLE_SCRIPT) if kind == "script" else chatty(EXAMPLE_TRAJECTORY)


def test_happy_path_batches_all_personas_per_stage() -> None:
    gen = Scripted(good)
    result = generate(gen, PERSONAS)
    assert [len(b) for b in gen.batches] == [3, 3]  # all scripts in one call, then all trajectories
    assert [Scripted.kind(r.prompt) for r in gen.batches[0]] == ["script"] * 3
    assert all(f"persona number {i}" in r.prompt[0]["content"] for i, r in enumerate(gen.batches[0]))
    assert len(result.samples) == 3 and result.failures == []
    s = result.stats
    assert (s.rows, s.failed, s.calls, s.batches, s.scripts_kept) == (3, 0, 6, 2, 3)
    assert dict(s.calls_by_stage) == {"script": 3, "trajectory": 3}
    # Seeds differ per persona and per call, so servers that honour seeds give diverse data.
    seeds = [r.params.seed for b in gen.batches for r in b]
    assert len(set(seeds)) == 6


def test_rows_have_dm_observations_as_user_turns_and_flagged_turns_untrained() -> None:
    sample = generate(Scripted(good), PERSONAS[:1]).samples[0]
    row = to_row(sample)
    msgs = row["messages"]
    assert row["kind"] == "refine" and row["meta"]["persona"] == {"id": "p0", "persona": "persona number 0"}
    assert msgs[0]["role"] == "system" and "Bake a loaf of bread" in msgs[0]["content"]
    assert "go to pantry" in msgs[0]["content"]  # the action list
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * 8  # ends on the assistant
    dm_obs = [t["observation"] for t in EXAMPLE_TRAJECTORY if t["role"] == "dm"]
    assert [m["content"] for m in msgs if m["role"] == "user"] == dm_obs[:-1]
    assistant = [m for m in msgs if m["role"] == "assistant"]
    assert assistant[1]["content"] == "Thought: I will grab the flour.\nAction: grab flour"
    assert [m["train"] for m in assistant] == [True, False, True, False, True, True, True, True]
    assert all(m["train"] is None for m in msgs if m["role"] != "assistant")
    conv = to_conversations(sample)  # the AgentGym rendering keeps the same loss flags
    assert [c["loss"] for c in conv if c["from"] == "gpt"] == [m["train"] for m in assistant]
    meta = row["meta"]
    assert meta["verification"]["corrections"] == 2 and meta["verification"]["flagged_turns"] == [3, 7]
    assert meta["verification"]["final_observation"] == dm_obs[-1]
    assert meta["cost"]["calls"] == 2 and meta["model"] == "scripted-refine"
    # The id depends on the content only: the same trajectory from another persona is the same row.
    assert generate(Scripted(good), PERSONAS[1:2]).samples[0].id == sample.id


def test_a_prompt_too_long_for_the_model_fails_that_persona_only() -> None:
    """A backend's ContextOverflow (one prompt past the model's context) fails that persona under the
    rule "context", counted as a call; the batch's other answers are used and the run goes on."""

    class Overflowing(Scripted):
        def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
            out = super().sample(requests)
            long = {i: "prompt of 5000 tokens exceeds 4096" for i, r in enumerate(requests)
                    if "persona number 1" in r.prompt[-1]["content"]}
            if long:
                raise ContextOverflow(long, [None if i in long else o for i, o in enumerate(out)])
            return out

    result = generate(Overflowing(good), PERSONAS)
    s = result.stats
    assert [sample.source["persona"]["id"] for sample in result.samples] == ["p0", "p2"]
    assert [(f["persona"]["id"], f["stage"], f["reason"]) for f in result.failures] == [
        ("p1", "script", "context: prompt of 5000 tokens exceeds 4096")]
    assert (s.rows, s.failed, s.calls, dict(s.script_rejections)) == (2, 1, 5, {"context": 1})
    assert result.failures[0]["cost"]["calls"] == 1


def test_violation_truncates_and_asks_for_a_continuation() -> None:
    full = traj()
    broken = full[:5] + [{**full[5], "action": "fly to the moon"}] + full[6:]

    def respond(kind: str, prompt: Prompt) -> str:
        if kind == "script":
            return chatty(EXAMPLE_SCRIPT)
        if kind == "trajectory":
            return chatty(broken)
        assert kind == "continuation"
        assert json.loads(prompt[-2]["content"]) == full[:5]  # the verified prefix, as the model's answer
        assert "turns 0 to 4 are fine" in prompt[-1]["content"] and "fly to the moon" in prompt[-1]["content"]
        return chatty(full[4:])  # restates the last DM turn, then the rest

    gen = Scripted(respond)
    result = generate(gen, PERSONAS[:1])
    assert [len(b) for b in gen.batches] == [1, 1, 1] and len(result.samples) == 1
    assert result.samples[0].id == generate(Scripted(good), PERSONAS[:1]).samples[0].id
    s = result.stats
    assert (s.continuations, s.regenerations, dict(s.trajectory_rejections)) == (1, 0, {"action": 1})
    assert result.samples[0].source["verification"]["rejections"][0]["turn"] == 5


def test_too_few_corrections_regenerates_from_scratch_showing_the_attempt() -> None:
    one_fix = traj()
    one_fix[8]["evaluation"] = {"error": "none", "detail": ""}
    seen: list[str] = []

    def respond(kind: str, prompt: Prompt) -> str:
        seen.append(kind)
        if kind == "script":
            return chatty(EXAMPLE_SCRIPT)
        if kind == "trajectory":
            return chatty(one_fix)
        assert kind == "restart" and "1 error-then-correction episode" in prompt[-1]["content"]
        assert json.loads(prompt[-2]["content"])[8]["evaluation"]["error"] == "none"  # all its turns
        return chatty(EXAMPLE_TRAJECTORY)

    result = generate(Scripted(respond), PERSONAS[:1])
    assert seen == ["script", "trajectory", "restart"] and len(result.samples) == 1
    s = result.stats
    assert (s.regenerations, s.continuations, dict(s.trajectory_rejections)) == (1, 0, {"corrections": 1})
    assert dict(s.calls_by_stage) == {"script": 1, "trajectory": 1, "regeneration": 1}


def test_regeneration_is_bounded() -> None:
    one_fix = traj()
    one_fix[8]["evaluation"] = {"error": "none", "detail": ""}
    gen = Scripted(lambda k, p: chatty(EXAMPLE_SCRIPT) if k == "script" else chatty(one_fix))
    result = generate(gen, PERSONAS[:1], RefineConfig(max_regenerations=1, max_calls=10))
    assert result.samples == [] and result.stats.regenerations == 1 and result.stats.calls == 3
    failure = result.failures[0]
    assert failure["stage"] == "trajectory" and failure["reason"].startswith("corrections")
    assert check_script(failure["script"]) == SCRIPT  # kept, so its trajectory can be retried later


def test_script_retry_shows_the_failed_check_then_succeeds() -> None:
    bad = _with_action(examples=["walk to pantry"])

    def respond(kind: str, prompt: Prompt) -> str:
        if kind == "script":
            return chatty(bad)
        if kind == "script_retry":
            assert "example_mismatch" in prompt[-1]["content"] and "walk to pantry" in prompt[-2]["content"]
            return chatty(EXAMPLE_SCRIPT)
        return chatty(EXAMPLE_TRAJECTORY)

    result = generate(Scripted(respond), PERSONAS[:1])
    assert len(result.samples) == 1
    s = result.stats
    assert (s.script_retries, dict(s.script_rejections), s.scripts_kept, s.calls) == (1, {"example_mismatch": 1}, 1, 3)


def test_garbage_model_is_bounded_and_every_rejection_is_counted() -> None:
    gen = Scripted(lambda kind, prompt: "I am a teapot.")
    result = generate(gen, PERSONAS, RefineConfig(script_attempts=3, max_calls=4))
    assert result.samples == [] and len(result.failures) == 3
    s = result.stats
    assert (s.calls, s.batches, s.script_retries, dict(s.script_rejections)) == (9, 3, 6, {"script_json": 9})
    assert dict(s.failures_by_stage) == {"script": 3}
    # Good scripts, garbage trajectories: script + trajectory + 2 continuations = max_calls (4).
    gen = Scripted(lambda kind, prompt: chatty(EXAMPLE_SCRIPT) if kind == "script" else "no.")
    result = generate(gen, PERSONAS)
    s = result.stats
    assert (s.calls, s.continuations, dict(s.trajectory_rejections)) == (12, 6, {"json": 9})
    assert [Scripted.kind(r.prompt) for r in gen.batches[2]] == ["restart"] * 3  # empty prefix: start over
    assert all(f["cost"]["calls"] == 4 for f in result.failures)
    # Each stage bound holds on its own, and a smaller call budget wins over the stage bounds.
    result = generate(Scripted(gen.respond), PERSONAS[:1], RefineConfig(max_calls=10, max_continuations=1))
    assert result.stats.calls == 3 and result.stats.continuations == 1
    result = generate(Scripted(gen.respond), PERSONAS[:1], RefineConfig(max_calls=2, max_continuations=5))
    assert result.stats.calls == 2 and result.stats.continuations == 0 and len(result.failures) == 1


def test_counters_add_up_over_mixed_outcomes() -> None:
    full = traj()
    cut = json.dumps(full)[:-300]

    def respond(kind: str, prompt: Prompt) -> str:
        persona = prompt[0]["content"]
        if kind == "script":
            return "no script today" if "number 2" in persona else chatty(EXAMPLE_SCRIPT)
        if kind == "script_retry":
            return "still no"
        if kind == "trajectory":
            return cut
        return chatty(full[len(json.loads(prompt[-2]["content"])):])

    gen = Scripted(respond)
    result = generate(gen, PERSONAS + [Persona("p3", "persona number 3")], RefineConfig(jobs_in_flight=2))
    s = result.stats
    assert max(len(b) for b in gen.batches) <= 2
    sent = [r for b in gen.batches for r in b]
    assert s.calls == len(sent) == sum(s.calls_by_stage.values())
    assert s.batches == len(gen.batches)
    assert s.prompt_chars == sum(len(m["content"]) for r in sent for m in r.prompt)
    per_item = [smp.source["cost"] for smp in result.samples] + [f["cost"] for f in result.failures]
    assert sum(c["calls"] for c in per_item) == s.calls
    assert sum(c["completion_tokens"] for c in per_item) == s.completion_tokens > 0
    assert sum(c["prompt_chars"] for c in per_item) == s.prompt_chars
    assert s.rows + s.failed == s.personas == 4 and (s.rows, s.failed) == (3, 1)
    assert s.script_retries + s.personas == s.calls_by_stage["script"]
    assert s.continuations == s.calls_by_stage["continuation"] == 3
    assert sum(s.script_rejections.values()) == 2 and sum(s.trajectory_rejections.values()) == 3
    assert json.loads(json.dumps(s.to_dict()))["trajectory_rejections"] == {"json": 3}


def test_given_scripts_skip_the_script_stage() -> None:
    gen = Scripted(good)
    result = generate(gen, PERSONAS[:2], scripts=[SCRIPT, None])
    assert [Scripted.kind(r.prompt) for r in gen.batches[0]] == ["trajectory", "script"]
    assert len(result.samples) == 2 and result.stats.calls == 3
    with pytest.raises(ValueError):
        generate(gen, PERSONAS[:2], scripts=[SCRIPT])


# ---------------------------------------------------------------- personas and config


def test_shipped_personas_load_and_are_diverse() -> None:
    personas = load_personas()
    assert len(personas) == 30 and len({p.id for p in personas}) == 30
    assert len({p.persona for p in personas}) == 30
    picked = sample_personas(personas, 45, seed=1)
    assert len(picked) == 45 and set(picked) == set(personas)  # cycles past the end
    assert picked == sample_personas(personas, 45, seed=1) != sample_personas(personas, 45, seed=2)


def test_bad_persona_files_and_configs_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "a", "persona": "x"}\n{"id": "a", "persona": "y"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:2: duplicate persona id 'a'"):
        load_personas(bad)
    bad.write_text('{"id": "a"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:1: expected"):
        load_personas(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_personas(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="max_calls"):
        RefineConfig(max_calls=1)


# ---------------------------------------------------------------- CLI


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="orchard")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db")
    refine_cli.add_parsers(parser.add_subparsers(dest="command", required=True), common)
    return parser.parse_args(argv)


def test_cli_generate_writes_jsonl_and_prints_costs(tmp_path: Path, monkeypatch, capsys) -> None:
    import engine.llm.registry

    monkeypatch.setattr(engine.llm.registry, "load_generator", lambda spec, log=print: Scripted(good))
    out = tmp_path / "refine.jsonl"
    args = _parse(["refine", "generate", "--model", "fake", "--n", "4", "--out", str(out), "--seed", "3",
                   "--db", str(tmp_path / "orchard.db")])
    assert args.func(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["kind"] == "refine" and r["messages"] for r in rows)
    stats = json.loads((tmp_path / "refine.stats.json").read_text())
    assert stats["stats"]["calls"] == 8 and stats["config"]["seed"] == 3 and len(stats["personas"]) == 4
    printed = capsys.readouterr().out
    assert "4 personas -> 4 rows, 0 failed" in printed and "8 model calls in 2 batches" in printed
    assert f"wrote {out}" in printed and "samples: 1 created" in printed  # 4 equal chats: one row for the Refinement page


def test_cli_user_errors_write_nothing(tmp_path: Path, monkeypatch) -> None:
    import engine.llm.registry

    monkeypatch.setattr(engine.llm.registry, "load_generator", lambda spec, log=print: Scripted(good))
    out, db = tmp_path / "x.jsonl", str(tmp_path / "orchard.db")
    for extra in (["--n", "0"], ["--personas", str(tmp_path / "none.jsonl")], ["--config", str(tmp_path / "c.toml")]):
        args = _parse(["refine", "generate", "--model", "fake", "--out", str(out), "--db", db, *extra])
        with pytest.raises(ConfigError):
            args.func(args)
    (tmp_path / "c.toml").write_text("max_calls = 1\n")
    args = _parse(["refine", "generate", "--model", "fake", "--out", str(out), "--db", db,
                   "--config", str(tmp_path / "c.toml")])
    with pytest.raises(ConfigError, match="max_calls"):
        args.func(args)
    args = _parse(["refine", "generate", "--model", "openai:http://127.0.0.1:1/v1", "--out", str(out), "--db", db])
    monkeypatch.undo()  # the real registry: a spec without #MODEL is a one-line user error
    with pytest.raises(GeneratorError, match="model 'openai:http://127.0.0.1:1/v1': expected"):
        args.func(args)
    assert not out.exists()


def test_cli_a_failed_run_leaves_an_existing_output_file_alone(tmp_path: Path, monkeypatch) -> None:
    import engine.llm.registry

    class Unreachable:
        name = "unreachable"

        def sample(self, requests):
            raise GeneratorError("http://127.0.0.1:9/v1: cannot reach the server")

    monkeypatch.setattr(engine.llm.registry, "load_generator", lambda spec, log=print: Unreachable())
    out = tmp_path / "precious.jsonl"
    out.write_text('{"kept": 1}\n{"kept": 2}\n')
    args = _parse(["refine", "generate", "--model", "fake", "--n", "2", "--out", str(out),
                   "--db", str(tmp_path / "orchard.db")])
    with pytest.raises(GeneratorError, match="cannot reach"):
        args.func(args)
    assert out.read_text() == '{"kept": 1}\n{"kept": 2}\n'
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("orchard.db"))
    assert left == ["precious.jsonl"]  # no partial file: nothing verified


# ---------------------------------------------------------------- a real server (slow)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """`transformers serve` on the tiny random model (127.0.0.1 only, offline). Its garbage continuations
    (sampled by the server, unseeded) can grow a trajectory prompt past the model's positions: the server
    refuses it with HTTP 400, and that persona fails under the rule "context" (seen in full slow runs)."""
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", positions=4096)
    with transformers_serve(model, tmp_path_factory.mktemp("serve")) as srv:
        yield srv


@pytest.mark.slow
def test_pipeline_end_to_end_against_a_real_server(server: SimpleNamespace) -> None:
    """The whole pipeline over HTTP against `transformers serve` running a RANDOM tiny model.

    Honest scope: a random model writes garbage, so no script or trajectory can pass and this test
    cannot expect data. It checks what a real endpoint exercises that the scripted model does not:
    real batched calls go out (counted against the server's own request count), completion tokens
    come back from the server's usage, every garbage answer is rejected under a named rule, retries
    stay within the per-persona budget, and the run ends with a failure per persona, not a crash.
    The second half starts from a given (valid) script so the trajectory stage, its continuations
    and the restart prompts also run over HTTP."""
    from engine.llm.openai_http import OpenAIGenerator

    posts: list[str] = []
    gen = OpenAIGenerator(server.base_url, server.model, max_concurrency=4, retries=1, backoff_s=0.05,
                          timeout_s=120)
    record_posts(gen, posts)
    config = RefineConfig(script_max_tokens=48, trajectory_max_tokens=48, max_calls=4, script_attempts=2)
    personas = sample_personas(load_personas(DEFAULT_PERSONAS), 3, seed=0)
    with gen:
        first = generate(gen, personas, config)
        s = first.stats
        assert s.calls == len(posts) and s.batches <= config.script_attempts
        assert s.calls_by_stage["script"] == s.calls and s.calls <= 3 * config.script_attempts
        assert s.completion_tokens > 0 and s.prompt_chars > 0
        assert s.rows + s.failed == 3 and sum(s.script_rejections.values()) >= s.failed
        assert all(f["cost"]["calls"] <= config.max_calls and f["history"] for f in first.failures)

        posts.clear()
        second = generate(gen, personas, config, scripts=[SCRIPT] * 3)
        s = second.stats
        assert s.calls == len(posts) and s.calls_by_stage.get("script", 0) == 0
        assert s.calls <= 3 * config.max_calls and s.continuations <= 3 * config.max_continuations
        assert s.rows + s.failed == 3 and sum(s.trajectory_rejections.values()) >= s.failed
        assert all(f["stage"] == "trajectory" and f["cost"]["calls"] <= config.max_calls for f in second.failures)


        # The server's own wording for a prompt past its positions is recognised: that request alone fails.
        huge = [{"role": "user", "content": " ".join(str(i) for i in range(5000))}]
        small = [{"role": "user", "content": "hello"}]
        params = SamplingParams(max_tokens=4)
        with pytest.raises(ContextOverflow) as err:
            gen.sample([SampleRequest(huge, params=params), SampleRequest(small, params=params)])
        assert list(err.value.overflowed) == [0] and "HTTP 400" in err.value.overflowed[0]
        assert err.value.partial[0] is None and len(err.value.partial[1] or []) == 1
