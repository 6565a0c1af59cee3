"""The job runner: separate processes, states in the store, queueing per device, cancel, crashes."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from engine.config import ConfigError
from engine.envs.base import TaskSpec
from engine.jobs.runner import REPO_ROOT, JobRunner, process_alive
from engine.store import JobInfo, Store


@pytest.fixture
def store(db, tmp_path: Path, monkeypatch):
    """A store on each backend; job logs of a server store go to $ORCHARD_HOME/jobs (here tmp_path)."""
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path))
    with Store(db) as s:
        yield s


def _until(predicate, timeout: float = 30.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def _intact(path: Path | str) -> None:
    if str(path).startswith("postgresql://"):
        return  # the server keeps its own integrity; this checks SQLite's file
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()


def test_migration_3_adds_the_training_tables_to_a_version_2_database(tmp_path: Path, monkeypatch) -> None:
    from engine.store import schema as store_module  # the migrations live in engine.store.schema

    path = tmp_path / "v2.db"
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:2])
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 2)
    with Store(path) as old:
        run_id = old.create_run("r", "line", "m", {}, [TaskSpec(id="t1", goal="g")])
        assert old.schema_version == 2
    monkeypatch.undo()
    with Store(path) as new:
        assert new.schema_version == store_module.SCHEMA_VERSION and new.find_run(run_id) == run_id
        tables = {r[0] for r in new.con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"jobs", "job_metrics", "models", "evaluations", "iterations"} <= tables
        assert new.jobs() == [] and new.models() == [] and new.evaluations() == []


def test_queue_progress_cancel_and_failure(store: Store) -> None:
    runner = JobRunner(store)
    long = runner.submit("probe", {"steps": 400, "seconds": 0.05}, device="cpu")
    queued = runner.submit("probe", {"steps": 4, "seconds": 0.02, "fail": True}, device="cpu")
    other = runner.submit("probe", {"steps": 2, "seconds": 0.01}, device="cuda:7")
    assert long.state == "running" and queued.state == "queued"  # one job per device
    assert other.state == "running"  # another device runs in parallel
    progress = _until(lambda: store.job(long.id).progress if store.job(long.id).progress.get("step", 0) >= 3
                      else None)
    assert progress["total"] == 400 and progress["eta_s"] > 0 and progress["phase"] == "probe"
    assert store.job(queued.id).state == "queued"
    assert [m["loss"] for m in store.job_metrics(long.id)[:2]] == [1.0, 0.5]

    cancelled = runner.cancel(long.id, grace_s=20)
    assert cancelled.state == "cancelled" and cancelled.cancel_requested
    assert not process_alive(long.pid or 0, long.id)
    failed = runner.wait(queued.id, timeout=30)  # the queue moved on to the next job
    assert failed.state == "failed" and "probe failure at step 2" in (failed.error or "")
    log = Path(failed.log_path or "").read_text()
    assert "Traceback" in log and "RuntimeError: probe failure" in log
    assert "cancelled" in Path(long.log_path or "").read_text()
    assert runner.wait(other.id, timeout=30).state == "succeeded"
    _intact(store.path)


def test_cancel_a_queued_job_never_starts_it(store: Store) -> None:
    runner = JobRunner(store)
    first = runner.submit("probe", {"steps": 200, "seconds": 0.05}, device="cpu")
    second = runner.submit("probe", {"steps": 1}, device="cpu")
    assert runner.cancel(second.id).state == "cancelled"
    assert store.job(second.id).pid is None and store.job(second.id).started_at is None
    runner.cancel(first.id, grace_s=20)
    runner.poll()
    assert store.job(second.id).state == "cancelled"


def test_a_killed_worker_is_detected_after_a_restart_and_the_store_is_intact(store: Store, tmp_path: Path) -> None:
    run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id="t1", goal="g")])
    job = JobRunner(store).submit("probe", {"steps": 500, "seconds": 0.02}, device="cpu")
    _until(lambda: store.job(job.id).progress.get("step", 0) >= 2)
    pid = store.job(job.id).pid
    assert pid is not None and process_alive(pid, job.id)
    os.killpg(pid, signal.SIGKILL)  # a crash: no chance to record anything
    # "The dashboard restarts": a new connection and runner know only what the store says.
    with Store(store.location) as fresh:
        runner = JobRunner(fresh)

        def failed():
            runner.poll()
            return fresh.job(job.id) if fresh.job(job.id).final else None

        job_after = _until(failed)
        assert job_after.state == "failed" and "died" in (job_after.error or "")
        assert fresh.run(run_id).name == "r"  # unrelated rows untouched
        assert len(fresh.job_metrics(job.id)) >= 2  # what the worker committed is kept
    _intact(store.path)


def test_bad_configs_are_refused_or_fail_in_the_worker(store: Store, tmp_path: Path) -> None:
    runner = JobRunner(store)
    with pytest.raises(ConfigError, match="unknown job kind"):
        runner.submit("nope", {}, device="cpu")
    with pytest.raises(ConfigError, match="learning_rat"):
        runner.submit("dpo", {"model": "tiny", "train": {"learning_rat": 1}}, device="cpu")
    with pytest.raises(ConfigError, match="model"):
        runner.submit("sft", {"train": {}}, device="cpu")
    with pytest.raises(ConfigError, match="needs a local model folder"):
        runner.submit("dpo", {"model": "openai:http://127.0.0.1:9/v1#m"}, device="cpu")
    with pytest.raises(ConfigError, match="no config.json"):
        runner.submit("sft", {"model": str(tmp_path)}, device="cpu")
    with pytest.raises(ConfigError, match="expected cpu, cuda or cuda:N"):
        runner.submit("probe", {"steps": 1}, device="banana")
    assert store.jobs() == []  # nothing queued for refused configs
    bad = runner.submit("dpo", {"model": "tiny", "train": {"beta": -1}}, device="cpu", validate=False)
    done = runner.wait(bad.id, timeout=60)
    assert done.state == "failed" and "beta" in (done.error or "")
    log = Path(done.log_path or "").read_text()
    assert "failed: ConfigError" in log and "beta" in log
    assert "Traceback" not in log  # a user error is its one-line reason; a crash keeps its traceback (above)
    _intact(store.path)


@pytest.mark.slow
def test_a_real_dpo_job_reports_progress_is_cancelled_and_the_next_one_trains(store: Store, tmp_path: Path) -> None:
    from doubles import action_text
    from tiny_model_fixture import build_tiny_model

    from engine.datasets.pairs import Pair
    from engine.llm.registry import load_generator
    from engine.prompts import actor_prompt

    model = build_tiny_model(tmp_path / "base")
    run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id=f"goal-{i}", goal="g") for i in range(4)])
    pairs = [
        Pair(id=f"p{i}", kind="step", run_id=run_id, tree_id=None, task_id=f"goal-{i}", node_id=0, chosen_node=1,
             rejected_node=2, prompt=actor_prompt("Commands: left, right.", "reach 3", "", [], f"at {i}"),
             chosen=action_text("right"), rejected=action_text("left"), q_chosen=1.0, q_rejected=0.0,
             logprob_chosen=None, logprob_rejected=None, depth=0)
        for i in range(4)
    ]
    store.save_pairs(run_id, pairs)
    store.bulk_set_pair_status("approved", "test", run_id=run_id)
    runner = JobRunner(store)
    train = {"max_steps": 100000, "batch_size": 2, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
             "num_threads": 1}
    long = runner.submit("dpo", {"model": str(model), "train": train}, device="cpu")
    out = tmp_path / "trained"
    short = runner.submit("dpo", {"model": str(model), "output": str(out), "runs": [run_id],
                                  "train": {**train, "max_steps": 2}}, device="cpu")
    assert store.job(short.id).state == "queued"
    seen = _until(lambda: store.job(long.id).progress if store.job(long.id).progress.get("step", 0) >= 2 else None,
                  timeout=90)
    assert seen["phase"] == "dpo" and seen["total"] == 100000
    assert any("rewards/margins" in m for m in store.job_metrics(long.id))
    assert runner.cancel(long.id, grace_s=30).state == "cancelled"
    done = runner.wait(short.id, timeout=120)
    assert done.state == "succeeded", Path(done.log_path or "").read_text()[-2000:]
    assert done.output_path == str(out.resolve())
    record = store.model_record(str(out.resolve()))
    assert record.kind == "dpo" and record.job_id == short.id and sorted(record.data_ids) == [p.id for p in pairs]
    assert record.parent == str(model.resolve()) and record.metrics["steps"] == 2
    assert load_generator(str(out)).name.endswith(str(out.resolve()))
    assert not (tmp_path / "trained-cancelled").exists()
    _intact(store.path)


def test_a_store_opened_by_a_relative_path_runs_its_jobs(tmp_path: Path, monkeypatch) -> None:
    """Workers start in the repository root: the store hands them an absolute path (a relative
    one made the worker open, and create, a different database there)."""
    monkeypatch.chdir(tmp_path)
    with Store("relative.db") as store:
        assert store.path == tmp_path / "relative.db"
        runner = JobRunner(store)
        job = runner.submit("probe", {"steps": 2, "seconds": 0.01}, device="cpu")
        done = runner.wait(job.id, timeout=60)
        assert done.state == "succeeded", Path(done.log_path or "").read_text()
        assert Path(done.log_path or "").is_absolute() and Path(done.log_path or "").parent.parent == tmp_path
    assert not (REPO_ROOT / "relative.db").exists()


def _approved_step_pairs(store: Store, n: int = 2) -> str:
    """A run with `n` approved step pairs (enough for a DPO job); returns its id."""
    from doubles import action_text

    from engine.datasets.pairs import Pair
    from engine.prompts import actor_prompt

    run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id=f"goal-{i}", goal="g") for i in range(n)])
    store.save_pairs(run_id, [
        Pair(id=f"p{i}", kind="step", run_id=run_id, tree_id=None, task_id=f"goal-{i}", node_id=0, chosen_node=1,
             rejected_node=2, prompt=actor_prompt("Commands: left, right.", "reach 3", "", [], f"at {i}"),
             chosen=action_text("right"), rejected=action_text("left"), q_chosen=1.0, q_rejected=0.0,
             logprob_chosen=None, logprob_rejected=None, depth=0)
        for i in range(n)
    ])
    store.bulk_set_pair_status("approved", "test", run_id=run_id)
    return run_id


TINY_TRAIN = {"max_steps": 1, "batch_size": 2, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
              "num_threads": 1}


@pytest.mark.slow
def test_relative_paths_of_a_job_resolve_where_it_was_submitted(store: Store, tmp_path: Path, monkeypatch) -> None:
    """`orchard train sft --model ./mymodel` typed in another folder: the worker (in the repository
    root) must train that folder's model, into that folder's --out."""
    from tiny_model_fixture import build_tiny_model

    work = tmp_path / "work"
    build_tiny_model(work / "mymodel")
    _approved_step_pairs(store)
    monkeypatch.chdir(work)
    job = JobRunner(store).submit("dpo", {"model": "./mymodel", "output": "trained", "train": TINY_TRAIN},
                                  device="cpu")
    assert job.config["model"] == str(work / "mymodel") and job.config["output"] == str(work / "trained")
    done = JobRunner(store).wait(job.id, timeout=120)
    assert done.state == "succeeded", Path(done.log_path or "").read_text()[-2000:]
    assert done.output_path == str(work / "trained") and (work / "trained" / "config.json").is_file()
    assert not (REPO_ROOT / "trained").exists()


def test_resolve_job_paths_makes_every_path_absolute_and_keeps_specs() -> None:
    from engine.jobs.runner import resolve_job_paths

    cwd = "/somewhere/else"
    assert resolve_job_paths("sft", {"model": "m", "output": "~/out", "runs": ["r"]}, cwd) == {
        "model": "/somewhere/else/m", "output": str(Path("~/out").expanduser()), "runs": ["r"]}
    assert resolve_job_paths("eval", {"model": "hf:../m"}, cwd)["model"] == "hf:/somewhere/m"
    assert resolve_job_paths("eval", {"model": "vllm:m"}, cwd)["model"] == "vllm:/somewhere/else/m"
    for spec in ("tiny", "openai:http://127.0.0.1:9/v1#m"):
        assert resolve_job_paths("eval", {"model": spec}, cwd)["model"] == spec
    config = {"iterate": {"model": "./m", "output_root": "loops", "iterations": 2}}
    assert resolve_job_paths("iterate", config, cwd) == {
        "iterate": {"model": "/somewhere/else/m", "output_root": "/somewhere/else/loops", "iterations": 2}}
    assert config["iterate"]["model"] == "./m"  # the caller's config is not changed
    assert resolve_job_paths("dpo", {"model": "/abs/m", "output": None}, cwd) == {"model": "/abs/m", "output": None}
    # every kind's paths, nested settings included (a worker in the repository root reads them)
    assert resolve_job_paths("search", {"model": "m", "search": {"value_model": "v", "k": 2}}, cwd) == {
        "model": "/somewhere/else/m", "search": {"value_model": "/somewhere/else/v", "k": 2}}
    assert resolve_job_paths("refine", {"model": "offline", "out": "o.jsonl", "personas": "p.txt"}, cwd) == {
        "model": "offline", "out": "/somewhere/else/o.jsonl", "personas": "/somewhere/else/p.txt"}
    assert resolve_job_paths("eval", {"model": "m", "eval": {"mcts_value_model": "v"}}, cwd)["eval"] == {
        "mcts_value_model": "/somewhere/else/v"}
    for kind in ("revisions", "add_action", "search_here", "more_candidates"):
        assert resolve_job_paths(kind, {"model": "m", "run": "r"}, cwd) == {"model": "/somewhere/else/m", "run": "r"}
    assert resolve_job_paths("search_here", {"model": None}, cwd) == {"model": None}  # the run's own model
    nested = {"iterate": {"search": {"value_model": "v"}, "eval": {"mcts_value_model": ""}}}
    assert resolve_job_paths("iterate", nested, cwd)["iterate"] == {"search": {"value_model": "/somewhere/else/v"},
                                                                     "eval": {"mcts_value_model": ""}}
    assert nested["iterate"]["search"]["value_model"] == "v"


@pytest.mark.slow
def test_a_hung_worker_is_failed_by_its_stale_heartbeat_and_its_device_freed(store: Store, monkeypatch) -> None:
    monkeypatch.setenv("ORCHARD_JOB_HEARTBEAT_S", "0.2")
    runner = JobRunner(store, heartbeat_timeout_s=2.0)
    hung = runner.submit("probe", {"steps": 2000, "seconds": 0.05}, device="cpu")
    waiting = runner.submit("probe", {"steps": 2, "seconds": 0.01}, device="cpu")
    _until(lambda: store.job(hung.id).progress.get("step", 0) >= 2)
    pid = store.job(hung.id).pid
    assert pid is not None
    os.killpg(pid, signal.SIGSTOP)  # alive (so no "died"), but it runs nothing: a hang
    try:
        def final():
            runner.poll()
            return store.job(hung.id) if store.job(hung.id).final else None

        failed = _until(final, timeout=30)
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert failed.state == "failed" and re.match(r"no heartbeat for \d+ s", failed.error or ""), failed.error
    assert not process_alive(pid, hung.id)  # killed, not left holding its device's memory
    assert JobRunner(store).wait(waiting.id, timeout=60).state == "succeeded"  # the device was freed


@pytest.mark.slow
def test_a_job_silent_for_longer_than_the_heartbeat_timeout_is_not_hung(store: Store, monkeypatch) -> None:
    """The heartbeat thread beats while a phase reports nothing (a model loading, an evaluation)."""
    monkeypatch.setenv("ORCHARD_JOB_HEARTBEAT_S", "0.2")
    runner = JobRunner(store, heartbeat_timeout_s=2.0)
    job = runner.submit("probe", {"steps": 1, "seconds": 5.0}, device="cpu")
    done = runner.wait(job.id, timeout=60)
    assert done.state == "succeeded", done.error


def _long_eval_job_under_way(store: Store, tmp_path: Path) -> tuple[JobRunner, JobInfo, Path]:
    """(runner, job, log) of an eval job a few seconds into its work: every test task, 6 seeds, 256 tokens,
    one long batched generation (~a minute on two cores)."""
    from tiny_model_fixture import build_tiny_model

    model = build_tiny_model(tmp_path / "m")
    runner = JobRunner(store)
    job = runner.submit("eval", {"model": str(model), "env": "textcraft", "split": "test", "tasks": "",
                                 "eval": {"mode": "sampled", "seeds": list(range(6)), "max_tokens": 256}},
                        device="cpu")
    log = Path(job.log_path or "")
    _until(lambda: log.is_file() and f"job {job.id} (eval)" in log.read_text(), timeout=60)
    time.sleep(3.0)  # into the model loading / generation
    return runner, job, log


@pytest.mark.slow
def test_cancelling_a_running_eval_job_ends_well_under_the_grace_period(store: Store, tmp_path: Path) -> None:
    """Evaluation never asks `should_stop`: SIGTERM must stop it at once, not after 30 s and a SIGKILL."""
    runner, job, log = _long_eval_job_under_way(store, tmp_path)
    began = time.monotonic()
    cancelled = runner.cancel(job.id, grace_s=30.0)
    took = time.monotonic() - began
    assert cancelled.state == "cancelled" and took < 10.0, (took, log.read_text()[-2000:])
    assert "signal 15: stopped at once" in log.read_text() and "Traceback" not in log.read_text()
    assert store.evaluations() == []


@pytest.mark.slow
def test_a_cancel_from_another_machine_stops_an_eval_job_too(store: Store, tmp_path: Path, monkeypatch) -> None:
    """On a shared store a cancel may come from a teammate's machine, which can send no signal: the job's own
    heartbeat reads the request and signals its process, so evaluation (which never asks) stops as well."""
    monkeypatch.setenv("ORCHARD_JOB_HEARTBEAT_S", "1")
    _, job, log = _long_eval_job_under_way(store, tmp_path)
    began = time.monotonic()
    store.request_job_cancel(job.id)  # the flag alone, as another machine's `orchard jobs cancel` leaves it
    done = _until(lambda: store.job(job.id).final and store.job(job.id), timeout=60)
    assert done.state == "cancelled" and time.monotonic() - began < 15.0, log.read_text()[-2000:]
    # by the heartbeat's signal mid-generation, or at a stage's unit boundary: either way in one line
    assert ("stopped at once" in log.read_text() or "stopped: " in log.read_text()) and "Traceback" not in log.read_text()


def test_the_heartbeat_turns_a_cancel_in_the_store_into_one_sigterm(store: Store, monkeypatch) -> None:
    """What a cancel from another machine relies on: the job's own heartbeat thread signals its process."""
    import signal
    import threading

    from engine.jobs.worker import start_heartbeat

    job = store.create_job("probe", {"steps": 1}, "cpu")
    assert store.claim_next_job("cpu") is not None
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    stop = threading.Event()
    try:
        thread = start_heartbeat(store.location, job.id, 0.05, stop)
        time.sleep(0.3)
        assert got == []  # beating, no cancel asked
        store.request_job_cancel(job.id)
        _until(lambda: got, timeout=10)
        time.sleep(0.3)
        assert got == [signal.SIGTERM]  # once, not at every beat
    finally:
        stop.set()
        thread.join(5)
        signal.signal(signal.SIGTERM, previous)
        store.finish_job(job.id, "cancelled", error="test over")


