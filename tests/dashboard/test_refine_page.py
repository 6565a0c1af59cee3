"""The Refinement page builds its own data (issue 31 item 6): a build form (model incl. `offline`,
count, personas, seed) that queues a refine job, a Builds table of the refine jobs, and the turns of
a row with their loss flags; through Streamlit's AppTest."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import APP
from streamlit.testing.v1 import AppTest

from engine.datasets.builds import RefineJob, run_refine
from engine.jobs.runner import JobRunner
from engine.progress import MemoryReporter
from engine.store import Store

REFINEMENT = "views/refinement.py"


@pytest.fixture()
def db(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "orchard.db"
    monkeypatch.setenv("ORCHARD_DB", str(path))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))  # a job's default output folder
    return path


def open_page(**params: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(REFINEMENT)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


def frame(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value)


def build(db: Path, n: int = 3) -> str:
    """An offline refine build recorded as a finished job (as `orchard demo` records its own)."""
    with Store(db) as store:
        job = store.create_job("refine", {"model": "offline", "n": n}, "cpu", name="refine")
        reporter = MemoryReporter()
        result = run_refine(RefineJob(model="offline", n=n, out=str(db.parent / "refine.jsonl")), reporter,
                            store=store, who=f"job {job.id}")
        store.update_job_progress(job.id, reporter.progress_rows[-1])
        store.finish_job(job.id, "succeeded", output_path=result.output, expect=("queued",))
    return job.id


def test_an_empty_store_opens_the_build_form_and_says_how_to_build(db: Path) -> None:
    with Store(db):
        pass
    at = open_page()
    assert any("orchard refine generate" in i.value for i in at.info)
    assert at.text_input(key="rfb_model").value == "offline"
    assert not at.error and not at.dataframe  # no builds, no rows


def test_a_build_shows_in_the_builds_table_and_its_turns_show_their_loss(db: Path) -> None:
    job_id = build(db)
    at = open_page()
    builds = frame(at, "job")
    assert list(builds["job"]) == [job_id] and list(builds["state"]) == ["succeeded"]
    assert list(builds["model"]) == ["offline"] and list(builds["rows"]) == [3]
    listed = frame(at, "sample")
    assert len(listed) == 3 and set(listed["model"]) == {"offline"}
    with Store(db) as store:
        sample = store.sample(at.query_params["sample"])
    turns = frame(at, "loss")
    assert list(turns["loss"]) == ["trained" if t.trains else "masked" for t in sample.turns]
    masked = [i for i, t in enumerate(sample.turns) if not t.trains]
    assert len(masked) >= 2  # the injected, refused mistakes
    assert all(turns["DM error"][i] != "none" for i in masked)
    assert all(turns["DM error"][i] == "none" for i in range(len(sample.turns)) if i not in masked)
    heads = [m.value for m in at.markdown if m.value.startswith("**Turn")]
    assert [("flagged as an error" in h) for h in heads] == [not t.trains for t in sample.turns]
    assert all(t.text in [c.value for c in at.code] for t in sample.turns)  # model-side text as text


def test_the_form_queues_a_refine_job_and_refuses_a_bad_model_at_its_field(db: Path) -> None:
    with Store(db):
        pass
    at = open_page()
    at.text_input(key="rfb_model").set_value("/no/such/model")
    next(b for b in at.button if b.label == "Build refinement data").click()
    at.run()
    assert not at.exception and any("no such folder" in e.value for e in at.error)
    with Store(db, readonly=True) as store:
        assert store.jobs() == []  # nothing queued
    at.text_input(key="rfb_model").set_value("offline")
    at.number_input(key="rfb_n").set_value(2)
    next(b for b in at.button if b.label == "Build refinement data").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("Queued job" in s.value and "refine build" in s.value for s in at.success)
    with Store(db) as store:
        (job,) = store.jobs()
        assert job.kind == "refine" and job.device == "cpu"
        assert job.config == {"model": "offline", "n": 2, "personas": None, "seed": 0}
        done = JobRunner(store).wait(job.id, timeout=120)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        assert store.sample_counts(kind="refine")["total"] == 2
    at.run()
    assert not at.exception
    assert list(frame(at, "job")["rows"]) == [2] and len(frame(at, "sample")) == 2
