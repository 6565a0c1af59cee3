"""ScienceWorld adapter: tasks and splits, gold paths reach reward 1, deterministic replay, the
bounded JVM pool shared by several envs, snapping, and a stored MCTS run. One or two JVMs."""

from __future__ import annotations

import pytest

pytest.importorskip("scienceworld")

from envtools import check_search, stored_search

from engine.envs import scienceworld as sw
from engine.envs.base import EnvError, SupportsSnapshot, SupportsValidCommands
from engine.envs.check import check_env
from engine.envs.registry import env_factory

ENV_SPEC = "scienceworld:boil,melt?vars=1"


@pytest.fixture(scope="module")
def env() -> sw.ScienceWorldEnv:
    return env_factory(ENV_SPEC)()


def test_tasks_and_splits(env: sw.ScienceWorldEnv) -> None:
    train, dev, test = env.tasks("train"), env.tasks("dev"), env.tasks("test")
    assert [t.id for t in train] == ["boil-0", "melt-0"]  # the first train variation of each task
    assert len(dev) == 2 and len(test) == 2
    assert not {t.id for t in train} & {t.id for t in test}
    assert train[0].goal.startswith("Your task is to boil")
    assert not isinstance(env, SupportsSnapshot) and isinstance(env, SupportsValidCommands)
    with pytest.raises(EnvError, match="unknown ScienceWorld task 'fly'"):
        env_factory("scienceworld:fly?vars=1")().tasks()
    with pytest.raises(EnvError, match="unknown ScienceWorld split"):
        env.tasks("validation")


@pytest.mark.slow
def test_gold_paths_reach_reward_one(env: sw.ScienceWorldEnv) -> None:
    for task in env.tasks("train") + env.tasks("test")[:1]:
        env.reset(task.id)
        for command in env.expert(task.id):
            step = env.step(command)
            if step.done:
                break
        assert step.done and step.reward == 1.0 and step.progress == 1.0, task.id
        assert step.info["score"] == 100


@pytest.mark.slow
def test_replay_is_deterministic_and_envs_share_the_pool(env: sw.ScienceWorldEnv) -> None:
    gold = env.expert("boil-0")[:6]
    env.reset("boil-0")
    alone = [env.step(c).observation for c in gold]
    other = env_factory(ENV_SPEC)()
    other.reset("melt-0")
    env.reset("boil-0")
    interleaved = []
    for c in gold:  # the other env steps in between, so the JVM must be brought back by replay
        interleaved.append(env.step(c).observation)
        other.step("look around")
    assert interleaved == alone
    assert sw.pool().started <= sw.pool().size


def test_snapping_to_the_nearest_valid_action(env: sw.ScienceWorldEnv) -> None:
    env.reset("boil-0")
    valid = env.valid_commands()
    assert "look around" in valid and len(valid) > 50
    step = env.step("go to kitchn")
    assert step.info.get("snapped") in valid and step.observation.startswith("(interpreted as")
    unsnapped = env_factory(ENV_SPEC + "&snap=0")()
    unsnapped.reset("boil-0")
    assert unsnapped.step("xyzzy plugh").observation.strip() == sw.NO_MATCH


def test_the_env_contract_holds() -> None:
    """check_env on the gold paths' first steps: determinism and replay through the shared pool, close."""
    checked = check_env(checked_env := env_factory(ENV_SPEC)(), max_steps=6, max_tasks=2)
    assert {"replay-deterministic", "reset-deterministic", "close"} <= set(checked)
    assert not [j for j in sw.pool()._jvms if j.sync and j.sync[0] == checked_env._token]  # claim given up


def test_pool_is_bounded_and_times_out(monkeypatch) -> None:
    small = sw.JvmPool(1)
    small._jvms.append(sw._Jvm(sw=object(), busy=True))  # the only process is leased
    monkeypatch.setattr(sw, "LEASE_TIMEOUT_S", 0.2)
    with pytest.raises(EnvError, match="no ScienceWorld process free"):
        small._acquire(token=1)
    with pytest.raises(EnvError, match="at least 1"):
        sw.JvmPool(0)


def test_mcts_run_stores_trees(tmp_path, env: sw.ScienceWorldEnv) -> None:
    tasks = env.tasks("train")[:1]
    commands = env.expert(tasks[0].id)[:4] + ["look around"]
    stats, trees = stored_search(tmp_path, ENV_SPEC, env_factory(ENV_SPEC), tasks, commands, simulations=2, depth=3)
    check_search(stats, trees, 1, simulations=2)