def test_a_worker_just_launched_by_another_runner_is_not_taken_for_dead(store: Store) -> None:
    """Between fork and exec the worker's command line is its parent's: a second runner polling in that
    window (the dashboard rerunning right after a submission) must not mark the job failed."""
    job = store.create_job("probe", {"steps": 1}, "cpu")
    claimed = store.claim_next_job("cpu")
    assert claimed is not None and claimed.id == job.id
    store.set_job_pid(job.id, os.getpid())  # alive, but not a worker's command line (as before exec)
    JobRunner(store).poll()
    assert store.job(job.id).state == "running"
    store.finish_job(job.id, "cancelled", error="test over")


def test_on_a_shared_store_a_beating_job_is_not_failed_for_a_pid_this_machine_lacks(store: Store, monkeypatch) -> None:
    """On PostgreSQL the job may run on a teammate's machine: its pid means nothing here, its beats do; once
    they stop, the pid check counts again. A SQLite store is one machine's: a gone pid is a dead job."""
    import subprocess
    import sys

    from engine.jobs import runner as runner_module

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no live process has

    def running_job() -> str:
        job = store.create_job("probe", {"steps": 1}, "cpu")
        assert store.claim_next_job("cpu") is not None
        store.set_job_pid(job.id, gone.pid)
        store.beat_job(job.id)
        return job.id

    first = running_job()
    JobRunner(store).poll()
    assert store.job(first).state == ("running" if store.dialect == "postgresql" else "failed")
    store.finish_job(first, "cancelled", error="test over")
    second = running_job()
    monkeypatch.setattr(runner_module, "FRESH_BEAT_S", -1.0)  # its beats have stopped
    JobRunner(store).poll()
    assert store.job(second).state == "failed" and "died" in (store.job(second).error or "")


