"""BabyAI adapter: text view, commands, snapshots, the bot as expert, and a stored MCTS run."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("minigrid")

from envtools import check_search, stored_search

from engine.envs.babyai import COMMANDS, BabyAIEnv, describe_view
from engine.envs.base import EnvError, SupportsSnapshot, SupportsValidCommands
from engine.envs.check import check_env
from engine.envs.registry import env_factory


@pytest.fixture(scope="module")
def env() -> BabyAIEnv:
    return BabyAIEnv("GoToLocal?n=4")


def test_registry_spec_and_tasks(env: BabyAIEnv) -> None:
    made = env_factory("babyai:GoToLocal?n=4")()
    assert isinstance(made, BabyAIEnv) and made.level == "BabyAI-GoToLocal-v0"
    assert isinstance(made, SupportsSnapshot) and isinstance(made, SupportsValidCommands)
    train, test = env.tasks("train"), env.tasks("test")
    assert [t.id for t in train] == ["train-0", "train-1", "train-2", "train-3"]
    assert {t.meta["seed"] for t in train}.isdisjoint({t.meta["seed"] for t in test})
    assert all(t.goal.startswith("go to") for t in train + test)  # the level's mission
    with pytest.raises(EnvError, match="unknown BabyAI level"):
        BabyAIEnv("NoSuchLevel")
    with pytest.raises(EnvError, match="unknown BabyAI task id"):  # the message lists the ids
        env.task("train-99")
    with pytest.raises(EnvError, match="unknown option"):
        BabyAIEnv("GoToLocal?speed=3")


def test_view_description_is_faithful() -> None:
    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = 1  # empty
    image[3, 5] = (6, 0, 0)  # red ball directly ahead
    image[1, 4] = (4, 2, 2)  # locked blue door 2 forward, 2 left
    image[3, 0] = (2, 5, 0)  # wall 6 ahead
    text = describe_view(image, None, 3)
    assert "You are facing north." in text
    assert "Directly in front of you: a red ball." in text
    assert "a locked blue door 2 steps forward and 2 steps to the left" in text
    assert "There is a wall 6 steps forward." in text
    assert text.endswith("You are carrying nothing.")


def test_reset_step_and_unknown_commands(env: BabyAIEnv) -> None:
    first = env.reset("train-0")
    assert "Directly in front of you" in first
    bad = env.step("jump")
    assert not bad.info["ok"] and "valid commands are" in bad.observation and not bad.done
    turned = env.step("Turn Left.")
    assert turned.info["ok"] and turned.observation != first
    assert env.valid_commands() == list(COMMANDS)


def test_the_env_contract_holds() -> None:
    """check_env on the bot's episodes: determinism, replay == snapshot, no aliasing, close, ..."""
    checked = check_env(BabyAIEnv("GoToLocal?n=3"), max_steps=40)
    assert {"step-after-done", "snapshot-not-aliased", "snapshot-equals-replay", "close"} <= set(checked)


@pytest.mark.parametrize("level", ["GoToLocal", "PickupLoc", "OpenDoor", "UnlockLocal"])
def test_bot_expert_reaches_reward_one(level: str) -> None:
    env = BabyAIEnv(f"{level}?n=3")
    for task in env.tasks("train") + env.tasks("test")[:1]:
        env.reset(task.id)
        commands = env.expert(task.id)
        assert commands and all(c in COMMANDS for c in commands)
        steps = [env.step(c) for c in commands]
        assert steps[-1].done and steps[-1].reward == 1.0, (level, task.id)
        assert not any(s.done for s in steps[:-1])


def test_mcts_run_stores_trees(tmp_path) -> None:
    env = BabyAIEnv("GoToLocal?n=2")
    stats, trees = stored_search(tmp_path, "babyai:GoToLocal?n=2", lambda: BabyAIEnv("GoToLocal?n=2"),
                                 env.tasks("train"), list(COMMANDS))
    check_search(stats, trees, 2)
    assert stats.restores > 0  # snapshots, not replays


def test_a_command_that_changes_nothing_is_a_refused_turn_for_corrections(env: BabyAIEnv) -> None:
    """corrections' refused-step rule on BabyAI: its snapshots are deep copies of the gym env (never ==) and
    count steps, so the env compares them by the world they hold (same_state); a drop with empty hands and a
    move into a wall change nothing, a turn does."""
    from engine.datasets.corrections import refused_turns
    from engine.evaluate import Episode

    env.reset("train-0")
    commands = ["drop", "turn left"]
    for c in commands:
        env.step(c)
    while True:  # walk until blocked, then once more into what blocks
        before = env.snapshot()
        env.step("go forward")
        commands.append("go forward")
        if env.same_state(before, env.snapshot()):
            break
        assert len(commands) < 12
    start = env.reset("train-0")
    first, again = env.snapshot(), env.snapshot()
    assert first != again and env.same_state(first, again)  # why == cannot tell: two copies of one state differ
    env.step("turn left")
    assert not env.same_state(first, env.snapshot())
    turns = [(f"THOUGHT: go\nACTION: {c}", "") for c in commands]
    e = Episode(task_id="train-0", seed=0, success=False, steps=len(turns), commands=commands, turns=turns,
                first_observation=start)
    assert refused_turns(env, e) == {0, len(commands) - 1}
