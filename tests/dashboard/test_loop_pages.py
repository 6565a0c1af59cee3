"""The pages that drive the loop (issue 15): New search / Resume on Runs, pairs and revisions builds on
the Data pages, evaluations and the Loop view on Evaluation — real jobs on TextCraft with a
random-weights model, and bad input refused at its field with nothing queued or written."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from dash_fixtures import APP
from streamlit.testing.v1 import AppTest

from engine.jobs.runner import JobRunner
from engine.store import Store

RUNS = "views/runs.py"
PAIRS = "views/pairs.py"
TRAJECTORIES = "views/trajectories.py"
EVALUATION = "views/evaluation.py"
SMALL = {"simulations": 1, "k": 2, "depth_limit": 2, "max_tokens": 8}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tiny_model_fixture import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("model") / "m").resolve())


def open_page(page: str | None = None, **params: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    if page is not None:
        at.switch_page(page)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


def errors(at: AppTest) -> str:
    return "\n".join(e.value for e in at.error).replace("\\", "")  # md() escapes punctuation


def fill_search(at: AppTest, model: str, tasks: str = "0:2", **settings) -> None:
    at.text_input(key="rs_tasks").set_value(tasks)
    at.text_input(key="rs_model").set_value(model)
    at.text_input(key="rs_name").set_value("from-the-form")
    for key, value in {**SMALL, **settings}.items():
        at.number_input(key=f"rs_set_{key}").set_value(value)
    at.checkbox(key="rs_set_critic").uncheck()


def queue_search(at: AppTest) -> None:
    next(b for b in at.button if b.label == "Queue the search").click()
    at.run()


def search_run(path: Path, model: str, name: str = "seeded") -> str:
    from engine.jobs.submit import submit_search

    with Store(path) as store:
        job_id = submit_search(store, tasks="0:2", model=model, name=name, search={**SMALL, "critic": False})
        done = JobRunner(store).wait(job_id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        return done.output_path


@pytest.mark.slow
def test_new_search_form_on_an_empty_database_queues_a_search_job_that_runs(db: Path, model: str) -> None:
    at = open_page()
    assert not at.exception, at.exception
    assert "No runs yet" in "\n".join(i.value for i in at.info)
    settings = {n.key for n in at.number_input}
    from engine.config import SearchConfig

    numeric = {f"rs_set_{k}" for k, v in SearchConfig.__dataclass_fields__.items()
               if isinstance(v.default, int | float) and not isinstance(v.default, bool)}
    assert numeric <= settings  # every numeric setting of the dataclass has its field
    fill_search(at, model)
    queue_search(at)
    assert not at.exception and not at.error, errors(at)
    with Store(db) as store:
        (job,) = store.jobs()
        assert job.kind == "search" and job.config["tasks"] == "0:2" and job.config["search"]["k"] == 2
        done = JobRunner(store).wait(job.id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
    at.run()
    runs = next(d.value for d in at.dataframe if "revisions" in d.value)
    assert list(runs["name"]) == ["from-the-form"] and list(runs["status"]) == ["finished"]
    assert any("succeeded" in m.value for m in at.markdown)  # the job panel agrees with the store
    labels = {link.proto.label for link in at.get("page_link")}
    assert {"Tree explorer", "Preference pairs", "Trajectories", "Training", "Evaluation"} <= labels


@pytest.mark.parametrize("shards", [0, 3])
def test_the_shards_field_goes_into_the_queued_search_job(db: Path, model: str, shards: int) -> None:
    at = open_page()
    fill_search(at, model)
    at.number_input(key="rs_shards").set_value(shards)
    queue_search(at)
    assert not at.exception and not at.error, errors(at)
    with Store(db) as store:
        (job,) = store.jobs()
    # 0 leaves the count to the automatic rule (engine.search.local_shards.auto_shards), as --shards omitted does
    assert job.config.get("shards") == (shards or None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("field", "fill", "words"), [
    ("tasks", {"tasks": "5:2"}, "bad task range"),
    ("tasks", {"tasks": "0:100000"}, "out of range"),
    ("alpha", {"alpha": 2.0}, "SearchConfig.alpha"),
    ("k", {"k": 0}, "SearchConfig.k"),
    ("model", {"model": "openai:http://127.0.0.1:PORT/v1#m"}, "did not answer"),
    ("model", {"model": "/no/such/model"}, "no such folder"),
    ("env", {"env_arg": "bogus"}, "takes no argument"),
])
def test_bad_input_in_the_new_search_form_is_told_at_its_field_and_writes_nothing(
        db: Path, model: str, field: str, fill: dict, words: str) -> None:
    at = open_page()
    settings = {k: v for k, v in fill.items() if k not in ("tasks", "model", "env_arg")}
    fill_search(at, fill.get("model", model).replace("PORT", str(_free_port())), fill.get("tasks", "0:1"), **settings)
    if "env_arg" in fill:
        at.text_input(key="rs_env_arg").set_value(fill["env_arg"])
    queue_search(at)
    assert not at.exception
    assert words in errors(at), errors(at)
    assert len(at.error) == 1  # one message, at the field
    assert not db.exists()  # nothing queued, nothing written: not even a database file


def fill_ray(at: AppTest, address: str, prefix: str = "rs_") -> None:
    at.checkbox(key=f"{prefix}ray").check()
    at.text_input(key=f"{prefix}ray_address").set_value(address)


@pytest.fixture()
def head():
    """HOST:PORT where something answers (a listening socket: the probe's TCP connect succeeds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


def closed_address() -> str:
    """HOST:PORT where nothing listens (a port bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def addresses(text: str, head: str, closed: str) -> str:
    return text.replace("HEAD", head).replace("CLOSED", closed)


@pytest.mark.parametrize("address", ["HEAD", "auto", ""])
def test_new_search_on_ray_queues_the_job_config_of_search_ray(db: Path, monkeypatch, head: str,
                                                                address: str) -> None:
    """The job carries the address as `orchard search --ray ADDRESS` does (engine.search.stage runs it on
    Ray: tests/test_ray_search.py runs such a job on a cluster); here it is only queued."""
    pytest.importorskip("ray")
    monkeypatch.setattr(JobRunner, "poll", lambda self, device=None: [])  # queued, not started
    address = addresses(address, head, "")
    at = open_page()
    fill_search(at, "tiny")
    fill_ray(at, address)
    queue_search(at)
    assert not at.exception and not at.error, errors(at)
    assert any("on Ray" in s.value for s in at.success)
    with Store(db) as store:
        (job,) = store.jobs()
    assert job.kind == "search" and job.state == "queued" and job.device == "cpu"
    assert job.config["ray"] == address and job.config["model"] == "tiny" and job.config["tasks"] == "0:2"


@pytest.mark.parametrize(("fill", "field_words"), [
    ({"ray": "head"}, "ray address 'head': expected HOST:PORT"),
    ({"ray": "ray://head:10001"}, "ray address 'ray://head:10001': expected HOST:PORT"),
    ({"ray": "head:99999"}, "ray address 'head:99999': expected HOST:PORT"),
    ({"ray": "HEAD", "model": "/no/such/model"}, "model '/no/such/model': no such folder"),
    ({"ray": "CLOSED"}, "cannot reach the Ray cluster at CLOSED: connection refused"),
])
def test_bad_ray_input_in_the_new_search_form_is_told_at_its_field_and_writes_nothing(
        db: Path, head: str, fill: dict, field_words: str) -> None:
    pytest.importorskip("ray")
    closed = closed_address()
    at = open_page()
    fill_search(at, fill.get("model", "tiny"), "0:1")
    fill_ray(at, addresses(fill["ray"], head, closed))
    queue_search(at)
    assert not at.exception
    assert addresses(field_words, head, closed) in errors(at), errors(at)
    assert len(at.error) == 1  # one message, at its field
    assert not db.exists()  # nothing queued, nothing written


def test_new_search_on_ray_without_ray_installed_says_how_to_install_it(db: Path, monkeypatch) -> None:
    import builtins

    from engine.search.ray_search import INSTALL_HINT

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    at = open_page()
    fill_search(at, "tiny", "0:1")
    fill_ray(at, "")
    monkeypatch.setattr(builtins, "__import__", no_ray)
    queue_search(at)
    assert not at.exception
    assert errors(at) == INSTALL_HINT and len(at.error) == 1
    assert not db.exists()


@pytest.mark.slow
def test_resume_an_interrupted_run_from_the_runs_page(db: Path, model: str) -> None:
    from engine.jobs.kinds import load_job
    from engine.progress import Cancelled, MemoryReporter
    from engine.search.stage import run_search

    class StopAfterOne(MemoryReporter):
        def should_stop(self) -> bool:
            return bool(self.progress_rows) and (self.progress_rows[-1].get("step") or 0) >= 1

    with Store(db) as store, pytest.raises(Cancelled):
        run_search(store, load_job("search", {"tasks": "0:1", "model": model, "name": "half",
                                              "search": {**SMALL, "simulations": 3}}), StopAfterOne())
    at = open_page()
    at.text_input(key="rs_resume_model").set_value("/no/such/model")
    next(b for b in at.button if b.label == "Resume").click()
    at.run()
    assert "no such folder" in errors(at) and len(at.error) == 1
    with Store(db, readonly=True) as store:
        assert store.jobs() == []
    at.text_input(key="rs_resume_model").set_value(model)
    next(b for b in at.button if b.label == "Resume").click()
    at.run()
    assert not at.exception and not at.error, errors(at)
    with Store(db) as store:
        (job,) = store.jobs()
        (run,) = store.runs()
        assert job.kind == "search" and job.config == {"resume": run.id, "model": model}
        done = JobRunner(store).wait(job.id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        assert store.run(run.id).status == "finished" and store.run(run.id).simulations == 3


def resume_button(at: AppTest) -> None:
    next(b for b in at.button if b.label == "Resume").click()
    at.run()


def test_resume_on_ray_queues_the_address_and_a_bad_one_is_told_at_its_field(db: Path, monkeypatch,
                                                                              head: str) -> None:
    """Resume takes the New search form's Ray inputs (the same helper): the queued job is the config
    `orchard search --resume RUN --ray ADDRESS` runs; a malformed address, or one nothing answers
    (told within seconds), is refused at the field with nothing queued."""
    pytest.importorskip("ray")
    import time
    from dataclasses import asdict

    from engine.config import SearchConfig
    from engine.envs.registry import env_factory

    monkeypatch.setattr(JobRunner, "poll", lambda self, device=None: [])  # queued, not started
    with Store(db) as store:
        run_id = store.create_run("half", "textcraft", "tiny", asdict(SearchConfig()),
                                  env_factory("textcraft")().tasks("train")[:1])
        store.set_run_status(run_id, "interrupted")
    at = open_page()
    closed = closed_address()
    for address, words in [("head", "ray address 'head': expected HOST:PORT"),
                           (closed, f"cannot reach the Ray cluster at {closed}: connection refused")]:
        fill_ray(at, address, "rs_resume_")
        t0 = time.perf_counter()
        resume_button(at)
        assert time.perf_counter() - t0 < 10
        assert not at.exception
        assert words in errors(at) and len(at.error) == 1, errors(at)  # at its field, the only message
        with Store(db, readonly=True) as store:
            assert store.jobs() == []
    fill_ray(at, f" {head} ", "rs_resume_")
    resume_button(at)
    assert not at.exception and not at.error, errors(at)
    assert any(f"resume run {run_id} on Ray" in s.value.replace("\\", "") for s in at.success)
    with Store(db) as store:
        (job,) = store.jobs()
    assert job.kind == "search" and job.state == "queued" and job.device == "cpu"
    assert job.config == {"resume": run_id, "ray": head}


@pytest.mark.slow
def test_pairs_page_builds_pairs_for_its_run_and_refuses_a_bad_theta(db: Path, model: str) -> None:
    run_id = search_run(db, model)
    at = open_page(PAIRS, run=run_id)
    assert not at.exception, at.exception
    at.number_input(key="pb_theta").set_value(-1.0)
    next(b for b in at.button if b.label == "Build pairs").click()
    at.run()
    assert "pairs theta" in errors(at) and len(at.error) == 1
    with Store(db, readonly=True) as store:
        assert [j.kind for j in store.jobs()] == ["search"]  # nothing queued
    at.number_input(key="pb_theta").set_value(0.0)
    next(b for b in at.button if b.label == "Build pairs").click()
    at.run()
    assert not at.error, errors(at)
    with Store(db) as store:
        job = store.jobs()[-1]
        assert job.kind == "pairs" and job.config["run"] == run_id and job.config["theta"] == 0.0
        done = JobRunner(store).wait(job.id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        total = store.pair_counts(run_id=run_id)["total"]
    at.run()
    assert any("succeeded" in m.value for m in at.markdown)
    assert f"{total} pairs match the filters" in "\n".join(c.value for c in at.caption)


@pytest.mark.slow
def test_trajectories_page_builds_revisions_with_a_judge_and_refuses_bad_input(db: Path, model: str) -> None:
    run_id = search_run(db, model)
    at = open_page(TRAJECTORIES, run=run_id)
    assert not at.exception, at.exception
    at.text_input(key="rb_model").set_value("/no/such/judge")
    next(b for b in at.button if b.label == "Build revisions").click()
    at.run()
    assert "no such folder" in errors(at) and len(at.error) == 1
    at.text_input(key="rb_model").set_value(model)
    at.number_input(key="rb_alpha_good").set_value(1.5)
    next(b for b in at.button if b.label == "Build revisions").click()
    at.run()
    assert "alpha_good" in errors(at) and len(at.error) == 1
    with Store(db, readonly=True) as store:
        assert [j.kind for j in store.jobs()] == ["search"]
    at.number_input(key="rb_alpha_good").set_value(0.3)
    at.number_input(key="rb_beta_gap").set_value(0.2)
    next(b for b in at.button if b.label == "Build revisions").click()
    at.run()
    assert not at.error, errors(at)
    with Store(db) as store:
        job = store.jobs()[-1]
        assert job.kind == "revisions" and job.config == {"run": run_id, "model": model, "alpha_good": 0.3,
                                                          "beta_gap": 0.2}
        done = JobRunner(store).wait(job.id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
    at.run()
    assert any("succeeded" in m.value for m in at.markdown)


def _eval_page(db: Path) -> AppTest:
    with Store(db) as store:  # the Evaluation page needs a database; a run keeps the app's other pages happy
        store.create_job("probe", {"steps": 1}, "cpu", name="seed")
        store.finish_job(store.jobs()[0].id, "succeeded")
    return open_page(EVALUATION)


@pytest.mark.slow
def test_launch_an_evaluation_and_compare_models_side_by_side(db: Path, model: str) -> None:
    at = _eval_page(db)
    assert not at.exception, at.exception
    at.text_input(key="ev_model").set_value(model)
    at.text_input(key="ev_tasks").set_value("0:2")
    at.number_input(key="ev_set_max_steps").set_value(2)
    at.number_input(key="ev_set_max_tokens").set_value(8)
    at.number_input(key="ev_set_bootstrap").set_value(50)
    next(b for b in at.button if b.label == "Launch the evaluation").click()
    at.run()
    assert not at.error, errors(at)
    with Store(db) as store:
        job = store.jobs()[-1]
        assert job.kind == "eval" and job.config["eval"] == {"mode": "greedy", "max_steps": 2, "max_tokens": 8,
                                                             "bootstrap": 50, "constrained": True}  # the demo's
        done = JobRunner(store).wait(job.id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        from engine.envs.registry import env_factory
        from engine.evaluate import EvalConfig, evaluate_and_store
        from engine.llm.registry import load_generator

        evaluate_and_store(store, load_generator(model), "textcraft", "test", env_factory("textcraft")().tasks("test")[:2],
                           EvalConfig(mode="sampled", seeds=(0, 1), max_steps=2, max_tokens=8, bootstrap=50),
                           model="tiny-copy")
    at.run()
    assert not at.exception, at.exception
    side = next(d.value for d in at.dataframe if "success rate" in d.value.index)
    assert len(side.columns) == 1 and "greedy" in side.columns[0]  # only the baseline's settings by default
    picker = next(m for m in at.multiselect if m.label == "Evaluations side by side")
    picker.set_value(list(picker.options))
    at.run()
    side = next(d.value for d in at.dataframe if "success rate" in d.value.index)
    assert len(side.columns) == 2 and any("greedy" in c for c in side.columns) and any("sampled" in c for c in side.columns)
    assert all("[" in v for v in side.loc["success rate"])  # every figure with its interval
    assert "mode greedy vs sampled" in "\n".join(w.value for w in at.warning).replace("\\", "")


@pytest.mark.parametrize(("fill", "words"), [
    ({"ev_tasks": "9:3"}, "bad task range"),
    ({"ev_model": "openai:http://127.0.0.1:PORT/v1#m"}, "did not answer"),
    ({"ev_set_mcts_simulations": 0}, "EvalConfig.mcts_simulations"),
    ({"ev_set_seeds": "a,b"}, "comma-separated"),
])
def test_bad_input_in_the_evaluation_form_is_told_at_its_field_and_queues_nothing(db: Path, fill, words) -> None:
    at = _eval_page(db)
    for key, value in fill.items():
        widget = at.number_input(key=key) if key.startswith("ev_set_") and key != "ev_set_seeds" else at.text_input(key=key)
        widget.set_value(value.replace("PORT", str(_free_port())) if isinstance(value, str) else value)
    at.radio(key="ev_mode").set_value("mcts")
    next(b for b in at.button if b.label == "Launch the evaluation").click()
    at.run()
    assert not at.exception
    assert words in errors(at) and len(at.error) == 1, errors(at)
    with Store(db, readonly=True) as store:
        assert [j.kind for j in store.jobs()] == ["probe"]


def test_loop_view_shows_each_stage_and_next_iteration_continues_the_loop_with_its_newest_model(db: Path) -> None:
    with Store(db) as store:
        base = {"method": "agentq", "model": "tiny", "env": "textcraft", "iterations": 1, "tasks_per_iteration": 2,
                "name": "loop-a", "search": {"simulations": 1}}
        store.save_iteration("loop-a", 0, "agentq", {"model": "tiny", "config": base,
                                                     "eval": {"success": {"mean": 0.1, "low": 0.0, "high": 0.3}}})
        store.save_iteration("loop-a", 1, "agentq", {"run_id": "r1", "solved_in_search": 1, "pairs": 5,
                                                     "model": "tiny", "train": {"train_loss": 0.5}, "config": base,
                                                     "eval": {"success": {"mean": 0.2, "low": 0.0, "high": 0.4}}})
    at = _eval_page(db)
    assert not at.exception, at.exception
    stages = next(d.value for d in at.dataframe if "curation" in d.value)
    assert list(stages["iteration"]) == ["base", "1"]
    assert stages.iloc[1]["data"] == "✓ 5 rows" and stages.iloc[1]["train"] == "✓"
    assert stages.iloc[1]["evaluate"] == "0.200 [0.000, 0.400]"
    at.button(key="ev_next").click()
    at.run()
    assert not at.error, errors(at)
    with Store(db) as store:
        job = store.jobs()[-1]
        JobRunner(store).cancel(job.id, grace_s=30)  # the config is what matters here
    assert job.kind == "iterate"
    cfg = job.config["iterate"]
    assert cfg["name"] == "loop-a" and cfg["first_iteration"] == 2 and cfg["iterations"] == 1
    assert cfg["evaluate_base"] is False and cfg["model"] == "tiny" and cfg["search"] == {"simulations": 1}


def test_next_iteration_asks_whether_to_train_on_uncurated_rows_and_shows_the_last_counts(db: Path) -> None:
    """The loop's curation gate in the Loop view: the last iteration's counts by curation state, and the
    choice (default: the loop's own) carried into the next iteration's job."""
    with Store(db) as store:
        base = {"method": "exit", "model": "tiny", "env": "textcraft", "iterations": 1, "tasks_per_iteration": 2,
                "name": "loop-g", "search": {"simulations": 1}, "include_pending": False}
        store.save_iteration("loop-g", 1, "exit", {
            "run_id": "r1", "solved_in_search": 2, "samples": 0, "model": "tiny", "config": base,
            "curation": {"final": 0, "uncurated_used": 0, "uncurated_left_out": 7},
            "skipped": "no curated search rows: 7 uncurated rows left out"})
    at = _eval_page(db)
    assert not at.exception, at.exception
    stages = next(d.value for d in at.dataframe if "curation" in d.value)
    assert stages.iloc[-1]["curation"] == "trained on 0: 0 curated + 0 uncurated; 7 uncurated left out"
    assert "Last iteration: 0 curated rows, 7 uncurated (left out)" in "\n".join(c.value for c in at.caption)
    assert at.checkbox(key="ev_next_pending").value is False  # the loop's own choice
    at.checkbox(key="ev_next_pending").check()
    at.run()
    at.button(key="ev_next").click()
    at.run()
    assert not at.error, errors(at)
    with Store(db) as store:
        job = store.jobs()[-1]
        JobRunner(store).cancel(job.id, grace_s=30)
    assert job.config["iterate"]["include_pending"] is True and job.config["iterate"]["method"] == "exit"


def test_a_new_loop_defaults_to_expert_iteration(db: Path) -> None:
    at = _eval_page(db)
    assert at.selectbox(key="ev_loop_method").value == "exit"
    assert at.checkbox(key="ev_loop_pending").value is False


def test_start_a_loop_refuses_a_bad_held_out_selection_and_queues_nothing(db: Path) -> None:
    at = _eval_page(db)
    at.text_input(key="ev_loop_eval").set_value("0:99999")
    next(b for b in at.button if b.label == "Start the loop").click()
    at.run()
    assert not at.exception
    assert "out of range" in errors(at) and len(at.error) == 1, errors(at)
    with Store(db, readonly=True) as store:
        assert [j.kind for j in store.jobs()] == ["probe"]


def _start_loop(at: AppTest) -> None:
    next(b for b in at.button if b.label == "Start the loop").click()
    at.run()


def _started_loop_config(at: AppTest, db: Path) -> dict:
    """Start the loop the form holds; its job is queued (then cancelled here) and its iterate config returned."""
    _start_loop(at)
    assert not at.exception and not at.error, errors(at)
    with Store(db) as store:
        job = store.jobs()[-1]
        JobRunner(store).cancel(job.id, grace_s=30)
    return job.config["iterate"]


def test_start_a_loop_carries_corrections_for_a_play_method_and_refuses_them_for_another(db: Path) -> None:
    at = _eval_page(db)
    at.number_input(key="ev_loop_corrections").set_value(2)
    _start_loop(at)
    assert "IterateConfig.corrections" in errors(at), errors(at)  # exit trains no play: refused under the field
    with Store(db, readonly=True) as store:
        assert [j.kind for j in store.jobs()] == ["probe"]
    at.selectbox(key="ev_loop_method").set_value("exit-sampled")
    cfg = _started_loop_config(at, db)
    assert cfg["method"] == "exit-sampled" and cfg["corrections"] == 2


def test_start_a_loop_carries_renamed_copies_and_refuses_them_where_the_env_cannot_rename(db: Path) -> None:
    at = _eval_page(db)
    at.number_input(key="ev_loop_renamed").set_value(3)
    at.selectbox(key="ev_loop_env").set_value("babyai")  # BabyAI's entities are not renamed
    _start_loop(at)
    assert "cannot rename" in errors(at), errors(at)
    at.selectbox(key="ev_loop_method").set_value("agentq")  # pairs + DPO: no trajectories to copy
    at.selectbox(key="ev_loop_env").set_value("textcraft")
    _start_loop(at)
    assert "IterateConfig.renamed" in errors(at), errors(at)
    with Store(db, readonly=True) as store:
        assert [j.kind for j in store.jobs()] == ["probe"]
    at.selectbox(key="ev_loop_method").set_value("exit")
    cfg = _started_loop_config(at, db)
    assert cfg["method"] == "exit" and cfg["renamed"] == 3


def test_run_stages_follow_a_run_from_search_to_evaluation(db: Path) -> None:
    from doubles import ScriptedGenerator, SnapshotLineEnv

    from dashboard.loop import run_stages
    from engine.config import SearchConfig
    from engine.search.runner import new_run

    with Store(db) as store:
        run_id, _ = new_run(store, "line", SnapshotLineEnv().tasks()[:1], ScriptedGenerator(),
                            SearchConfig(simulations=2, k=2, depth_limit=3), "staged", make_env=SnapshotLineEnv)
        before = run_stages(str(db), (0,))[run_id].row()
        assert before == {"searched": "finished", "pairs": 0, "revisions": 0, "trained": 0, "evaluated": 0}
        job = store.create_job("dpo", {"model": "tiny", "runs": [run_id]}, "cpu")
        store.claim_next_job("cpu")
        store.finish_job(job.id, "succeeded", output_path="/models/dpo-1")
        store.save_evaluation("/models/dpo-1", "line", "test", ["goal-1"], "greedy", {},
                              {"success": {"mean": 1.0, "low": 1.0, "high": 1.0}, "episodes": 1}, [])
        after = run_stages(str(db), (1,))[run_id].row()
    assert after["trained"] == 1 and after["evaluated"] == 1
