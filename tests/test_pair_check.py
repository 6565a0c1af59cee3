"""bench/pair_check.py: a step pair is judged right / inverted / tied by the TextCraft expert."""

from __future__ import annotations

from collections import Counter

from bench.pair_check import command_helps, summary, verdict
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import TextCraftExpert


def _expert_commands(env: TextCraftEnv, task_id: str) -> list[str]:
    env.reset(task_id)
    expert, out = TextCraftExpert(env), []
    while True:
        command = expert.act().action.command
        out.append(command)
        if env.step(command).done:
            return out


def test_the_expert_move_is_right_and_a_wasted_one_inverted_or_tied() -> None:
    env = TextCraftEnv()
    task = next(t for t in env.tasks("train") if t.meta["depth"] == 2)
    moves = _expert_commands(env, task.id)
    assert len(moves) >= 2
    assert verdict(env, task.id, [], moves[0], "inventory") == "right"
    assert verdict(env, task.id, [], "inventory", moves[0]) == "inverted"
    assert verdict(env, task.id, [], "inventory", "craft 1 stick using 2 planks") == "tied"
    # From the state after the first move, repeating it is wasted; the expert's next move is not.
    assert verdict(env, task.id, moves[:1], moves[1], moves[0]) == "right"
    # The last move wins the task.
    assert verdict(env, task.id, moves[:-1], moves[-1], "inventory") == "right"


def test_command_helps_leaves_the_state_as_it_was() -> None:
    env = TextCraftEnv()
    task = env.tasks("train")[3]
    first = _expert_commands(env, task.id)[0]
    env.reset(task.id)
    before = env.snapshot()
    assert command_helps(env, first)
    assert env.snapshot() == before


def test_summary_gives_shares() -> None:
    line = summary(Counter(right=3, inverted=1, tied=4))
    assert line.startswith("8 step pairs") and "right 3 (0.38)" in line and "inverted 1 (0.12)" in line
