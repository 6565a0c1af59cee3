"""The `orchard` CLI: fast help, one-line errors with exit 2 and nothing written, runs, export."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx
import pytest
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_exports_to_a_folder_or_a_failing_write_are_one_line_errors_and_keep_the_old_file(tmp_path, monkeypatch,
                                                                                         capsys):
    """`export tree -o` once wrote in place (a kill left half a tree) and a folder named like the
    output file gave an IsADirectoryError traceback (tree and sft exports alike)."""
    db = tmp_path / "o.db"
    _line_run(db)
    for fmt in ("json", "graphml"):
        folder = tmp_path / f"t.{fmt}"
        folder.mkdir()
        assert main(["export", "tree", "cli-test", "--task", "goal-2", "--format", fmt, "-o", str(folder),
                     "--db", str(db)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("orchard: error:") and "is a folder" in err and "\n" not in err, err
        assert list(folder.iterdir()) == []

    old = tmp_path / "old.json"
    old.write_text("the previous export")

    def dies(src, dst):
        raise OSError(28, "No space left on device")

    import engine.fileio

    monkeypatch.setattr(engine.fileio.os, "replace", dies)
    assert main(["export", "tree", "cli-test", "--task", "goal-2", "-o", str(old), "--db", str(db)]) == 2
    assert "old.json: cannot write (No space left on device)" in capsys.readouterr().err
    assert old.read_text() == "the previous export"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


class _KeyRecorder:
    """A loopback 'model server' that records the Authorization header of each request and answers 401."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append(self.headers.get("Authorization"))
                body = b'{"error": {"message": "no"}}'
                self.send_response(401)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.spec = f"openai:http://127.0.0.1:{self.httpd.server_address[1]}/v1#m"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Stdin:
    def __init__(self, tty: bool, answer: str = "") -> None:
        self.tty, self.answer = tty, answer

    def isatty(self) -> bool:
        return self.tty

    def readline(self) -> str:
        return self.answer


def _interrupted_run(db: Path, model: str, monkeypatch) -> str:
    """An interrupted run on the line env searched with `model`, and $OPENAI_API_KEY set."""
    from engine.envs import registry

    monkeypatch.setitem(registry.BUILTIN, "line", "doubles:SnapshotLineEnv")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with Store(db) as store:
        run_id = store.create_run("shared", "line", model, {**SearchConfig(simulations=2).__dict__},
                                  SnapshotLineEnv().tasks()[:1])
        store.set_run_status(run_id, "interrupted")
    return run_id


def test_resume_sends_the_api_key_to_a_stored_url_only_when_the_user_says_so(tmp_path, monkeypatch, capsys):
    """`search --resume` once sent $OPENAI_API_KEY to whatever URL the (maybe shared) database named."""
    server = _KeyRecorder()
    db = tmp_path / "o.db"
    try:
        run_id = _interrupted_run(db, server.spec, monkeypatch)
        resume = ["search", "--resume", run_id, "--db", str(db)]
        monkeypatch.setattr(sys, "stdin", _Stdin(tty=False))
        assert main(resume) == 2
        err = capsys.readouterr().err
        assert "comes from the database" in err and f"--model '{server.spec}'" in err and len(err.splitlines()) == 1
        monkeypatch.setattr(sys, "stdin", _Stdin(tty=True, answer="n\n"))
        assert main(resume) == 2
        assert "not resumed" in capsys.readouterr().err
        assert server.seen == []  # nothing was sent, key or not

        monkeypatch.setattr(sys, "stdin", _Stdin(tty=True, answer="y\n"))
        assert main(resume) == 2  # the recorder answers 401
        assert "HTTP 401" in capsys.readouterr().err and server.seen[-1] == "Bearer sk-secret"
        monkeypatch.setattr(sys, "stdin", _Stdin(tty=False))
        assert main([*resume, "--model", server.spec]) == 2
        assert server.seen[-1] == "Bearer sk-secret" and len(server.seen) == 2
        monkeypatch.delenv("OPENAI_API_KEY")  # no key: nothing to leak, nothing asked
        assert main(resume) == 2
        assert "no API key was sent" in capsys.readouterr().err and server.seen[-1] is None
    finally:
        server.close()


@pytest.mark.parametrize("pad", [" ", "\t", "\n "])
def test_resume_asks_before_sending_the_key_to_a_stored_spec_that_starts_with_space(tmp_path, monkeypatch,
                                                                                    capsys, pad):
    """Issue 25, item 4: the check looked at the raw stored text and the loader at the stripped one,
    so `' openai:http://...'` was loaded (and sent the key) without being asked about."""
    server = _KeyRecorder()
    db = tmp_path / "o.db"
    try:
        run_id = _interrupted_run(db, pad + server.spec, monkeypatch)
        monkeypatch.setattr(sys, "stdin", _Stdin(tty=False))
        assert main(["search", "--resume", run_id, "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert "comes from the database" in err and f"--model '{server.spec}'" in err, err
        assert server.seen == []  # not one request, so no key
    finally:
        server.close()


def test_orchard_db_is_the_store_of_search_and_runs(tmp_path, monkeypatch, capsys):
    """$ORCHARD_DB chooses the database of the CLI as it does the dashboard's (engine.paths)."""
    import engine.llm.registry

    db = tmp_path / "chosen" / "o.db"
    db.parent.mkdir()
    monkeypatch.setenv("ORCHARD_DB", str(db))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))  # the fallback, which must stay unused
    monkeypatch.setattr(engine.llm.registry, "load_generator", lambda spec, log=print, **_kw: ScriptedGenerator())
    assert main(["search", "--tasks", "0:1", "--simulations", "1", "--k", "1", "--no-critic",
                 "--name", "via-env"]) == 0
    assert db.exists() and not (tmp_path / "home").exists()
    capsys.readouterr()
    assert main(["runs", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["via-env"]
    assert main(["runs", "--json", "--db", str(tmp_path / "other.db")]) == 0  # --db still wins
    assert json.loads(capsys.readouterr().out) == []
