"""The Tree explorer's steering form (issue 28): at the selected node, "Add branch" queues a human
branch only when the action reads and the env takes it (else the message is at the field and nothing
is queued or stored), "Search here" and "More candidates" queue their jobs, a human-authored node is
marked on the tree and in the inspector, and with users defined nobody logged out can queue anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import APP, XssLineEnv, chart_datasets, copy_store
from doubles import ScriptedGenerator
from streamlit.testing.v1 import AppTest

from engine import auth
from engine.envs import registry
from engine.jobs.kinds import load_job
from engine.progress import MemoryReporter
from engine.search.steer import run_steer
from engine.store import Store

TREE_PAGE = "views/tree_explorer.py"
TASK = "goal-4"


@pytest.fixture()
def steer_db(store_db, tmp_path: Path, monkeypatch) -> tuple[Path, str]:
    source, runs = store_db
    db = copy_store(source, tmp_path / "steer.db")
    monkeypatch.setenv("ORCHARD_DB", str(db))
    monkeypatch.setattr(registry, "env_factory", lambda spec: XssLineEnv)  # the fixture runs' env
    return db, runs["main"]


def _page(run_id: str, node: int = 0) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task=TASK, node=str(node))
    return at.run()


def _click(at: AppTest, label: str) -> AppTest:
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _jobs(db: Path) -> list:
    with Store(db, readonly=True) as store:
        return store.jobs()


def _messages(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in ("error", "success", "caption", "text") for e in getattr(at, kind))


def _free_command(db: Path, run_id: str) -> str:
    with Store(db, readonly=True) as store:
        tree = store.load_tree(store.tree_id(run_id, TASK))
    taken = {tree.nodes[c].action.command for c in tree.root.children if tree.nodes[c].action}
    return next(c for c in ("left", "right", "wait") if c not in taken)


def test_add_branch_refuses_bad_input_at_the_field_then_queues_and_marks_the_human_node(steer_db) -> None:
    db, run_id = steer_db
    at = _page(run_id)
    assert not at.exception
    with Store(db, readonly=True) as store:
        before = len(store.load_tree(store.tree_id(run_id, TASK)).nodes)

    at.text_area(key="te_steer_action").input("THOUGHT: <b>no</b> command")
    at = _click(at, "Add branch")
    errors = [e.value for e in at.error]
    assert any("no ACTION section" in e for e in errors), errors
    assert not _jobs(db)

    command = _free_command(db, run_id)
    at.text_area(key="te_steer_action").input(command)
    at = _click(at, "Add branch")
    assert not at.exception
    (job,) = _jobs(db)
    assert job.kind == "add_action" and job.config["action"] == command and job.config["at"] == 0
    assert "Queued job" in _messages(at)

    # the worker's part: the job's body with the test doubles
    run_steer(Store(db), load_job(job.kind, job.config), MemoryReporter(), generator=ScriptedGenerator(),
              make_env=XssLineEnv)
    at = _page(run_id, node=before)
    assert not at.exception
    assert any("HUMAN-AUTHORED" in c.value for c in at.caption)
    human = chart_datasets(at)["human"]
    assert len(human) == 1  # one teal square on the tree

    at = _page(run_id, node=before)
    at.number_input(key="te_steer_n").set_value(3)
    at = _click(at, "Search here")
    kinds = [j.kind for j in _jobs(db)]
    assert kinds.count("search_here") == 1
    search = next(j for j in _jobs(db) if j.kind == "search_here")
    assert search.config["simulations"] == 3 and search.config["at"] == before
    at = _click(at, "More candidates")
    assert [j.kind for j in _jobs(db)].count("more_candidates") == 1


def test_with_users_a_logged_out_visitor_queues_nothing_and_a_maintainer_may(steer_db) -> None:
    db, run_id = steer_db
    with Store(db) as store:
        auth.add_user(store, "mia", "maintainer", "a-long-password-1")
    at = _page(run_id)
    at.text_area(key="te_steer_action").input("right")
    assert next(b for b in at.button if b.label == "Add branch").disabled
    assert any("log in" in c.value.lower() for c in at.caption)
    assert not _jobs(db)
    at.text_input(key="auth_name").input("mia")
    at.text_input(key="auth_password").input("a-long-password-1")
    at = _click(at, "Log in")
    at.text_area(key="te_steer_action").input(_free_command(db, run_id))
    at = _click(at, "Add branch")  # a maintainer may
    assert [j.kind for j in _jobs(db)] == ["add_action"]
