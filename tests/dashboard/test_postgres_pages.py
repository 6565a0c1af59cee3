"""Every dashboard page on a PostgreSQL store (the fixture store copied there with `orchard db copy`),
and the reads behind them: an empty schema is "empty", a commit changes the cache token."""

from __future__ import annotations

import psycopg_guard  # noqa: F401 - skips this module without psycopg
import pytest
from dash_fixtures import APP
from pg_fixture import PgSchemas
from streamlit.testing.v1 import AppTest

from dashboard import data
from engine.store import Store
from engine.store.copy import copy_store

PAGES = ["views/runs.py", "views/tree_explorer.py", "views/trajectories.py", "views/pairs.py",
         "views/refinement.py", "views/training.py", "views/evaluation.py"]


@pytest.fixture()
def pg(pg_server):
    schemas = PgSchemas(pg_server)
    yield schemas
    schemas.drop()


@pytest.fixture()
def pg_store(store_db, pg, monkeypatch) -> tuple[str, dict[str, str]]:
    path, runs = store_db
    url = pg.new()
    copy_store(path, url)
    monkeypatch.setenv("ORCHARD_DB", url)
    return url, runs


def test_empty_schema_is_empty_and_a_commit_changes_the_version(pg) -> None:
    url = pg.new()
    assert data.db_problem(url) == ("empty", data.NO_RUNS)
    with Store(url):
        pass
    assert data.db_problem(url) == ("empty", data.NO_RUNS)
    v1 = data.db_version(url)
    with Store(url) as store:
        store.create_job("sft", {}, "cpu")
    assert data.db_version(url) != v1


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_from_postgresql(pg_store, page) -> None:
    _url, runs = pg_store
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error], [e.value for e in at.error]
    if page == "views/runs.py":
        shown = " ".join(str(df.value.to_dict()) for df in at.dataframe) + " ".join(m.value for m in at.markdown)
        assert any(r in shown for r in runs.values())


def test_curating_a_pair_on_postgresql_saves_and_refuses_a_stale_save(pg_store) -> None:
    """The pairs page's writes on a server store (the same interaction as test_curation_pages)."""
    url, runs = pg_store
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/pairs.py")
    at.query_params["run"], at.query_params["task"] = runs["main"], "goal-4"
    at.run()
    at.text_input(key="who").input("alice").run()
    first = at.query_params["pair"]
    at.button(key="pp_approve_next").click().run()
    assert not at.exception
    with Store(url) as store:
        saved = store.pair(first)
        assert (saved.status, saved.updated_by, saved.version) == ("approved", "alice", 2)
        second = at.query_params["pair"]
        store.set_pair_status(second, "rejected", "bob", expected_version=1)  # between load and save
    at.button(key="pp_approve").click().run()
    assert not at.exception and any("NOT saved" in w.value for w in at.warning)
    with Store(url) as store:
        assert (store.pair(second).status, store.pair(second).updated_by) == ("rejected", "bob")
