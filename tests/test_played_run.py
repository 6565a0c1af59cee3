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
        run_id, stats, episodes = play_run(store, "line", tasks, ScriptedGenerator(p_right=0.4), PLAY, "play",
                                           make_env=make)
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
        _, stats, episodes = play_run(store, "line", tasks, ScriptedGenerator(p_right=0.9), PLAY, "all",
                                      make_env=make, skip_greedy_solved=False)
        assert stats.greedy_solved == 0 and stats.played == len(episodes) == 3
        with pytest.raises(ConfigError, match="mode"):
            play_run(store, "line", tasks, ScriptedGenerator(), EvalConfig(mode="greedy"), "no", make_env=make)
