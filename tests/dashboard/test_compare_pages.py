"""The Evaluation page compares only like with like (issue 31 A): a banner names each setting two
evaluations differ in, a model beside its baseline shows the paired difference, the launch form
starts from the baseline's settings (the demo's with none), bars carry their values, and the Loop
view plots every iteration's rates. Real evaluations (scripted generator, line env) through AppTest."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import APP, copy_store
from doubles import ScriptedGenerator, SnapshotLineEnv
from streamlit.testing.v1 import AppTest

from engine.evaluate import DEFAULT_EVAL, EvalConfig, evaluate_and_store, paired_bootstrap_diff
from engine.store import Store

EVALUATION = "views/evaluation.py"
LINE = EvalConfig(mode="greedy", max_steps=4, bootstrap=200)


@pytest.fixture()
def db(store_db, tmp_path: Path, monkeypatch) -> Path:
    path = copy_store(store_db[0], tmp_path / "orchard.db")
    monkeypatch.setenv("ORCHARD_DB", str(path))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))
    return path


def evaluate(path: Path, model: str, config: EvalConfig = LINE, n_tasks: int = 4, p_right: float = 0.6) -> str:
    with Store(path) as store:
        result = evaluate_and_store(store, ScriptedGenerator(p_right=p_right), "line", "train",
                                    SnapshotLineEnv().tasks()[:n_tasks], config, model=model, make_env=SnapshotLineEnv)
    return str(result.eval_id)


def open_page() -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(EVALUATION)
    return at.run()


def warnings(at: AppTest) -> str:
    return "\n".join(w.value for w in at.warning).replace("\\", "")  # md() escapes punctuation


def side_table(at: AppTest):
    return next(d.value for d in at.dataframe if "success rate" in d.value.index)


def test_a_comparison_across_settings_shows_a_banner_naming_each_difference(db: Path) -> None:
    base = evaluate(db, "/models/base")
    other = evaluate(db, "/models/trained", EvalConfig(mode="greedy", max_steps=6, bootstrap=200, constrained=True),
                     n_tasks=2)
    at = open_page()
    assert not at.exception, at.exception
    assert not at.warning  # by default only the baseline's settings are side by side
    assert list(side_table(at).columns) == [f"base · greedy · {base[:6]}"]
    picker = next(m for m in at.multiselect if m.label == "Evaluations side by side")
    picker.set_value([base, other])
    at.run()
    assert not at.exception, at.exception
    text = warnings(at)
    assert "Not comparable with the baseline base" in text
    for words in ("max_steps 4 vs 6", "constrained no vs yes", "tasks 4 vs 2"):
        assert words in text, text
    row = side_table(at).loc["success rate − baseline (paired)"]
    assert row.iloc[0] == "baseline" and row.iloc[1] == "no paired difference: different tasks (2 vs 4)"


def test_a_model_beside_its_baseline_shows_the_paired_difference(db: Path) -> None:
    base = evaluate(db, "/models/base", p_right=0.3)
    trained = evaluate(db, "/models/trained", p_right=0.9)
    at = open_page()
    assert not at.exception, at.exception
    assert not at.warning
    with Store(db, readonly=True) as store:
        episodes = {e["id"]: e["episodes"] for e in store.evaluations(with_episodes=True)}

    def by_task(eval_id: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for e in episodes[eval_id]:
            out.setdefault(e["task_id"], []).append(1.0 if e["success"] else 0.0)
        return out

    want = paired_bootstrap_diff(by_task(base), by_task(trained), n=200)
    row = side_table(at).loc["success rate − baseline (paired)"]
    assert list(row) == ["baseline", f"{want['mean']:+.3f} [{want['low']:+.3f}, {want['high']:+.3f}] (4 tasks)"]


def test_the_form_starts_from_the_demos_settings_and_then_from_the_chosen_baseline(db: Path) -> None:
    from engine.demo import DEMO, stage_evaluate
    from engine.envs.registry import env_factory

    def form(at: AppTest) -> dict:
        out = {f: at.number_input(key=f"ev_set_{f}").value for f in ("max_steps", "max_tokens", "bootstrap")}
        return {**out, "constrained": at.checkbox(key="ev_set_constrained").value, "mode": at.radio(key="ev_mode").value,
                "tasks": at.text_input(key="ev_tasks").value}

    demo = {k: getattr(DEFAULT_EVAL, k) for k in ("max_steps", "max_tokens", "bootstrap", "constrained", "mode")}
    with Store(db) as store:  # no evaluation yet: the form shows the demo's settings
        store.create_job("probe", {"steps": 1}, "cpu", name="seed")
    at = open_page()
    assert not at.exception, at.exception
    assert form(at) == {**demo, "tasks": ""}
    with Store(db) as store:  # what the demo stores (its evaluation stage, on one held-out task)
        stage_evaluate(store, "no-run", ScriptedGenerator(), "/models/demo-base",
                       env_factory("textcraft")().tasks("test")[:1], DEMO, lambda _: None)
        (stored,) = store.evaluations()
    assert {k: stored["config"][k] for k in demo} == demo
    other = evaluate(db, "/models/other", EvalConfig(mode="sampled", max_steps=3, bootstrap=50))
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="ev_env").value == "line" and at.selectbox(key="ev_baseline").value == other
    assert form(at) == {"max_steps": 3, "max_tokens": 256, "bootstrap": 50, "constrained": False, "mode": "sampled",
                        "tasks": "goal-1,goal-2,goal-3,goal-4"}  # the line env is no registered env: its ids
    at.selectbox(key="ev_env").set_value("textcraft")
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="ev_baseline").value == stored["id"]
    assert form(at) == {**demo, "tasks": "0:1"}  # a new baseline, the demo's: the form follows it


def test_bars_carry_their_values_and_a_zero_bar_is_visible() -> None:
    from dashboard.figures import MIN_BAR, eval_figure

    rows = [{"label": "base", "mode": "greedy", "success": {"mean": 0.375, "low": 0.125, "high": 0.75, "n": 8}},
            {"label": "trained", "mode": "greedy", "success": {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 8}}]
    (bar,) = eval_figure(rows, "success").data
    assert list(bar.text) == ["3/8", "0/8"] and [x.rsplit("<br>", 1)[1] for x in bar.x] == ["<b>3/8</b>", "<b>0/8</b>"]
    assert bar.y[1] >= MIN_BAR and list(bar.customdata) == [0.375, 0.0]


def test_the_loop_view_plots_each_iterations_rates_and_flags_other_settings(db: Path) -> None:
    first = evaluate(db, "/models/base")
    second = evaluate(db, "/models/it1", EvalConfig(mode="greedy", max_steps=8, bootstrap=200))
    with Store(db) as store:
        evals = {e["id"]: e["metrics"] for e in store.evaluations()}
        for idx, eval_id in enumerate((first, second)):
            scores = {k: evals[eval_id][k] for k in ("success", "progress", "loop_rate")}
            store.save_iteration("loop-x", idx, "agentq", {"model": f"m{idx}", "eval": {"eval_id": eval_id, **scores}})
    at = open_page()
    assert not at.exception, at.exception
    assert "iteration 1 was evaluated under other settings than the first evaluation: max_steps 4 vs 8" in warnings(at)
    stages = next(d.value for d in at.dataframe if "curation" in d.value)
    base_cell, it_cell = stages["success − baseline (paired)"]
    assert base_cell == "baseline" and it_cell[0] in "+-" and it_cell.endswith("(4 tasks)")
    chart = next(c for c in at.get("plotly_chart") if "rate" in c.proto.spec and "loop rate" in c.proto.spec)
    for name in ("success rate", "progress rate", "loop rate", "iteration 1"):
        assert name in chart.proto.spec


def test_the_forms_constrained_default_is_refused_for_an_http_model_at_its_field(db: Path) -> None:
    """The demo's settings decode under the grammar, which an openai: server does not: told before queuing."""
    from canned_http import canned_server

    with Store(db) as store:
        store.create_job("probe", {"steps": 1}, "cpu", name="seed")
    with canned_server(lambda method, path, body: (200, b'{"data": []}')) as url:
        at = open_page()
        at.text_input(key="ev_model").set_value(f"openai:{url}/v1#m")
        next(b for b in at.button if b.label == "Launch the evaluation").click()
        at.run()
    assert not at.exception, at.exception
    assert len(at.error) == 1 and "constrained decoding needs an hf: or vllm: model" in at.error[0].value.replace("\\", "")
    with Store(db, readonly=True) as store:
        assert [j.kind for j in store.jobs()] == ["probe"]


def test_next_iteration_of_a_loop_recorded_without_settings_is_evaluated_like_its_base(db: Path) -> None:
    """The demo records its loop without a config: Next iteration evaluated on the whole test split with
    EvalConfig()'s defaults (2/109 beside 3/8). It now takes its base evaluation's split, tasks and settings."""
    from engine.jobs.submit import next_iteration_config
    from engine.loop import IterateConfig

    base = evaluate(db, "/models/base", DEFAULT_EVAL)
    with Store(db) as store:
        store.save_iteration("loop-demo", 0, "agentq", {"model": "/models/base", "eval": {"eval_id": base}})
        store.save_iteration("loop-demo", 1, "agentq", {"run_id": "r", "model": "/models/trained", "pairs": 3})
        cfg = next_iteration_config(store, "loop-demo")
    assert (cfg["eval_split"], cfg["eval_tasks"]) == ("train", "goal-1,goal-2,goal-3,goal-4")
    assert cfg["eval"] == {"mode": "greedy", "max_steps": 10, "max_tokens": 160, "constrained": True}
    assert IterateConfig.from_dict(cfg).eval_config() == DEFAULT_EVAL
    assert cfg["model"] == "/models/trained" and cfg["first_iteration"] == 2
