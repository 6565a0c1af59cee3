"""A job's log is read only from the database's job-log folder (issue 25, item 8): a row whose
log_path names another file (`/etc/passwd`, a file beside the folder, a link out of it) shows a
one-line notice instead of that file's contents, on the Training page and in `orchard jobs log`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from dash_fixtures import APP
from streamlit.testing.v1 import AppTest

from engine.cli import main
from engine.store import Store

TRAINING = "views/training.py"
SECRET = "PRIVATE-FILE-CONTENTS"


def job_with_log(db: Path, log_path: str | None) -> str:
    """A failed job (nothing to start) whose stored log_path is `log_path` (None: the default)."""
    with Store(db) as store:
        job = store.create_job("sft", {}, "cpu", name="logged")
        store.finish_job(job.id, "failed", error="stopped", expect=("queued",))
    if log_path is not None:
        con = sqlite3.connect(db)
        con.execute("UPDATE jobs SET log_path=? WHERE id=?", (log_path, job.id))
        con.commit()
        con.close()
    return job.id


def log_block(db: Path, job_id: str) -> str:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TRAINING)
    at.query_params["job"] = job_id
    at.run()
    assert not at.exception, at.exception
    return "\n".join(str(c.value) for c in at.code)


@pytest.fixture()
def db(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "db" / "orchard.db"
    path.parent.mkdir()
    monkeypatch.setenv("ORCHARD_DB", str(path))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))
    return path


@pytest.mark.parametrize("where", ["etc", "beside", "link"])
def test_a_log_path_outside_the_job_log_folder_is_not_read(db: Path, tmp_path: Path, capsys, where: str) -> None:
    outside = tmp_path / "private.txt"
    outside.write_text(f"{SECRET}\n")
    (db.parent / "jobs").mkdir(parents=True, exist_ok=True)
    if where == "link":
        (db.parent / "jobs" / "x.log").symlink_to(outside)
    target = {"etc": "/etc/passwd", "beside": str(outside), "link": str(db.parent / "jobs" / "x.log")}[where]
    job_id = job_with_log(db, target)
    shown = log_block(db, job_id)
    assert SECRET not in shown and "root:" not in shown
    assert "outside the job-log folder" in shown
    assert main(["jobs", "log", job_id, "--db", str(db)]) == 2
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and "root:" not in out.out + out.err
    assert "outside the job-log folder" in out.err


def test_a_log_in_the_job_log_folder_is_shown(db: Path, capsys) -> None:
    job_id = job_with_log(db, None)
    with Store(db) as store:
        log = Path(store.job(job_id).log_path or "")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("epoch 1 done\n")
    assert "epoch 1 done" in log_block(db, job_id)
    assert main(["jobs", "log", job_id, "--db", str(db)]) == 0
    assert "epoch 1 done" in capsys.readouterr().out


def test_the_worker_of_such_a_job_does_not_append_to_that_file(db: Path, tmp_path: Path) -> None:
    from engine.jobs.runner import JobRunner

    outside = tmp_path / "private.txt"
    outside.write_text(f"{SECRET}\n")
    with Store(db) as store:
        job = store.create_job("pairs", {"run": "no-such-run"}, "cpu", name="logged")
    con = sqlite3.connect(db)
    con.execute("UPDATE jobs SET log_path=? WHERE id=?", (str(outside), job.id))
    con.commit()
    con.close()
    with Store(db) as store:
        done = JobRunner(store).wait(job.id, timeout=120)
    assert done.state == "failed"
    assert outside.read_text() == f"{SECRET}\n"  # untouched
    assert (db.parent / "jobs" / f"{job.id}.log").stat().st_size > 0  # the worker wrote its own log
