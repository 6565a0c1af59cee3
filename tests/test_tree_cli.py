"""`orchard tree add-action|more-candidates` and `orchard search --resume RUN --task T --at NODE`
(engine/cli/tree.py, engine/search/steer.py): they grow the stored tree, and bad input is one line
on stderr, exit 2, nothing stored. The fast tests use the line env and the scripted policy of
tests/doubles.py in place of the run's env and model; the slow one runs TextCraft with the tiny model."""

from __future__ import annotations

import pytest
from doubles import LineEnv, ScriptedGenerator, SnapshotLineEnv

import engine.llm.registry as llm_registry
from engine.cli import main
from engine.config import SearchConfig
from engine.envs import registry
from engine.search.runner import new_run
from engine.store import Store

TASK = "goal-3"


@pytest.fixture
def line_run(tmp_path, monkeypatch):
    """A stored line-env run; the CLI's env and model loaders give the doubles."""
    db = tmp_path / "o.db"
    with Store(db) as store:
        run_id, _ = new_run(store, "line", [LineEnv().task(TASK)], ScriptedGenerator(),
                            SearchConfig(simulations=3, k=2, depth_limit=6), "cli-steer", make_env=SnapshotLineEnv)
    monkeypatch.setattr(registry, "env_factory", lambda spec: SnapshotLineEnv)
    monkeypatch.setattr(llm_registry, "load_generator", lambda spec, **kw: ScriptedGenerator())
    return db, run_id


def _tree(db, run_id):
    with Store(db) as store:
        return store.load_tree(store.tree_id(run_id, TASK))


def _free_command(tree, node=0):
    taken = {tree.nodes[c].action.command for c in tree.nodes[node].children if tree.nodes[c].action}
    return next(c for c in ("left", "right", "wait") if c not in taken)


def test_add_action_stores_a_human_child(line_run, capsys):
    db, run_id = line_run
    before = _tree(db, run_id)
    command = _free_command(before)
    assert main(["tree", "add-action", "cli-steer", "--task", TASK, "--at", "0", "--action", command,
                 "--db", str(db)]) == 0
    assert f"human branch node {len(before.nodes)}" in capsys.readouterr().err
    tree = _tree(db, run_id)
    child = tree.nodes[len(before.nodes)]
    assert (child.author, child.parent, child.action.command) == ("human", 0, command)
    assert tree.check_invariants() == [] and len(tree.simulations) == len(before.simulations) + 1


@pytest.mark.parametrize(("args", "words"), [
    (["--at", "0", "--action", "THOUGHT: nothing to do"], "no ACTION section"),
    (["--at", "42", "--action", "right"], "node 42: no such node"),
    (["--at", "0", "--action", ""], "'action' must be a non-empty string"),
])
def test_add_action_refusals_are_one_line_and_store_nothing(line_run, capsys, args, words):
    db, run_id = line_run
    before = _tree(db, run_id)
    assert main(["tree", "add-action", run_id, "--task", TASK, *args, "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("orchard: error: ") and words in err and "\n" not in err
    after = _tree(db, run_id)
    assert (len(after.nodes), len(after.simulations)) == (len(before.nodes), len(before.simulations))


def test_search_here_and_more_candidates(line_run, capsys):
    db, run_id = line_run
    before = _tree(db, run_id)
    at = before.root.children[0]
    assert main(["search", "--resume", run_id, "--task", TASK, "--at", str(at), "--simulations", "4",
                 "--db", str(db)]) == 0
    assert f"4 simulations at node {at}" in capsys.readouterr().err
    tree = _tree(db, run_id)
    assert tree.check_invariants() == [] and tree.nodes[at].N == before.nodes[at].N + 4
    assert main(["tree", "more-candidates", run_id, "--task", TASK, "--at", "0", "--k", "3", "--db", str(db)]) == 0
    assert "more candidates" in capsys.readouterr().err
    grown = _tree(db, run_id)
    assert grown.check_invariants() == [] and len(grown.simulations) == len(tree.simulations) + 1
    assert main(["search", "--resume", run_id, "--at", "1", "--db", str(db)]) == 2
    assert "needs --resume RUN, --task T and --at NODE" in capsys.readouterr().err


@pytest.mark.slow
def test_textcraft_with_the_tiny_model_end_to_end(tmp_path, capsys):
    db = str(tmp_path / "o.db")
    assert main(["search", "--tasks", "0:1", "--simulations", "2", "--k", "2", "--name", "tc", "--db", db]) == 0
    with Store(db) as store:
        run_id = store.find_run("tc")
        task = store.tree_ids(run_id)[0][1]
    assert main(["tree", "add-action", "tc", "--task", task, "--at", "0", "--action", "inventory", "--db", db]) == 0
    assert main(["search", "--resume", "tc", "--task", task, "--at", "0", "--simulations", "2", "--db", db]) == 0
    with Store(db) as store:
        tree = store.load_tree(store.tree_id(run_id, task))
    assert tree is not None and tree.check_invariants() == []
    assert [n.action.command for n in tree.nodes if n.author == "human"] == ["inventory"]
