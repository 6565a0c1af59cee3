"""Dashboard reads: which databases are shown, refused or reported empty, and cache invalidation."""

from __future__ import annotations

from pathlib import Path

from doubles import ScriptedGenerator, SnapshotLineEnv

from dashboard import data
from engine.config import SearchConfig
from engine.search.runner import new_run
from engine.store import Store


def test_missing_and_empty_files_are_reported_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nothing" / "orchard.db"
    assert data.db_problem(missing) == ("empty", data.NO_RUNS)
    assert not missing.exists() and not missing.parent.exists()
    blank = tmp_path / "blank.db"
    blank.touch()
    assert data.db_problem(blank) == ("empty", data.NO_RUNS)
    assert blank.stat().st_size == 0


def test_orchard_db_without_runs_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    Store(path).close()
    assert data.db_problem(path) == ("empty", data.NO_RUNS)


def test_foreign_db_is_one_line_error(foreign_db: Path) -> None:
    before = foreign_db.read_bytes()
    kind, message = data.db_problem(foreign_db)
    assert kind == "error" and "not Orchard's" in message and "\n" not in message
    assert foreign_db.read_bytes() == before


def test_fixture_db_has_runs(store_db) -> None:
    path, runs = store_db
    assert data.db_problem(path) is None
    listed = data.list_runs(str(path), data.db_version(path))
    assert {r.id for r in listed} == set(runs.values())


def test_version_is_stable_across_reads_and_changes_on_commit(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    env = SnapshotLineEnv()
    cfg = SearchConfig(simulations=2, k=2, depth_limit=3)
    with Store(path) as store:
        new_run(store, "line", env.tasks()[:1], ScriptedGenerator(), cfg, "a", make_env=SnapshotLineEnv)
    v1 = data.db_version(path)
    assert data.db_problem(path) is None and data.read_tree(str(path), 1) is not None
    assert data.db_version(path) == v1  # reading does not look like a change
    with Store(path) as store:
        new_run(store, "line", env.tasks()[:1], ScriptedGenerator(), cfg, "b", make_env=SnapshotLineEnv)
    v2 = data.db_version(path)
    assert v2 != v1
    assert [r.name for r in data.list_runs(str(path), v2)] == ["a", "b"]


def test_db_path_prefers_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ORCHARD_DB", str(tmp_path / "x.db"))
    assert data.db_path() == tmp_path / "x.db"
    monkeypatch.delenv("ORCHARD_DB")
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))
    assert data.db_path() == tmp_path / "home" / "orchard.db"