def test_a_job_row_edited_outside_orchard_fails_in_one_line_and_the_queue_goes_on(store: Store, tmp_path: Path) -> None:
    """A config that is not a JSON object, or of another shape, made every poll a traceback (the whole queue
    stopped); an id such as '../x' made the runner write its log outside the job-log folder."""
    bad = store.create_job("probe", {"steps": 1}, "cpu")
    store.con.execute("UPDATE jobs SET config='{not json', progress='[1' WHERE id=?", (bad.id,))
    assert store.job(bad.id).config == {"unreadable": f"job {bad.id}: its stored config is not JSON"}
    assert store.job(bad.id).progress == {}
    shaped = store.create_job("iterate", {"iterate": "x", "train": 5}, "cpu")  # not objects where objects belong
    assert JobRunner(store).submit("probe", {"steps": 1}, device="cpu", start=False).state == "queued"
    runner = JobRunner(store)
    failed = _until(lambda: runner.poll() is not None and store.job(bad.id).final and store.job(bad.id))
    assert failed.state == "failed" and "unknown field(s) unreadable" in (failed.error or "")
    _until(lambda: runner.poll() is not None and store.job(shaped.id).final)
    assert store.job(shaped.id).state == "failed" and "\n" not in (store.job(shaped.id).error or "").strip()
    _until(lambda: runner.poll() is not None and all(j.final for j in store.jobs()))
    assert [j.state for j in store.jobs(state="succeeded")] == ["succeeded"]  # the good job behind them ran


