"""A loop's stages report their own progress (issue 31): `Within` puts a stage's units under its
iteration ("iteration 2 · search: 57/128 simulations"), evaluations count episodes as they end, and a
cancel at a stage's next unit stops the loop without recording the iteration under way.

The loops here train nothing (their rows are left uncurated), so they run in seconds: the scripted
generator on the line env, a model folder that is never loaded."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from doubles import LineEnv, ScriptedGenerator

from engine.evaluate import EvalConfig, episode_count, evaluate
from engine.loop import IterateConfig, run_loop
from engine.progress import Cancelled, MemoryReporter, Units, Within, progress_line
from engine.store import Store


def test_within_puts_a_stage_s_units_under_its_label_and_passes_the_rest_through() -> None:
    outer = MemoryReporter()
    within = Within(outer, "iteration 2", unit="simulations", stage="search", iteration=2)
    within.begin("search")
    units = Units(within, "search", 128)
    for _ in range(57):
        units.step(solved=3)
    row = outer.progress_rows[-1]
    assert row["phase"] == "iteration 2 · search" and (row["step"], row["total"]) == (57, 128)
    assert row["unit"] == "simulations" and row["stage"] == "search" and row["iteration"] == 2 and row["solved"] == 3
    assert progress_line(row).startswith("iteration 2 · search: 57/128 simulations, ETA ")
    assert progress_line(outer.progress_rows[0]) == "iteration 2 · search"  # begun, nothing counted yet
    # A row naming its own unit keeps it; metrics, log lines and the cancel go to the outer reporter.
    Units(within, "greedy pass", 4, unit="episodes").step()
    assert outer.progress_rows[-1]["unit"] == "episodes"
    within.metrics(3, {"loss": 0.5})
    within.log("hello")
    assert outer.metric_rows == [{"step": 3, "loss": 0.5}] and outer.lines == ["hello"]
    outer.stop = True
    with pytest.raises(Cancelled, match="search: cancelled after 58 of 128"):
        units.step()


@pytest.mark.parametrize(("row", "live", "text"), [
    ({"phase": "sft", "step": 3, "total": 10, "eta_s": 4.6}, True, "sft 3/10, ETA 5 s"),
    ({"phase": "sft", "step": 3, "total": 10, "eta_s": 4.6}, False, "sft 3/10"),
    ({"phase": "evaluate (mcts): model calls", "step": 7, "total": 0}, True, "evaluate (mcts): model calls 7"),
    ({"phase": "iteration 1 · data", "step": 2, "total": 0, "unit": "judge calls"}, True,
     "iteration 1 · data: 2 judge calls"),
    ({"phase": "queued", "step": 0, "total": 0}, True, "queued"),
    ({}, True, ""),
])
def test_progress_line(row: dict[str, Any], live: bool, text: str) -> None:
    assert progress_line(row, live=live) == text


@pytest.mark.parametrize("mode", ["greedy", "sampled", "mcts"])
def test_an_evaluation_tells_each_episode_as_it_ends(mode: str) -> None:
    env = LineEnv(6)
    tasks = env.tasks("train")[:3]
    config = EvalConfig(mode=mode, seeds=(0, 1), max_steps=4, mcts_simulations=2, mcts_k=2)
    ended: list[Any] = []
    result = evaluate(ScriptedGenerator(), lambda: LineEnv(6), tasks, config, on_episode=ended.append)
    assert len(ended) == episode_count(tasks, config) == len(result.episodes) == (3 if mode == "greedy" else 6)
    assert {id(e) for e in ended} == {id(e) for e in result.episodes} and all(e.terminal for e in ended)


def _model(tmp_path: Path) -> Path:
    folder = tmp_path / "base-model"  # never loaded: the loops below train nothing
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({}))
    return folder


def _config(tmp_path: Path, method: str = "exit", **over: Any) -> IterateConfig:
    return replace(IterateConfig(
        method=method, model=str(_model(tmp_path)), env="line", iterations=2, tasks_per_iteration=3,
        eval_split="train", eval_tasks="0:3", output_root=str(tmp_path / "loop"), name=f"loop-{method}",
        gate_split="", search={"simulations": 4, "k": 2, "depth_limit": 4, "max_tokens": 32},
        eval={"mode": "sampled", "seeds": [0, 1], "max_steps": 4, "bootstrap": 50},
        play={"mcts_simulations": 2, "mcts_k": 2}), **over)


def _last(rows: list[dict[str, Any]], iteration: int, phase: str) -> dict[str, Any]:
    return [r for r in rows if r.get("iteration") == iteration and r["phase"].endswith(phase)][-1]


def test_each_stage_of_a_loop_reports_its_own_units(tmp_path: Path) -> None:
    reporter = MemoryReporter()
    with Store(tmp_path / "o.db") as store:
        loop_id = run_loop(store, _config(tmp_path), reporter, make_env=lambda: LineEnv(6),
                           load=lambda path: ScriptedGenerator())
        records = {r["idx"]: r for r in store.iterations(loop_id)}
        rows = reporter.progress_rows
        base = _last(rows, 0, "evaluate")
        assert base["phase"] == "base · evaluate" and base["unit"] == "episodes" and base["step"] == base["total"] == 6
        for i in (1, 2):
            search = _last(rows, i, "search")
            run = store.run(records[i]["run_id"])
            assert search["phase"] == f"iteration {i} · search" and search["unit"] == "simulations"
            assert search["step"] == search["total"] == run.simulations and search["run_id"] == run.id
            assert search["solved"] == run.solved == records[i]["solved_in_search"]
            data = _last(rows, i, "data")
            assert data["unit"] == "trees" and data["step"] == data["total"] == 3
            assert data["rows"] == records[i]["rows_new"] > 0
            assert progress_line(data) == f"iteration {i} · data: 3/3 trees, ETA 0 s"
            assert all(r["last_iteration"] == 2 and r["loop_id"] == loop_id for r in rows if r.get("iteration") == i)
        # every stage ran under its iteration, in order (no rows curated: nothing trained, gated or evaluated)
        stages = [(r["iteration"], r["stage"]) for r in rows]
        assert list(dict.fromkeys(stages)) == [(0, "evaluate"), (1, "search"), (1, "data"), (1, "done"),
                                               (2, "search"), (2, "data"), (2, "done")]


def test_exit_mcts_counts_the_played_episodes_not_each_step_s_search(tmp_path: Path) -> None:
    reporter = MemoryReporter()
    with Store(tmp_path / "o.db") as store:
        loop_id = run_loop(store, _config(tmp_path, "exit-mcts", iterations=1, evaluate_base=False), reporter,
                           make_env=lambda: LineEnv(6), load=lambda path: ScriptedGenerator(p_right=0.3))
        [record] = store.iterations(loop_id)
    play = record["play"]
    search_rows = [r for r in reporter.progress_rows if r.get("stage") == "search" and r.get("step")]
    assert search_rows and {r["unit"] for r in search_rows} == {"episodes"}
    greedy = _last(reporter.progress_rows, 1, "greedy pass")
    assert greedy["phase"] == "iteration 1 · greedy pass" and greedy["step"] == greedy["total"] == play["tasks"]
    if play["played"]:
        played = _last(reporter.progress_rows, 1, "mcts play")
        assert played["step"] == played["total"] == play["played"] and played["solved"] == play["solved"]


class StopAfter(MemoryReporter):
    """Asks to stop once `rows` progress rows have been sent (a cancel in the middle of a stage)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = rows

    def should_stop(self) -> bool:
        return len(self.progress_rows) >= self.rows


