"""Fixtures for the dashboard tests (see dash_fixtures for what the stores contain)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from dash_fixtures import build_store


@pytest.fixture(scope="session")
def store_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("store") / "orchard.db"
    return path, build_store(path)


@pytest.fixture()
def db(tmp_path: Path, monkeypatch) -> Path:
    """An empty store of the test's own, which the app and the engine open through ORCHARD_DB."""
    path = tmp_path / "orchard.db"
    monkeypatch.setenv("ORCHARD_DB", str(path))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))
    return path


@pytest.fixture()
def foreign_db(tmp_path: Path) -> Path:
    path = tmp_path / "foreign.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES ('app', 'someone-else')")
    con.commit()
    con.close()
    return path


@pytest.fixture(autouse=True, scope="session")
def patient_browser_assertions() -> None:
    """Playwright's `expect` waits up to 20 s instead of 5: Streamlit loads its code-block component lazily,
    and on a loaded 2-core CI machine the first `st.code` on a page once took more than 5 s to appear
    after the page's headings (CI at stop 23). A wrong page still fails, only later."""
    try:
        from playwright.sync_api import expect
    except ImportError:
        return
    expect.set_options(timeout=20_000)
