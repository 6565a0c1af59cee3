"""TextWorld adapter: cached offline games, admissible commands, walkthrough expert, replay == copy
restore, and a stored MCTS run. Two small cooking games, generated once into the cache."""

from __future__ import annotations

import pytest

pytest.importorskip("textworld")

from envtools import check_search, stored_search

from engine.envs.base import EnvError, SupportsSnapshot
from engine.envs.check import check_env
from engine.envs.registry import env_factory
from engine.envs.textworld_games import TextWorldCopyEnv, TextWorldEnv

ENV_SPEC = "textworld:cooking?n=2"


@pytest.fixture(scope="module")
def env() -> TextWorldEnv:
    return env_factory(ENV_SPEC)()


@pytest.mark.slow
def test_games_are_cached_and_listed(env: TextWorldEnv) -> None:
    tasks = env.tasks("train")
    assert [t.id for t in tasks] == ["train-0", "train-1"]
    assert all(t.goal.startswith("You are hungry!") for t in tasks)  # the game's objective
    paths = [t.meta["game"] for t in tasks]
    assert len(set(paths)) == 2 and all(p.endswith(".z8") for p in paths)
    again = env_factory(ENV_SPEC)().tasks("train")  # a second env reads the same cached files
    assert [t.meta["game"] for t in again] == paths
    assert not isinstance(env, SupportsSnapshot)  # replay is the measured-faster default
    assert isinstance(env_factory(ENV_SPEC + "&restore=copy")(), TextWorldCopyEnv)
    with pytest.raises(EnvError, match="unknown TextWorld challenge"):
        TextWorldEnv("zork")
    with pytest.raises(EnvError, match="restore must be"):
        TextWorldEnv("cooking?restore=fast")


def test_walkthrough_wins_each_game(env: TextWorldEnv) -> None:
    for task in env.tasks("train"):
        first = env.reset(task.id)
        assert "Valid commands:" in first
        walkthrough = env.expert(task.id)
        assert walkthrough
        for command in walkthrough:
            assert command in env.valid_commands() or command in ("inventory", "look")
            step = env.step(command)
        assert step.done and step.reward == 1.0 and step.progress == 1.0, task.id


def test_unknown_command_changes_nothing(env: TextWorldEnv) -> None:
    env.reset("train-0")
    bad = env.step("fly to the moon")
    assert not bad.done and bad.reward == 0.0
    walk = env.expert("train-0")[:3]
    a = [env.step(c).observation for c in walk]
    env.reset("train-0")
    assert [env.step(c).observation for c in walk] == a


@pytest.mark.parametrize("restore", ["replay", "copy"])
@pytest.mark.slow
def test_the_env_contract_holds(restore: str) -> None:
    """check_env on the walkthroughs: determinism, replay == copy snapshot, step after the win, close."""
    checked = check_env(env_factory(f"{ENV_SPEC}&restore={restore}")(), max_steps=40)
    assert "step-after-done" in checked and "close" in checked
    assert ("snapshot-equals-replay" in checked) == (restore == "copy")


def test_copy_snapshot_survives_being_restored_from() -> None:
    env = env_factory(ENV_SPEC + "&restore=copy")()
    walk = env.expert("train-1")
    env.reset("train-1")
    env.step(walk[0])
    snap = env.snapshot()
    rest = [env.step(c) for c in walk[1:]]
    env.restore(snap)
    env.step(walk[1])
    env.restore(snap)  # the copy restored from is not the one the env went on with
    assert env.step(walk[1]).observation == rest[0].observation
    env.close()


def test_mcts_run_stores_trees(tmp_path, env: TextWorldEnv) -> None:
    tasks = env.tasks("train")
    commands = sorted({c for t in tasks for c in env.expert(t.id)} | {"look"})
    stats, trees = stored_search(tmp_path, ENV_SPEC, env_factory(ENV_SPEC), tasks, commands)
    check_search(stats, trees, 2)
    assert stats.replays > 0