def test_a_cancel_in_the_middle_of_a_search_stops_the_loop_and_records_no_iteration(tmp_path: Path) -> None:
    reporter = StopAfter(rows=5)  # the search has begun (its start, then three simulations)
    with Store(tmp_path / "o.db") as store:
        loop_id = run_loop(store, _config(tmp_path, evaluate_base=False), reporter, make_env=lambda: LineEnv(6),
                           load=lambda path: ScriptedGenerator())
        assert store.iterations(loop_id) == []
        [run] = store.runs()
        assert run.status == "interrupted"  # resumable, like any cancelled search
    assert any(line.startswith("stopped: search: cancelled after") for line in reporter.lines)


@pytest.mark.slow
def test_training_and_the_gate_report_steps_and_episodes(tmp_path: Path) -> None:
    """A loop that trains (a tiny model, two SFT steps) and gates (every 10th train task of an env without
    a val split): the trainer's steps and each gate arm's episodes under the iteration."""
    from tiny_model_fixture import build_tiny_model

    train = {"max_steps": 2, "batch_size": 4, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
             "num_threads": 1}
    config = _config(tmp_path, iterations=1, evaluate_base=False, include_pending=True, gate_split="val",
                     model=str(build_tiny_model(tmp_path / "tiny")), sft=train)
    reporter = MemoryReporter()
    with Store(tmp_path / "o.db") as store:
        loop_id = run_loop(store, config, reporter, make_env=lambda: LineEnv(20),
                           load=lambda path: ScriptedGenerator(p_right=0.6))
        [record] = store.iterations(loop_id)
    rows = reporter.progress_rows
    steps = _last(rows, 1, "sft")
    assert steps["phase"] == "iteration 1 · sft" and steps["unit"] == "steps" and steps["stage"] == "train"
    assert steps["step"] == steps["total"] == record["train"]["steps"] == 2
    for arm in ("current policy", "candidate"):
        gate = _last(rows, 1, f"gate: {arm}")
        assert gate["stage"] == "gate" and gate["unit"] == "episodes"
        assert gate["step"] == gate["total"] == 2 * record["gate"]["tasks"]  # two seeds per gate task
    evaluation = _last(rows, 1, "evaluate")
    assert evaluation["step"] == evaluation["total"] == 6  # three tasks, two seeds
    assert list(dict.fromkeys(r["stage"] for r in rows)) == ["search", "data", "train", "gate", "evaluate", "done"]
