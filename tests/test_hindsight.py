"""Hindsight relabelling (engine/datasets/hindsight.py) on a hand-worked TextCraft tree: the goals a
failed tree reached on the way, cut to the commands they need, checked against the target's grammar,
and written in the policy's own words with the command forced."""

from __future__ import annotations

import pytest
import regex
from test_pairs import add

from engine.config import ConfigError
from engine.datasets.hindsight import HindsightConfig, rationalize, reached_goals, relabel, shortest_solution
from engine.datasets.samples import TreeRef, to_step_rows
from engine.envs.textcraft import TextCraftEnv
from engine.llm.base import Completion
from engine.tree_nodes import SearchTree, Simulation

FENCE, PLANKS, STICK = "train-118", "train-0", "train-97"  # acacia fence needs acacia planks and sticks
BAMBOO, LOGS, CRAFT_PLANKS = "get 4 bamboo", "get 1 acacia logs", "craft 4 acacia planks using 1 acacia logs"
CRAFT_STICKS, REFUSED = "craft 2 stick using 4 bamboo", "craft 1 oak door using 9 stick"


def fence_tree() -> TreeRef:
    """A tree for the acacia fence that never crafts the fence: bamboo -> logs -> planks (acacia planks
    held) -> a refused craft -> sticks (sticks held); and a rollout from the bamboo node crafting sticks."""
    env = TextCraftEnv()
    tree = SearchTree.new(env.task(FENCE), env.reset(FENCE))
    bamboo = add(tree, 0, BAMBOO)
    logs = add(tree, bamboo, LOGS)
    planks = add(tree, logs, CRAFT_PLANKS)
    refused = add(tree, planks, REFUSED)
    add(tree, refused, CRAFT_STICKS)
    tree.simulations = [Simulation((bamboo,), 0.0, (CRAFT_STICKS, "inventory"))]
    return TreeRef(tree=tree, run_id="run-h", tree_id=3, env_description=env.describe())


def targets():
    env = TextCraftEnv()
    return [env.task(t) for t in (PLANKS, STICK, FENCE)]


def test_every_goal_first_reached_on_a_path_is_found_with_the_path_to_it():
    found = reached_goals(fence_tree(), TextCraftEnv(), targets())
    got = sorted((task.id, commands) for task, commands in found)
    assert got == sorted([
        (PLANKS, (BAMBOO, LOGS, CRAFT_PLANKS)),
        (STICK, (BAMBOO, LOGS, CRAFT_PLANKS, REFUSED, CRAFT_STICKS)),
        (STICK, (BAMBOO, CRAFT_STICKS)),  # the rollout beyond the bamboo node
    ])  # the fence itself was never held: no entry for it


def test_the_solution_keeps_only_the_commands_the_target_needs_with_its_own_observations():
    env = TextCraftEnv()
    steps = shortest_solution(env, env.task(STICK), [BAMBOO, LOGS, CRAFT_PLANKS, REFUSED, CRAFT_STICKS])
    assert steps is not None
    assert [c for c, _ in steps] == [BAMBOO, CRAFT_STICKS]
    assert steps[-1][1].startswith("Crafted 2 minecraft:stick")
    assert shortest_solution(env, env.task(FENCE), [BAMBOO, LOGS, CRAFT_PLANKS]) is None  # not solved


def test_a_command_outside_the_targets_grammar_is_refused_even_when_the_env_accepts_it():
    env = TextCraftEnv()
    task = env.task(PLANKS)
    env.reset(PLANKS)
    assert env.step("get 1 acacia log").info["ok"]  # the env reads the singular
    assert regex.fullmatch(env.command_pattern(task), "get 1 acacia log") is None  # the grammar does not
    assert shortest_solution(env, task, ["get 1 acacia log", CRAFT_PLANKS]) is None
    assert [c for c, _ in shortest_solution(env, task, [LOGS, CRAFT_PLANKS])] == [LOGS, CRAFT_PLANKS]


def test_relabel_keeps_the_shortest_distinct_solutions_per_goal_in_target_order():
    found = relabel([fence_tree()], TextCraftEnv, targets(), HindsightConfig(per_goal=2))
    assert [(r.task.id, [c for c, _ in r.steps]) for r in found] == [
        (PLANKS, [LOGS, CRAFT_PLANKS]),
        (STICK, [BAMBOO, CRAFT_STICKS]),  # both paths cut to the same two commands: one entry
    ]
    assert found[0].source["from_task"] == FENCE and not found[0].source["own_goal"]
    assert found[0].first_observation == TextCraftEnv().reset(PLANKS)


class ForcedPolicy:
    """A policy double that honours the forced command of the request's grammar and names the goal of
    its prompt in its THOUGHT (as the real policy, asked under the relabelled prompt, would)."""

    name = "forced"

    def __init__(self, cut_at: str | None = None, status: str = "CONTINUE") -> None:
        self.requests, self.cut_at, self.status = [], cut_at, status

    def sample(self, requests):
        out = []
        for r in requests:
            self.requests.append(r)
            goal = r.prompt[1]["content"].split("\n")[0]
            command = r.params.grammar.command.replace("\\", "")
            text = f"THOUGHT: {goal}\nACTION: {command}\nEXPLANATION: e\nSTATUS: {self.status}"
            assert regex.fullmatch(r.params.grammar.regex, text) and r.params.temperature == 0.0
            out.append([Completion(text, finish_reason="length" if command == self.cut_at else "stop")])
        return out

    def logprobs(self, prompts, completions):
        return [None] * len(prompts)


def test_rationalised_rows_are_the_policys_texts_around_the_forced_commands_under_the_target_prompt():
    found = relabel([fence_tree()], TextCraftEnv, targets())
    policy = ForcedPolicy()
    samples = rationalize(policy, found, TextCraftEnv().describe())
    assert len(policy.requests) == 4  # two steps each, batched by step index (2 calls)
    planks = samples[0]
    assert planks.kind == "hindsight" and planks.task.id == PLANKS and planks.task.goal == "craft 1 acacia planks"
    rows = to_step_rows(planks)
    assert [r["completion"][0]["content"].split("\nACTION: ")[1].split("\n")[0] for r in rows] == [LOGS, CRAFT_PLANKS]
    assert all("acacia planks" in r["completion"][0]["content"].split("\n")[0] for r in rows)
    assert "Got 1 acacia logs" in rows[1]["prompt"][1]["content"]  # the target's own observation
    assert planks.turns[-1].observation is None and all(t.trains for t in planks.turns)


def test_a_text_cut_by_the_token_limit_drops_its_episode():
    found = relabel([fence_tree()], TextCraftEnv, targets())
    samples = rationalize(ForcedPolicy(cut_at=CRAFT_STICKS), found, TextCraftEnv().describe())
    assert [s.task.id for s in samples] == [PLANKS]


def test_an_episode_whose_text_ends_it_before_its_last_step_is_dropped():
    """Only the command is forced: a STATUS other than CONTINUE before the last step would teach stopping
    (search and evaluation end an episode on it)."""
    found = relabel([fence_tree()], TextCraftEnv, targets())
    assert rationalize(ForcedPolicy(status="SUCCESS"), found, TextCraftEnv().describe()) == []
    assert len(rationalize(ForcedPolicy(), found, TextCraftEnv().describe())) == 2


def test_an_env_that_cannot_say_what_a_state_achieves_is_refused_by_name():
    class NoHindsight(TextCraftEnv):
        achieves = None  # type: ignore[assignment]

    with pytest.raises(ConfigError, match="NoHindsight cannot relabel goals"):
        relabel([fence_tree()], NoHindsight, targets())