def test_a_stored_job_id_cannot_lead_the_log_out_of_the_job_log_folder(store: Store, tmp_path: Path) -> None:
    from engine.paths import jobs_dir

    job = store.create_job("probe", {"steps": 1}, "cpu")
    store.con.execute("UPDATE jobs SET id='../../escaped', log_path=NULL WHERE id=?", (job.id,))
    JobRunner(store, python="/bin/true").poll()
    folder = jobs_dir(store.location).resolve()
    assert not (folder.parent.parent / "escaped.log").exists() and not (folder.parent / "escaped.log").exists()
    assert (folder / "unnamed-job.log").exists()


def test_two_runners_racing_cannot_start_two_jobs_on_one_gpu(store: Store) -> None:
    """Each runner read the running jobs before the other's claim committed, and the claim compared device
    strings only: a cuda:0,1 job and a cuda:1 job both started. The claim now checks shared GPUs itself."""
    launched: list[str] = []

    class Recording(JobRunner):
        def _launch(self, job) -> None:  # type: ignore[no-untyped-def]
            launched.append(job.device)

    store.create_job("dpo", {}, "cuda:0,1")
    store.create_job("probe", {}, "cuda:1")
    first, second = Recording(store), Recording(store)
    claim = store.claim_next_job

    interleaved: list[bool] = []

    def claim_after_the_other_runner(device, shares=None):  # type: ignore[no-untyped-def]
        if not interleaved:  # `second` has read that nothing runs; `first` polls before its claim
            interleaved.append(True)
            first.poll()
        return claim(device) if shares is None else claim(device, shares=shares)

    store.claim_next_job = claim_after_the_other_runner  # type: ignore[method-assign]
    try:
        second.poll()
    finally:
        store.claim_next_job = claim  # type: ignore[method-assign]
    assert launched == ["cuda:0,1"] and [j.device for j in store.jobs(state="running")] == ["cuda:0,1"]
    for job in store.jobs(state=("running", "queued")):
        store.finish_job(job.id, "cancelled", error="test over")
