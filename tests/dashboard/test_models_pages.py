"""The Training and Evaluation pages through AppTest, with real job processes and real evaluations."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from dash_fixtures import APP, copy_store
from doubles import ScriptedGenerator, SnapshotLineEnv
from streamlit.testing.v1 import AppTest

from engine.evaluate import EvalConfig, evaluate_and_store
from engine.jobs.runner import JobRunner
from engine.store import ModelRecord, Store

TRAINING = "views/training.py"
EVALUATION = "views/evaluation.py"


@pytest.fixture()
def db(store_db, tmp_path: Path, monkeypatch) -> tuple[Path, dict[str, str]]:
    """A private copy of the fixture store (these tests launch jobs that write to it)."""
    source, runs = store_db
    path = copy_store(source, tmp_path / "orchard.db")
    monkeypatch.setenv("ORCHARD_DB", str(path))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))  # trained models land here, not in data/
    return path, runs


def open_page(page: str, **params: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(page)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


def frame(at: AppTest, column: str):
    """The data frame on the page that has `column` (AppTest does not look data frames up by key)."""
    return next(d.value for d in at.dataframe if column in d.value)


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "error", "success", "warning", "code")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


@pytest.mark.slow
def test_launch_a_dpo_job_with_one_click_and_follow_it_to_its_model(db, tmp_path: Path) -> None:
    from tiny_model_fixture import build_tiny_model

    path, runs = db
    base = build_tiny_model(tmp_path / "base")
    with Store(path) as store:  # a model from an earlier job: offered as a starting point
        store.save_model(ModelRecord(path=str(base.resolve()), name="base", kind="fixture"))
    at = open_page(TRAINING)
    assert not at.exception
    assert "No jobs yet" in texts(at)
    at.selectbox(key="tr_data").set_value("pairs")
    at.selectbox(key="tr_preset").set_value("cpu-quick")
    at.selectbox(key="tr_model").set_value(str(base.resolve()))
    at.multiselect(key="tr_runs").set_value([runs["main"]])
    at.checkbox(key="tr_pending").check()
    at.run()
    # Before Launch the page says what the job would train on, and for how long (steps follow the data).
    with Store(path) as store:
        pairs = len(store.pairs(run_id=runs["main"], kind=["step"]))
    steps = math.ceil(math.ceil(pairs / 4) * 0.5)  # half an epoch at batch 4, rounded up as the Trainer does
    assert f"Would train on {pairs} pairs → {pairs} rows × 0.5 epochs (batch 4) → {steps} optimizer steps" in texts(at)
    if pairs < 16:  # a small set asks to confirm before it can launch
        assert at.button(key="tr_launch").disabled
        at.checkbox(key="tr_small_ok").check()
        at.run()
    at.button(key="tr_launch").click()
    at.run()
    assert not at.exception and not at.error, texts(at)
    with Store(path) as store:
        (job,) = store.jobs()
        assert job.kind == "dpo" and job.device == "cpu" and job.config["runs"] == [runs["main"]]
        assert job.config["train"]["kinds"] == ["step"] and job.config["train"]["include_pending"] is True
        assert "max_steps" not in job.config["train"] and job.config["train"]["epochs"] == 0.5
        done = JobRunner(store).wait(job.id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path or "").read_text()[-2000:]
    assert at.query_params["job"] in (job.id, [job.id])
    at.run()  # the page now shows the finished job, its curves, its log and its model
    page = texts(at)
    assert "succeeded" in page and done.output_path in page
    assert Path(done.output_path).is_relative_to(tmp_path / "home")
    (curves,) = at.get("plotly_chart")
    assert '"loss"' in curves.proto.spec and "reward margin" in curves.proto.spec
    assert any("dpo" in c.value for c in at.code)  # log tail shown as text
    models = frame(at, "train loss")
    assert done.output_path in set(models["path"])
    assert all(b.key != f"tr_cancel_{job.id}" for b in at.button)  # no cancel for a final job


def test_cancel_a_running_job_from_the_page(db) -> None:
    path, _ = db
    with Store(path) as store:
        job = JobRunner(store).submit("probe", {"steps": 500, "seconds": 0.2}, device="cpu")
        deadline = time.monotonic() + 60
        while store.job(job.id).progress.get("step", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    at = open_page(TRAINING, job=job.id)
    assert not at.exception
    assert "running" in texts(at)
    at.button(key=f"tr_cancel_{job.id}").click()
    at.run()
    with Store(path, readonly=True) as store:
        assert store.job(job.id).state == "cancelled"
    assert f"Job {job.id} is cancelled." in texts(at)


def test_a_gpu_preset_on_a_machine_without_one_is_refused_with_a_reason(db) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path, _ = db
    at = open_page(TRAINING)
    at.selectbox(key="tr_preset").set_value("gpu-bf16")
    at.button[0].click()
    at.run()
    assert not at.exception
    assert any("none is visible on this machine" in e.value for e in at.error)
    with Store(path, readonly=True) as store:
        assert store.jobs() == []


def test_evaluation_page_shows_every_metric_with_its_interval(db) -> None:
    path, _ = db
    env = SnapshotLineEnv()
    tasks = env.tasks()[:4]
    with Store(path) as store:
        for p_right in (0.9, 0.2):
            evaluate_and_store(store, ScriptedGenerator(p_right=p_right), "line", "train", tasks,
                               EvalConfig(mode="sampled", seeds=(0, 1), max_steps=6, bootstrap=200),
                               model=f"/models/p{p_right}", make_env=SnapshotLineEnv)
        evals = store.evaluations()
    at = open_page(EVALUATION)
    assert not at.exception, at.exception
    table = frame(at, "success rate")
    assert sorted(table["model"]) == ["p0.2", "p0.9"]
    for e in evals:
        m = e["metrics"]["success"]
        row = table[table["id"] == e["id"]].iloc[0]
        assert row["success rate"] == f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"
    (chart,) = at.get("plotly_chart")
    assert "error_y" in chart.proto.spec and "p0.9" in chart.proto.spec
    at.selectbox(key="ev_metric").set_value("recovery")
    at.run()
    assert not at.get("plotly_chart") and any("recovery score" in c.value for c in at.caption)


def test_an_evaluation_that_lands_while_the_page_is_open_joins_the_comparison(db) -> None:
    path, _ = db
    env = SnapshotLineEnv()
    config = EvalConfig(mode="sampled", seeds=(0,), max_steps=4, bootstrap=50)

    def evaluate(model: str) -> None:
        with Store(path) as store:
            evaluate_and_store(store, ScriptedGenerator(p_right=0.5), "line", "train", env.tasks()[:2], config,
                               model=model, make_env=SnapshotLineEnv)

    evaluate("/models/trained")
    at = open_page(EVALUATION)
    assert list(frame(at, "success rate")["model"]) == ["trained"]
    side = next(d.value for d in at.dataframe if any(str(c).startswith("trained · ") for c in d.value.columns))
    assert len(side.columns) == 1
    evaluate("/models/base")  # e.g. a job launched from this page ends: the page reruns
    at.run()
    assert not at.exception
    side = next(d.value for d in at.dataframe if any(str(c).startswith("trained · ") for c in d.value.columns))
    assert sorted(str(c).split(" · ")[0] for c in side.columns) == ["base", "trained"]


def test_evaluation_page_without_evaluations_says_how_to_make_one(db) -> None:
    at = open_page(EVALUATION)
    assert not at.exception
    assert any("orchard eval" in i.value for i in at.info)


def test_a_launch_with_nothing_to_train_on_is_refused_with_a_reason(db) -> None:
    path, _ = db
    with Store(path, readonly=True) as store:  # the fixture's refinement samples are all uncurated
        assert store.samples(kind="refine") and not store.samples(kind="refine", status=["approved", "edited"])
    at = open_page(TRAINING)
    at.selectbox(key="tr_data").set_value("refinement")
    at.button[0].click()
    at.run()
    assert not at.exception
    assert any("Nothing to train on" in e.value and "include pending" in e.value for e in at.error)
    with Store(path, readonly=True) as store:
        assert store.jobs() == []


def test_a_launch_into_a_folder_holding_other_files_is_refused(db, tmp_path: Path) -> None:
    path, runs = db
    mine = tmp_path / "my-files"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    at = open_page(TRAINING)
    at.selectbox(key="tr_data").set_value("pairs")
    at.multiselect(key="tr_runs").set_value([runs["main"]])
    at.checkbox(key="tr_pending").check()
    at.text_input(key="tr_out").input(str(mine))
    at.button[0].click()
    at.run()
    assert not at.exception
    assert any("not launched" in e.value and "not an Orchard model folder" in e.value for e in at.error), texts(at)
    assert (mine / "notes.txt").read_text() == "keep me"
    with Store(path, readonly=True) as store:
        assert store.jobs() == []


def _finished_job_with_metrics(path: Path, final: bool = True) -> str:
    """A job whose metric stream ends, as a trainer's does, with a summary record lacking the step keys."""
    with Store(path) as store:
        job = store.create_job("probe", {"steps": 2}, "cpu", name="dpo-cpu-quick")
        store.claim_next_job("cpu")
        store.add_job_metrics(job.id, {"loss": 0.5, "rewards/margins": 0.1, "rewards/accuracies": 0.5}, step=1)
        store.add_job_metrics(job.id, {"loss": 0.25, "rewards/margins": 0.5, "rewards/accuracies": 0.75}, step=2)
        store.add_job_metrics(job.id, {"train_runtime": 20.0, "train_loss": 0.375}, step=2)
        store.update_job_progress(job.id, {"phase": "dpo", "step": 2, "total": 2})
        if final:
            store.finish_job(job.id, "succeeded")
        return job.id


