"""The Loop view's "human nodes" per iteration: the human-authored nodes of the iteration's search run
(issue 28 item 5), counted by the store (`Store.human_node_count`) and shown beside the search."""

from __future__ import annotations

from pathlib import Path

from dash_fixtures import APP
from doubles import ScriptedGenerator, SnapshotLineEnv
from streamlit.testing.v1 import AppTest
from test_store import add_human_branches

from engine.config import SearchConfig
from engine.search.runner import new_run
from engine.store import Store

EVALUATION = "views/evaluation.py"


def two_iterations(path: Path) -> tuple[str, str]:
    """A loop with a base record and two iterations whose search runs are real (run 1 with three human nodes)."""
    with Store(path) as store:
        runs = []
        for i in (1, 2):
            run_id, _ = new_run(store, "line", SnapshotLineEnv().tasks()[:2], ScriptedGenerator(),
                                SearchConfig(simulations=2, k=2, depth_limit=2), f"iteration-{i}",
                                make_env=SnapshotLineEnv)
            runs.append(run_id)
        add_human_branches(store, runs[0], 3)
        store.save_iteration("loop-h", 0, "agentq", {"model": "tiny"})
        for i, run_id in enumerate(runs, 1):
            store.save_iteration("loop-h", i, "agentq", {"run_id": run_id, "solved_in_search": 0, "pairs": 1,
                                                         "model": "tiny", "train": {"train_loss": 0.5}})
    return runs[0], runs[1]


def test_human_nodes_are_counted_per_search_run(db: Path) -> None:
    from dashboard import loop

    first, second = two_iterations(db)
    with Store(db, readonly=True) as store:
        counts = loop.human_counts(store, [first, second, first])
        each_tree = sum(len(store.human_nodes(t)) for t, _ in store.tree_ids(first))
    assert counts == {first: 3, second: 0} and each_tree == 3


def test_the_loop_view_shows_each_iterations_human_nodes(db: Path) -> None:
    two_iterations(db)
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    at.switch_page(EVALUATION)
    at.run()
    assert not at.exception, at.exception
    stages = next(d.value for d in at.dataframe if "human nodes" in d.value)
    assert list(stages["iteration"]) == ["base", "1", "2"]
    assert list(stages["human nodes"]) == ["—", "3", "0"]
