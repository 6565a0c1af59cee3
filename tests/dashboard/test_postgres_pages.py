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
