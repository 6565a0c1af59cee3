"""The Loop view is live (issue 31): while a loop job runs, the Evaluation page's Loop section shows the
iteration under way, its stage and that stage's own progress, and re-reads the loop's records on every
refresh, so an iteration that ends shows without a reload; each record's gate decision, model and
evaluation agree with the Runs, Training and Evaluation pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dash_fixtures import APP
from streamlit.testing.v1 import AppTest

from dashboard.loop import LiveStage, gate_cell
from engine.store import Store

EVALUATION = "views/evaluation.py"
SUCCESS = {"success": {"mean": 0.5, "low": 0.0, "high": 1.0}, "progress": {"mean": 0.5, "low": 0.0, "high": 1.0},
           "loop_rate": {"mean": 0.0, "low": 0.0, "high": 0.0}, "episodes": 2}
CONFIG = {"method": "exit", "model": "tiny", "env": "line", "iterations": 2, "tasks_per_iteration": 2,
          "name": "loop-l", "search": {"simulations": 64}}


def record(store: Store, idx: int, model: str, **extra: Any) -> None:
    """A loop record as `run_loop` saves it, with a real evaluation of `model` (its id in the record)."""
    eval_id = store.save_evaluation(model, "line", "test", ["goal-1", "goal-2"], "greedy", {}, SUCCESS, [])
    store.save_iteration("loop-l", idx, "exit", {"model": model, "config": CONFIG,
                                                 "eval": {"eval_id": eval_id, **SUCCESS}, **extra})


def progress(iteration: int, stage: str, phase: str, step: int, total: int, unit: str, **extra: Any) -> dict[str, Any]:
    return {"phase": f"iteration {iteration} · {phase}", "step": step, "total": total, "unit": unit, "eta_s": 30.0,
            "loop_id": "loop-l", "iteration": iteration, "stage": stage, "last_iteration": 3, **extra}


@pytest.fixture()
def running(db: Path) -> str:
    """Loop loop-l with its base and first iteration recorded, and its job searching iteration 2."""
    with Store(db) as store:
        record(store, 0, "tiny")
        record(store, 1, "/models/loop-l/iter-1", run_id="r1", solved_in_search=2, samples=3, train={"steps": 2},
               gate={"split": "val", "tasks": 4, "confidence": 0.8, "current": 0.25, "candidate": 0.75,
                     "diff": {"mean": 0.5, "low": 0.25, "high": 0.75}, "promoted": True, "why": "promoted"})
        job = store.create_job("iterate", {"iterate": {**CONFIG, "first_iteration": 2}}, "cpu", name="loop-l")
        store.claim_next_job("cpu")  # running; no pid yet, so the page's poll leaves it alone for a minute
        store.update_job_progress(job.id, progress(2, "search", "search", 57, 128, "simulations", solved=3))
    return job.id


def open_evaluation() -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(EVALUATION)
    return at.run()


def stages(at: AppTest) -> Any:
    return next(d.value for d in at.dataframe if "gate" in d.value)


def bars(at: AppTest) -> list[str]:
    return [b.proto.text.replace("\\", "") for b in at.get("progress")]  # md() escapes punctuation


def test_a_running_iteration_shows_its_stage_and_the_stage_s_progress(db: Path, running: str) -> None:
    at = open_evaluation()
    assert not at.exception, at.exception
    assert any("iteration 2 of 3 · search: 57/128 simulations, ETA 30 s" in b for b in bars(at)), bars(at)
    assert any("iteration 2 · search: 57/128 simulations" in b for b in bars(at))  # the job panel at the top
    table = stages(at)
    assert list(table["iteration"]) == ["base", "1", "2 (running)"]
    now = table.iloc[-1]
    assert now["search"] == "▶ 57/128 simulations, ETA 30 s · 3 solved"
    assert [now[c] for c in ("data", "curation", "train", "gate", "evaluate")] == ["…"] * 5
    assert at.button(key="ev_next").disabled  # not while a job runs this loop
    assert "2 records; job " in "\n".join(c.value for c in at.caption)
    assert at.selectbox(key="ev_loop").format_func("loop-l") == "exit · loop-l"  # no count to go stale


def test_an_iteration_that_ends_shows_at_the_next_refresh_and_the_stage_moves_on(db: Path, running: str) -> None:
    at = open_evaluation()
    with Store(db) as store:
        store.update_job_progress(running, progress(2, "train", "sft", 3, 10, "steps"))
    at.run()  # what the fragment's timer does
    now = stages(at).iloc[-1]
    assert [now[c] for c in ("search", "data", "curation", "gate")] == ["✓", "✓", "✓", "…"]
    assert now["train"] == "▶ sft · 3/10 steps, ETA 30 s"
    with Store(db) as store:
        record(store, 2, "/models/loop-l/iter-2", run_id="r2", solved_in_search=1, samples=2, train={"steps": 2},
               gate={"split": "val", "tasks": 4, "confidence": 0.8, "current": 0.75, "candidate": 0.5,
                     "diff": {"mean": -0.25, "low": -0.5, "high": 0.0}, "promoted": False, "why": "kept"})
        store.update_job_progress(running, progress(3, "gate", "gate: candidate", 1, 4, "episodes", solved=1))
    at.run()
    table = stages(at)
    assert list(table["iteration"]) == ["base", "1", "2", "3 (running)"]
    assert table.iloc[2]["gate"].startswith("✗ kept the current policy: 0.500 vs 0.750 on 4 val tasks")
    assert table.iloc[3]["gate"] == "▶ gate: candidate · 1/4 episodes, ETA 30 s · 1 solved"
    assert "3 records; job " in "\n".join(c.value for c in at.caption)
    with Store(db) as store:
        store.finish_job(running, "succeeded", output_path="loop-l")
    at.run()
    assert not at.exception, at.exception
    assert list(stages(at)["iteration"]) == ["base", "1", "2"] and not at.button(key="ev_next").disabled
    assert not any("iteration 3 of 3" in b for b in bars(at))


def test_a_new_loop_shows_its_base_evaluation_before_it_has_a_record(db: Path) -> None:
    with Store(db) as store:
        job = store.create_job("iterate", {"iterate": {**CONFIG, "name": "loop-n"}}, "cpu", name="loop-n")
        store.claim_next_job("cpu")
        store.update_job_progress(job.id, {"phase": "base · evaluate", "step": 3, "total": 8, "unit": "episodes",
                                           "loop_id": "loop-n", "iteration": 0, "stage": "evaluate", "solved": 1,
                                           "last_iteration": 2})
    at = open_evaluation()
    assert not at.exception, at.exception
    assert at.selectbox(key="ev_loop").value == "loop-n"
    row = stages(at).iloc[0]
    assert row["iteration"] == "base (running)" and row["evaluate"].startswith("▶ 3/8 episodes") and row["search"] == "—"
    assert not any(b.label == "Next iteration" for b in at.button)  # nothing to continue yet
    assert "No loop yet" not in "\n".join(c.value for c in at.caption)


def test_records_agree_with_the_evaluation_and_training_pages(db: Path, running: str) -> None:
    from engine.store import ModelRecord

    with Store(db) as store:
        store.save_model(ModelRecord(path="/models/loop-l/iter-1", name="loop-l-it1", kind="exit", parent="tiny"))
        evaluations = {e["model"]: e["id"] for e in store.evaluations()}
    at = open_evaluation()
    table = stages(at)
    assert list(table["evaluation"][:2]) == [evaluations["tiny"], evaluations["/models/loop-l/iter-1"]]
    assert table.iloc[1]["model"] == "iter-1 (loop-l-it1)"  # the Evaluation page's label, the Training page's name
    every = next(d.value for d in at.dataframe if "baseline's settings" in d.value)
    assert set(table["evaluation"][:2]) <= set(every["id"])


@pytest.mark.parametrize(("rec", "cell"), [
    ({"idx": 0}, "—"),
    ({"idx": 1, "skipped": "no curated search rows"}, "— (nothing trained)"),
    ({"idx": 1, "gate": {"promoted": True, "why": "no gate (gate_split ''): every trained policy is promoted"}},
     "✓ promoted (no gate)"),
    ({"idx": 1, "gate": {"split": "train", "tasks": 3, "current": 0.0, "candidate": 1.0, "promoted": True,
                         "diff": {"mean": 1.0, "low": 1.0, "high": 1.0}}},
     "✓ promoted: 1.000 vs 0.000 on 3 train tasks, paired +1.000 [+1.000, +1.000]"),
    ({"idx": 1, "gate": {"split": "val", "tasks": 2, "current": 0.5, "candidate": 0.5, "promoted": False}},
     "✗ kept the current policy: 0.500 vs 0.500 on 2 val tasks"),
    ({"idx": 1, "gate": {"promoted": "<b>yes</b>"}}, "—"),  # not what the loop writes: no verdict made up
])
def test_gate_cell(rec: dict[str, Any], cell: str) -> None:
    assert gate_cell(rec) == cell


def test_live_stage_reads_only_what_a_loop_job_wrote(db: Path) -> None:
    with Store(db) as store:
        job = store.create_job("iterate", {"iterate": {"name": "loop-x"}}, "cpu")
        store.update_job_progress(job.id, {"phase": "loading", "stage": json.dumps({"not": "a stage"}),
                                           "iteration": "2"})
        queued = store.job(job.id)
        live = LiveStage.of(queued)
        assert live is not None and live.loop_id == "loop-x" and live.iteration is None and live.stage is None
        assert live.headline() == "waiting in the queue" and live.row_cells() == {}
        store.claim_next_job("cpu")
        assert store.finish_job(job.id, "cancelled")
        assert LiveStage.of(store.job(job.id)) is None


@pytest.mark.slow
def test_a_real_loop_s_records_agree_with_the_runs_training_and_evaluation_pages(db: Path, tmp_path: Path) -> None:
    """One real iteration (search with the scripted generator, SFT of a tiny model, evaluation): the Loop
    view's run and solved count are the Runs page's, its model the Training page's, its evaluation ids the
    Evaluation page's."""
    from doubles import LineEnv, ScriptedGenerator
    from tiny_model_fixture import build_tiny_model

    from engine.loop import IterateConfig, run_loop

    model = build_tiny_model(tmp_path / "tiny")
    train = {"max_steps": 2, "batch_size": 4, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
             "num_threads": 1}
    config = IterateConfig(method="exit", model=str(model), env="line", iterations=1, tasks_per_iteration=3,
                           eval_split="train", eval_tasks="0:3", output_root=str(tmp_path / "loop"), name="loop-r",
                           include_pending=True, gate_split="", sft=train,
                           search={"simulations": 6, "k": 3, "depth_limit": 4, "max_tokens": 32},
                           eval={"mode": "greedy", "max_steps": 4, "bootstrap": 50})
    with Store(db) as store:
        store.create_job("probe", {"steps": 1}, "cpu", name="seed")  # the Training page lists models below its jobs
        store.finish_job(store.jobs()[0].id, "succeeded")
        run_loop(store, config, make_env=lambda: LineEnv(6), load=lambda path: ScriptedGenerator(p_right=0.6))
        base, first = sorted(store.iterations("loop-r"), key=lambda r: r["idx"])
        name = store.model_record(first["model"]).name
    at = open_evaluation()
    assert not at.exception, at.exception
    table = stages(at)
    assert table.iloc[1]["search"] == f"✓ run {first['run_id']} · {first['solved_in_search']} solved"
    assert table.iloc[1]["model"] == f"iter-1 ({name})" and table.iloc[1]["gate"] == "✓ promoted (no gate)"
    assert list(table["evaluation"]) == [base["eval"]["eval_id"], first["eval"]["eval_id"]]
    every = next(d.value for d in at.dataframe if "baseline's settings" in d.value)
    assert set(table["evaluation"]) <= set(every["id"])
    at.switch_page("views/runs.py").run()
    runs = next(d.value for d in at.dataframe if "solved" in d.value and "id" in d.value)
    assert int(runs.set_index("id").loc[first["run_id"], "solved"]) == first["solved_in_search"]
    at.switch_page("views/training.py").run()
    models = next(d.value for d in at.dataframe if "replaced by job" in d.value)
    assert models.set_index("path").loc[first["model"], "name"] == name
