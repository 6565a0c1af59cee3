"""Prompt templates and robust answer parsing for the critic and the first-error judge."""

import pytest
from fuzz_data import model_outputs

from engine.actions import CompositeAction
from engine.prompts import (
    HistoryStep,
    actor_prompt,
    critic_answer,
    critic_prompt,
    judge_answer,
    judge_prompt,
    parse_critic_choice,
    parse_judgement,
)

A = CompositeAction(thought="need logs", command="get 1 oak log", explanation="logs make planks", plan="1. logs")
B = CompositeAction(thought="planks", command="craft 4 oak planks using 1 oak log", explanation="planks")


def test_actor_prompt_shows_history_actions_but_only_the_current_observation():
    p = actor_prompt("Commands: get, craft.", "craft 1 stick", "Crafting commands:\nx", [HistoryStep(A, "Got 1 oak log")],
                     "Crafted 4 oak planks")
    assert [m["role"] for m in p] == ["system", "user"]
    user = p[1]["content"]
    assert "TASK: craft 1 stick" in user and "Crafting commands:" in user
    assert "ACTION: get 1 oak log" in user and "PLAN:" in user
    assert "Got 1 oak log" not in user  # older observations are dropped (docs/algorithms.md §1)
    assert "OBSERVATION: Crafted 4 oak planks" in user and "Step 2:" in user
    assert "Commands: get, craft." in p[0]["content"]


def test_critic_prompt_numbers_candidates():
    p = critic_prompt("g", "", [], "obs", [A, B])
    assert "[1] ACTION: get 1 oak log" in p[1]["content"] and "[2] ACTION: craft 4 oak planks" in p[1]["content"]


def test_judge_prompt_has_log_with_observations():
    p = judge_prompt("g", "", [HistoryStep(A, "Got 1 oak log")], B, "Crafted")
    assert "Observation 1: Got 1 oak log" in p[1]["content"] and "CURRENT ACTION:" in p[1]["content"]


def test_parse_critic_choice():
    assert parse_critic_choice(critic_answer("closest", 2), 3) == 1
    assert parse_critic_choice("best: [3]", 3) == 2
    assert parse_critic_choice("I prefer candidate 2 because...", 3) == 1
    assert parse_critic_choice("BEST: 9\nactually 1", 3) == 0  # out-of-range BEST ignored
    assert parse_critic_choice("no idea", 3) is None
    assert parse_critic_choice("", 3) is None
    assert parse_critic_choice("BEST: 7", 3) is None


@pytest.mark.parametrize("text", model_outputs())
def test_hostile_critic_and_judge_answers_parse_without_raising(text):
    """tests/data/fuzz/model_outputs.json: e.g. a 5000-digit BEST made int() raise and ended the search."""
    assert parse_critic_choice(text, 3) in (None, 0, 1, 2)
    assert parse_judgement(text) in (None, "Good", "Bad", "Uncertain")


def test_parse_judgement_both_spellings():
    assert parse_judgement(judge_answer("wrong item", "Bad")) == "Bad"
    assert parse_judgement("reasons...\nJudgment: good") == "Good"
    assert parse_judgement("**Judgement**: Uncertain") == "Uncertain"
    assert parse_judgement("Judgement: Good ... on reflection Judgement: Bad") == "Bad"
    assert parse_judgement("looks fine") is None
