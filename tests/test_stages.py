"""Stage jobs (engine/jobs/kinds.py): real search / pairs / revisions jobs on TextCraft with a random-weights
model, cancel at the next unit and resume, and inputs refused before anything is queued."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from engine.config import ConfigError, SearchConfig, config_fields
from engine.envs.base import EnvError
from engine.jobs.kinds import load_job
from engine.jobs.runner import JobRunner
from engine.jobs.submit import stage_device, submit_pairs, submit_revisions, submit_search
from engine.llm.base import GeneratorError
from engine.llm.registry import check_model
from engine.progress import Cancelled, MemoryReporter
from engine.search.stage import run_search
from engine.store import Store

SMALL = {"simulations": 1, "k": 2, "depth_limit": 2, "max_tokens": 8, "critic": False}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tiny_model_fixture import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("model") / "m").resolve())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_search_then_pairs_then_revisions_as_jobs(tmp_path: Path, model: str) -> None:
    with Store(tmp_path / "orchard.db") as store:
        runner = JobRunner(store)
        job_id = submit_search(store, env="textcraft", tasks="0:2", model=model, name="staged", search=SMALL)
        job = store.job(job_id)
        assert job.kind == "search" and job.device == stage_device("search", job.config)
        done = runner.wait(job_id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        run = store.run(done.output_path)
        assert run.name == "staged" and run.status == "finished" and run.trees == 2 and run.simulations == 2
        assert done.progress["step"] == done.progress["total"] == 2 and done.progress["run_id"] == run.id
        pairs_id = submit_pairs(store, run.id, theta=0.0)
        assert store.job(pairs_id).device == "cpu"
        revisions_id = submit_revisions(store, run.id, model=model, alpha_good=0.4, beta_gap=0.3)
        for jid in (pairs_id, revisions_id):
            finished = runner.wait(jid, timeout=240)
            assert finished.state == "succeeded", Path(finished.log_path).read_text()[-2000:]
            assert finished.output_path == run.id and finished.progress["total"] == 2
            assert f"run {run.id}: 2 trees ->" in Path(finished.log_path).read_text()


class StopAfter(MemoryReporter):
    """Asks to stop once `after` units are done (what a cancel's SIGTERM does to the store reporter)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def should_stop(self) -> bool:
        return bool(self.progress_rows) and (self.progress_rows[-1].get("step") or 0) >= self.after


@pytest.mark.slow
def test_a_cancelled_search_stops_at_the_next_simulation_and_a_resume_job_finishes_it(tmp_path: Path,
                                                                                        model: str) -> None:
    with Store(tmp_path / "orchard.db") as store:
        config = {"env": "textcraft", "tasks": "0:1", "model": model, "name": "long",
                  "search": {**SMALL, "simulations": 40}}
        with pytest.raises(Cancelled, match="cancelled after 2 of 40"):
            run_search(store, load_job("search", config), StopAfter(2))
        (run,) = store.runs()
        assert run.status == "interrupted" and run.simulations == 2
        resume_id = submit_search(store, resume=run.id, model=model)
        assert store.job(resume_id).config == {"resume": run.id, "model": model}
        done = JobRunner(store).wait(resume_id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        assert done.progress["total"] == 38 and done.output_path == run.id
        assert store.run(run.id).status == "finished" and store.run(run.id).simulations == 40


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"env": "nosuchenv"}, EnvError, "unknown env 'nosuchenv'"),
    ({"tasks": "5:2"}, EnvError, "bad task range"),
    ({"tasks": "0:100000"}, EnvError, "out of range"),
    ({"search": {"alpha": 2.0}}, ConfigError, "SearchConfig.alpha"),
    ({"search": {"bogus": 1}}, ConfigError, "unknown field(s) bogus"),
    ({"model": "/no/such/model"}, GeneratorError, "no such folder"),
])
def test_bad_search_inputs_queue_nothing(tmp_path: Path, kwargs, error, words) -> None:
    with Store(tmp_path / "orchard.db") as store:
        with pytest.raises(error) as info:
            submit_search(store, **{"tasks": "0:1", **kwargs})
        assert words in str(info.value) and "\n" not in str(info.value)
        assert store.jobs() == [] and store.runs() == []


def test_an_unreachable_model_server_is_refused_quickly(tmp_path: Path) -> None:
    import time

    spec = f"openai:http://127.0.0.1:{_free_port()}/v1#m"
    began = time.monotonic()
    with pytest.raises(GeneratorError, match="did not answer"):
        check_model(spec, timeout=1.0)
    assert time.monotonic() - began < 5
    with Store(tmp_path / "orchard.db") as store:
        with pytest.raises(GeneratorError):
            submit_search(store, tasks="0:1", model=spec)
        with pytest.raises(ConfigError, match="pairs theta"):
            submit_pairs(store, "x", theta=-1)
        assert store.jobs() == []


def test_config_fields_read_every_search_setting_with_its_help() -> None:
    rows = config_fields(SearchConfig)
    assert [name for name, _, _ in rows] == list(SearchConfig.__dataclass_fields__)
    by_name = {name: (default, help_) for name, default, help_ in rows}
    assert by_name["k"] == (4, "candidates sampled per expansion")
    assert by_name["alpha"][1].startswith("eq. 10 weight")


@pytest.mark.slow
def test_a_refine_job_reports_personas_and_writes_its_file(tmp_path: Path, model: str) -> None:
    from engine.jobs.submit import submit_refine

    out = tmp_path / "refine.jsonl"
    with Store(tmp_path / "orchard.db") as store:
        job_id = submit_refine(store, model="offline", n=2, out=str(out))
        done = JobRunner(store).wait(job_id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        assert done.output_path == str(out) and len(out.read_text().splitlines()) == 2
        assert done.progress["step"] == done.progress["total"] == 2  # both personas done (verified or dropped)
        assert "refine: 2 personas ->" in Path(done.log_path).read_text()
        # A model whose context cannot hold AgentRefine's prompts fails in one line, before its weights load.
        small = submit_refine(store, model=model, n=2, out=str(tmp_path / "small.jsonl"),
                              refine={"script_max_tokens": 8, "trajectory_max_tokens": 8, "script_attempts": 1})
        failed = JobRunner(store).wait(small, timeout=240)
        assert failed.state == "failed"
        assert "exceeds the model's 2048 positions" in Path(failed.log_path).read_text()
        with pytest.raises(ConfigError, match="'n' must be an integer >= 1"):
            submit_refine(store, model=model, n=0)
        assert len(store.jobs()) == 2


@pytest.mark.slow
def test_an_eval_job_reports_its_steps_and_a_cancel_stops_it_at_the_next_model_call(tmp_path: Path,
                                                                                  model: str) -> None:
    from engine.evaluate import CountedGenerator
    from engine.jobs.submit import submit_eval
    from engine.progress import Units

    with Store(tmp_path / "orchard.db") as store:
        job_id = submit_eval(store, model, tasks="0:2", eval={"max_steps": 2, "max_tokens": 8, "bootstrap": 20})
        done = JobRunner(store).wait(job_id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        assert done.progress["phase"] == "evaluate (greedy): steps"
        assert 1 <= done.progress["step"] == done.progress["total"] <= 2
        assert done.output_path == store.evaluations()[0]["id"]

    class Echo:
        name = "echo"

        def sample(self, requests):
            return [[] for _ in requests]

    counted = CountedGenerator(Echo(), Units(StopAfter(2), "evaluate (greedy): steps", 5))
    counted.sample([1])
    with pytest.raises(Cancelled, match="cancelled after 2 of 5"):
        counted.sample([1])
    assert counted.name == "echo"
