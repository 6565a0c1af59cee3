"""The `orchard` CLI: fast help, one-line errors with exit 2 and nothing written, runs, export."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx
from doubles import ScriptedGenerator, SnapshotLineEnv

from engine.cli import main
from engine.config import SearchConfig
from engine.search.runner import new_run
from engine.store import Store

ROOT = Path(__file__).resolve().parent.parent


def _orchard(*args, env=None):
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_help_is_fast_and_imports_nothing_heavy():
    t = time.perf_counter()
    out = _orchard("--help")
    assert out.returncode == 0 and "search" in out.stdout
    assert time.perf_counter() - t < 1.0
    code = ("import sys, engine.cli; print(sorted(m for m in ('torch','transformers','streamlit','pandas',"
            "'networkx') if m in sys.modules))")
    probe = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]"


def _one_line_error(out, *needles):
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("orchard: error:"), out.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_bad_inputs_are_one_line_errors_and_write_nothing(tmp_path):
    db = tmp_path / "o.db"
    _one_line_error(_orchard("search", "--env", "nosuch", "--db", str(db)), "unknown env", "nosuch")
    _one_line_error(_orchard("search", "--tasks", "5:2", "--db", str(db)), "bad task range")
    _one_line_error(_orchard("search", "--tasks", "0:99999", "--db", str(db)), "out of range", "train split")
    _one_line_error(_orchard("search", "--tasks", "0:x", "--db", str(db)), "bad task range")
    _one_line_error(_orchard("search", "--alpha", "3", "--db", str(db)), "alpha")
    _one_line_error(_orchard("search", "--tasks", "0:1", "--model", str(tmp_path / "nomodel"), "--db", str(db)),
                    "no such folder")
    assert not db.exists()
    junk = tmp_path / "junk.db"
    junk.write_text("hello, not sqlite")
    _one_line_error(_orchard("runs", "--db", str(junk)), "not an Orchard database")
    _one_line_error(_orchard("search", "--resume", "x", "--db", str(junk)), "not an Orchard database")
    assert junk.read_text() == "hello, not sqlite"


def _line_run(db):
    with Store(db) as store:
        env = SnapshotLineEnv()
        run_id, _ = new_run(store, "line", env.tasks()[:2], ScriptedGenerator(),
                            SearchConfig(simulations=5, k=3, depth_limit=5), "cli-test", make_env=SnapshotLineEnv)
    return run_id


def test_more_bad_inputs_from_a_review_are_one_line_errors_and_write_nothing(tmp_path):
    db = tmp_path / "o.db"
    _one_line_error(_orchard("search", "--tasks", "0:1", "--model", "openai:http://127.0.0.1:9/v1", "--db", str(db)),
                    "openai:BASE_URL#MODEL")
    _one_line_error(_orchard("search", "--tasks", "0:1", "--model", "openai:notaurl#m", "--db", str(db)), "http://")
    _one_line_error(_orchard("search", "--env", "textcraft:foo", "--tasks", "0:1", "--db", str(db)),
                    "takes no argument")
    _one_line_error(_orchard("eval", "--model", "tiny", "--seeds", "a,b", "--db", str(db)), "--seeds", "'a'")
    _one_line_error(_orchard("eval", "--model", "tiny", "--split", "bogus", "--db", str(db)), "bogus")
    _one_line_error(_orchard("iterate", "--config", str(tmp_path / "nosuch.json"), "--db", str(db)), "cannot read")
    (tmp_path / "bad.json").write_text("{oops")
    _one_line_error(_orchard("iterate", "--config", str(tmp_path / "bad.json"), "--db", str(db)), "not valid JSON")
    (tmp_path / "list.json").write_text("[1]")
    _one_line_error(_orchard("iterate", "--config", str(tmp_path / "list.json"), "--db", str(db)), "table")
    _one_line_error(_orchard("train", "dpo", "--model", "tiny", "--config", str(tmp_path / "list.json"),
                             "--db", str(db)), "table")
    _one_line_error(_orchard("iterate", "--eval-tasks", "9:1", "--db", str(db)), "bad task range")
    # Commands about rows that must already exist create no database when there is none.
    _one_line_error(_orchard("search", "--resume", "nosuch", "--db", str(db)), "no such database")
    _one_line_error(_orchard("pairs", "build", "first", "--db", str(db)), "no such database")
    _one_line_error(_orchard("jobs", "cancel", "nosuch", "--db", str(db)), "no such database")
    assert not db.exists()
    with Store(db):
        pass
    _one_line_error(_orchard("export", "pairs", "--status", "bogus", "--out", str(tmp_path / "x.jsonl"), "--db",
                             str(db)), "--status", "'bogus'")
    _one_line_error(_orchard("export", "sft", "--kind", "nope", "--out", str(tmp_path / "x.jsonl"), "--db",
                             str(db)), "--kind", "'nope'")
    (tmp_path / "empty-model").mkdir()
    (tmp_path / "empty-model" / "config.json").write_text("{}")
    _one_line_error(_orchard("search", "--tasks", "0:1", "--model", str(tmp_path / "empty-model"), "--db", str(db)))
    folder = tmp_path / "a-folder.db"
    folder.mkdir()
    _one_line_error(_orchard("runs", "--db", str(folder)), "a folder")


def test_refusals_leave_the_folder_as_it_was(tmp_path):
    """A corrupt WAL-mode file gets no -wal/-shm companions; an env that cannot start (no browser)
    leaves no half-made run (its database is not even created)."""
    db = tmp_path / "c.db"
    with Store(db):
        pass
    data = bytearray(db.read_bytes())
    for i in range(100, len(data), 7):
        data[i] = 0xAB
    db.write_bytes(bytes(data))
    _one_line_error(_orchard("runs", "--db", str(db)), "corrupt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.db"]
    web_db = tmp_path / "web.db"
    out = _orchard("search", "--env", "web", "--tasks", "0:1", "--model", "tiny", "--db", str(web_db),
                   env={"ORCHARD_CHROMIUM": str(tmp_path / "no-chromium")})
    _one_line_error(out)
    assert not web_db.exists()


def test_a_damaged_database_is_named_as_such(tmp_path):
    from doubles import damaged_store

    db = damaged_store(tmp_path / "o.db", "runs")
    _one_line_error(_orchard("runs", "--db", str(db)), "damaged database", "runs")


def test_runs_and_export(tmp_path, capsys):
    db = tmp_path / "o.db"
    assert main(["runs", "--db", str(db)]) == 0
    assert "no runs yet" in capsys.readouterr().out
    run_id = _line_run(db)
    assert main(["runs", "--json", "--db", str(db)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == run_id and row["trees"] == 2 and row["simulations"] == 10
    assert main(["runs", "--db", str(db)]) == 0
    assert "cli-test" in capsys.readouterr().out

    out = tmp_path / "t.json"
    assert main(["export", "tree", "cli-test", "--task", "goal-2", "--format", "json", "-o", str(out), "--db", str(db)]) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "orchard.tree/1" and doc["run"]["id"] == run_id and doc["task"]["id"] == "goal-2"
    assert doc["run"]["config"]["k"] == 3 and len(doc["simulations"]) == 5
    for n in doc["nodes"]:
        if n["Q_critic"] is not None:
            assert abs(n["Q"] - (0.5 * n["Q_mcts"] + 0.5 * n["Q_critic"])) < 1e-9

    gml = tmp_path / "t.graphml"
    assert main(["export", "tree", run_id, "--task", "goal-2", "--format", "graphml", "-o", str(gml), "--db", str(db)]) == 0
    g = nx.read_graphml(gml)
    assert g.number_of_nodes() == len(doc["nodes"])
    assert main(["export", "tree", run_id, "--task", "nope", "--db", str(db)]) == 2
    assert "no task" in capsys.readouterr().err


def test_orchard_db_is_the_store_of_search_and_runs(tmp_path, monkeypatch, capsys):
    """$ORCHARD_DB chooses the database of the CLI as it does the dashboard's (engine.paths)."""
    import engine.llm.registry

    db = tmp_path / "chosen" / "o.db"
    db.parent.mkdir()
    monkeypatch.setenv("ORCHARD_DB", str(db))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))  # the fallback, which must stay unused
    monkeypatch.setattr(engine.llm.registry, "load_generator", lambda spec, log=print: ScriptedGenerator())
    assert main(["search", "--tasks", "0:1", "--simulations", "1", "--k", "1", "--no-critic",
                 "--name", "via-env"]) == 0
    assert db.exists() and not (tmp_path / "home").exists()
    capsys.readouterr()
    assert main(["runs", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["via-env"]
    assert main(["runs", "--json", "--db", str(tmp_path / "other.db")]) == 0  # --db still wins
    assert json.loads(capsys.readouterr().out) == []
