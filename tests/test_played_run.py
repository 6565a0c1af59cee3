"""MCTS at inference stored as a search run (engine/search/played.py): the tasks greedy fails, each
played episode's tree in the store, the counts the loop records."""

from __future__ import annotations

from pathlib import Path

import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv

from engine.config import ConfigError
from engine.evaluate import EvalConfig
from engine.search.played import play_run
from engine.store import Store

PLAY = EvalConfig(mode="mcts", seeds=(3,), max_steps=8, mcts_simulations=5, mcts_k=3, bootstrap=50)


def test_a_play_run_stores_the_greedy_failures_trees_as_played(tmp_path: Path) -> None:
    make = lambda: SnapshotLineEnv(6)
    tasks = make().tasks("train")
    with Store(tmp_path / "o.db") as store:
        run_id, stats, episodes, greedy = play_run(store, "line", tasks, ScriptedGenerator(p_right=0.4), PLAY,
                                                   "play", make_env=make)
        assert [e.task_id for e in greedy] == [t.id for t in tasks]  # the greedy pass, every task
        assert {e.task_id for e in episodes} == {e.task_id for e in greedy if not e.success}
        info = store.run(run_id)
        assert info.status == "finished" and info.config["mode"] == "mcts at inference" and info.config["seed"] == 3
        assert stats.tasks == 6 and stats.played == len(episodes) == info.trees == 6 - stats.greedy_solved
        assert 0 < stats.played and stats.solved == sum(e.success for e in episodes)
        # A tree may hold a success its episode did not reach (found below the last step's horizon).
        assert info.solved >= stats.solved
        assert stats.simulations == 5 * sum(e.steps for e in episodes)
        for (tree_id, task_id), episode in zip(store.tree_ids(run_id), episodes, strict=True):
            stored = store.load_tree(tree_id)
            assert stored is not None and task_id == episode.task_id
            assert len(stored.nodes) == len(episode.tree.nodes)
            [sim] = stored.simulations
            assert [stored.nodes[i].action.command for i in sim.path] == episode.commands
            assert (stored.nodes[sim.path[-1]].terminal == "success") == episode.success
            assert sim.reward == (1.0 if episode.success else stored.nodes[sim.path[-1]].reward or 0.0)
        assert info.stats["simulations_per_s"] > 0


def test_a_play_run_can_play_every_task_and_refuses_other_modes(tmp_path: Path) -> None:
    make = lambda: SnapshotLineEnv(3)
    tasks = make().tasks("train")
    with Store(tmp_path / "o.db") as store:
        _, stats, episodes, greedy = play_run(store, "line", tasks, ScriptedGenerator(p_right=0.9), PLAY, "all",
                                            make_env=make, skip_greedy_solved=False)
        assert stats.greedy_solved == 0 and stats.played == len(episodes) == 3 and greedy == []
        with pytest.raises(ConfigError, match="mode"):
            play_run(store, "line", tasks, ScriptedGenerator(), EvalConfig(mode="greedy"), "no", make_env=make)


def test_sampled_episodes_merge_into_a_monte_carlo_tree() -> None:
    """Hand-worked: three episodes from one start, A->B (success, 1.0), A->C (failure, 0.0) and a format
    error; A is one node visited twice with mean 0.5, the root visited three times with mean 1/3."""
    from doubles import action_text

    from engine.evaluate import Episode
    from engine.search.played import sampled_tree

    task = SnapshotLineEnv(3).tasks("train")[0]
    a, b, c = (action_text(cmd, "CONTINUE") for cmd in ("right", "wait", "left"))
    episodes = [
        Episode(task.id, 0, success=True, reward=1.0, terminal="success", turns=[(a, "at 1"), (b, "done")],
                first_observation="at 0"),
        Episode(task.id, 1, reward=0.0, terminal="failure", turns=[(a, "at 1"), (c, "fell")], first_observation="at 0"),
        Episode(task.id, 2, reward=0.0, terminal="format_error", turns=[("gibberish", "")], first_observation="at 0"),
    ]
    tree, firsts = sampled_tree(task, episodes)
    root = tree.root
    assert root.observation == "at 0" and (root.N, root.value_sum) == (3, 1.0)
    assert [tree.nodes[i].raw for i in root.children] == [a, "gibberish"]
    node_a = tree.nodes[root.children[0]]
    assert (node_a.N, node_a.Q_mcts) == (2, 0.5) and node_a.terminal is None and node_a.action.command == "right"
    assert [(tree.nodes[i].action.command, tree.nodes[i].terminal, tree.nodes[i].reward) for i in node_a.children] == [
        ("wait", "success", 1.0), ("left", "failure", 0.0)]
    bad = tree.nodes[root.children[1]]
    assert bad.format_error and bad.terminal == "format_error" and bad.action is None
    assert [s.path for s in tree.simulations] == [(1, 2), (1, 3), (4,)]
    assert [s.reward for s in tree.simulations] == [1.0, 0.0, 0.0]
    assert firsts == [0, 3, 4]  # the first node each simulation writes (the first writes the root too)
    assert tree.solved()


def test_a_sampled_play_run_stores_each_failed_tasks_samples_as_one_tree(tmp_path: Path) -> None:
    make = lambda: SnapshotLineEnv(6)
    tasks = make().tasks("train")
    play = EvalConfig(mode="sampled", seeds=(5, 6, 7, 8), max_steps=8, temperature=1.0, bootstrap=50)
    with Store(tmp_path / "o.db") as store:
        run_id, stats, episodes, _ = play_run(store, "line", tasks, ScriptedGenerator(p_right=0.4), play, "sampled",
                                           make_env=make)
        info = store.run(run_id)
        assert info.config["mode"] == "sampled episodes" and info.config["samples"] == 4
        assert stats.played == info.trees == 6 - stats.greedy_solved > 0
        assert len(episodes) == stats.simulations == 4 * stats.played
        assert stats.solved == len({e.task_id for e in episodes if e.success}) == info.solved
        for k, (tree_id, task_id) in enumerate(store.tree_ids(run_id)):
            stored = store.load_tree(tree_id)
            mine = episodes[4 * k:4 * k + 4]
            assert stored is not None and {e.task_id for e in mine} == {task_id}
            assert stored.root.N == 4 and len(stored.simulations) == 4
            for sim, e in zip(stored.simulations, mine, strict=True):
                assert [stored.nodes[i].raw for i in sim.path] == [text for text, _ in e.turns]
                assert sim.reward == e.reward