def test_metric_tiles_show_the_last_values_of_the_curves_below_them(db) -> None:
    """Issue 15 item 8: the tiles said '—' above curves full of values (the last record is the summary)."""
    path, _ = db
    job_id = _finished_job_with_metrics(path)
    at = open_page(TRAINING, job=job_id)
    assert not at.exception
    assert [m.value for m in at.metric] == ["0.25", "0.5", "0.75"]
    (chart,) = at.get("plotly_chart")
    assert '"loss"' in chart.proto.spec


def test_job_picker_table_and_panel_agree_with_the_store_after_a_job_ends(db) -> None:
    """Issue 15 item 8: the picker still said 'running' when the table said 'succeeded'. The frontend keeps
    an option's first label, so the label must not carry the state; table and panel read the store."""
    path, _ = db
    job_id = _finished_job_with_metrics(path, final=False)
    at = open_page(TRAINING, job=job_id)
    assert not at.exception
    picker = at.selectbox(key=f"tr_job_{job_id}")
    before = list(picker.options)
    assert frame(at, "state")["state"].tolist() == ["running"]
    assert any("state **running**" in m.value for m in at.markdown)
    with Store(path) as store:
        store.finish_job(job_id, "succeeded")
    at.run()
    assert list(at.selectbox(key=f"tr_job_{job_id}").options) == before  # what the browser keeps showing
    assert "running" not in " ".join(before)
    assert frame(at, "state")["state"].tolist() == ["succeeded"]
    assert any("state **succeeded**" in m.value for m in at.markdown)
    assert not any("state **running**" in m.value for m in at.markdown)
