"""Every caller closes the envs it makes — search (new and resumed runs), evaluation (policy and MCTS
modes) and serve-env (/close, idle eviction, shutdown) — also when the run fails; envs without a
close() still work; built-in envs support `with env:`."""

from __future__ import annotations

import pytest
from doubles import LineEnv, ScriptedGenerator, SnapshotLineEnv

from engine.config import SearchConfig
from engine.envs import serve as serve_mod
from engine.envs.base import EnvBase, EnvError, close_env, close_envs
from engine.envs.serve import EnvService
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig, evaluate
from engine.search.runner import new_run, resume_run
from engine.store import Store


class Recorder:
    """A factory of recording envs: every env it made, how often each was closed."""

    def __init__(self, snapshots: bool = True, fail_reset: str | None = None) -> None:
        self.made: list[RecordingEnv] = []
        self.snapshots = snapshots
        self.fail_reset = fail_reset

    def __call__(self) -> RecordingEnv:
        env = RecordingEnv(self) if self.snapshots else ReplayRecordingEnv(self)
        self.made.append(env)
        return env

    def unclosed(self) -> list[int]:
        return [i for i, e in enumerate(self.made) if e.closes == 0]


class ReplayRecordingEnv(EnvBase, LineEnv):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__(4)
        self.recorder = recorder
        self.closes = 0

    def reset(self, task_id: str) -> str:
        if task_id == self.recorder.fail_reset:
            raise EnvError(f"cannot start {task_id}")
        return super().reset(task_id)

    def close(self) -> None:
        self.closes += 1


class RecordingEnv(ReplayRecordingEnv, SnapshotLineEnv):
    pass


class FailingGenerator(ScriptedGenerator):
    """Fails on its `after`-th call (a model server going away mid-run)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def sample(self, requests):
        if len(self.calls) >= self.after:
            raise RuntimeError("the model server went away")
        return super().sample(requests)


CONFIG = SearchConfig(simulations=3, k=2, depth_limit=4, seed=1, trees_in_flight=2)


@pytest.mark.parametrize("snapshots", [True, False])
def test_search_closes_every_env_it_made(tmp_path, snapshots) -> None:
    rec = Recorder(snapshots)
    with Store(tmp_path / "o.db") as store:
        new_run(store, "line", LineEnv(4).tasks(), ScriptedGenerator(), CONFIG, "t", make_env=rec)
    assert len(rec.made) >= 4 and rec.unclosed() == []


def test_search_closes_its_envs_when_the_run_fails(tmp_path) -> None:
    rec = Recorder()
    with Store(tmp_path / "o.db") as store:
        with pytest.raises(RuntimeError, match="went away"):
            new_run(store, "line", LineEnv(4).tasks(), FailingGenerator(after=2), CONFIG, "t", make_env=rec)
        (run,) = store.runs()
        assert run.status == "interrupted"
    assert rec.made and rec.unclosed() == []


def test_search_closes_started_trees_when_a_later_tree_cannot_start(tmp_path) -> None:
    rec = Recorder(fail_reset="goal-3")
    with Store(tmp_path / "o.db") as store:
        with pytest.raises(EnvError, match="cannot start goal-3"):
            new_run(store, "line", LineEnv(4).tasks(), ScriptedGenerator(), CONFIG, "t", make_env=rec)
        assert store.runs() == []  # nothing half-made
    assert len(rec.made) == 3 and rec.unclosed() == []


def test_resume_closes_its_envs(tmp_path) -> None:
    with Store(tmp_path / "o.db") as store:
        with pytest.raises(RuntimeError):
            new_run(store, "line", LineEnv(4).tasks(), FailingGenerator(after=3), CONFIG, "t", make_env=Recorder())
        rec = Recorder()
        with pytest.raises(RuntimeError):
            resume_run(store, "t", FailingGenerator(after=1), make_env=rec)
        assert rec.made and rec.unclosed() == []
        rec = Recorder()
        resume_run(store, "t", ScriptedGenerator(), make_env=rec)
        assert store.run(store.find_run("t")).status == "finished"
    assert rec.made and rec.unclosed() == []


@pytest.mark.parametrize("mode", ["greedy", "sampled", "mcts"])
def test_evaluation_closes_every_env(mode) -> None:
    rec = Recorder()
    config = EvalConfig(mode=mode, seeds=(0, 1), max_steps=4, bootstrap=0, mcts_simulations=2, mcts_k=2)
    evaluate(ScriptedGenerator(), rec, LineEnv(4).tasks()[:2], config)
    assert len(rec.made) >= 3 and rec.unclosed() == []


@pytest.mark.parametrize("mode", ["greedy", "mcts"])
def test_evaluation_closes_its_envs_when_it_fails(mode) -> None:
    rec = Recorder()
    config = EvalConfig(mode=mode, max_steps=4, bootstrap=0, mcts_simulations=2, mcts_k=2)
    with pytest.raises(RuntimeError, match="went away"):
        evaluate(FailingGenerator(after=1), rec, LineEnv(4).tasks()[:2], config)
    assert rec.made and rec.unclosed() == []
    rec = Recorder(fail_reset="goal-2")
    with pytest.raises(EnvError, match="cannot start"):
        evaluate(ScriptedGenerator(), rec, LineEnv(4).tasks()[:2], config)
    assert rec.made and rec.unclosed() == []


def test_serve_env_closes_on_close_eviction_and_shutdown() -> None:
    rec = Recorder()
    service = EnvService(rec, "line", max_envs=2, idle_s=0.0)
    probe = rec.made[0]
    first = service.create({})["id"]
    service.create({})
    service.close({"id": first})
    assert [e.closes for e in rec.made] == [0, 1, 0]
    service.create({})
    service.create({})  # full: the longest idle one is evicted (idle_s=0) and closed
    assert [e.closes for e in rec.made] == [0, 1, 1, 0, 0]
    service.shutdown()
    assert rec.unclosed() == [] and probe.closes == 1


def test_serve_closes_its_envs_when_the_server_stops(monkeypatch) -> None:
    rec = Recorder()

    class Stopping:
        server_address = ("127.0.0.1", 0)

        def serve_forever(self) -> None:
            rec.service.create({})
            raise KeyboardInterrupt

        def server_close(self) -> None:
            pass

    def fake_server(service, host, port):
        rec.service = service
        return Stopping()

    monkeypatch.setattr("engine.envs.registry.env_factory", lambda spec: rec)
    monkeypatch.setattr(serve_mod, "make_server", fake_server)
    with pytest.raises(KeyboardInterrupt):
        serve_mod.serve("line", "127.0.0.1", 0, "train", "id", 4, log=lambda m: None)
    assert len(rec.made) == 2 and rec.unclosed() == []


def test_envs_without_close_still_work_and_builtins_are_context_managers() -> None:
    close_env(LineEnv())  # a plugin env without close(): nothing to do, no error
    with TextCraftEnv() as env:
        assert env.reset("train-0")
    env.close()  # idempotent


def test_close_envs_closes_the_rest_when_one_fails() -> None:
    class Broken(EnvBase):
        def close(self) -> None:
            raise RuntimeError("close failed")

    rec = Recorder()
    envs = [rec(), Broken(), rec()]
    with pytest.raises(RuntimeError, match="close failed"):
        close_envs(envs)
    assert rec.unclosed() == []


def test_orchard_search_closes_its_probe_env(tmp_path, monkeypatch) -> None:
    from engine import cli

    rec = Recorder()
    monkeypatch.setattr("engine.envs.registry.env_factory", lambda spec: rec)
    monkeypatch.setattr("engine.llm.registry.load_generator", lambda spec, log=None, **_kw: ScriptedGenerator())
    assert cli.main(["search", "--env", "line", "--tasks", "0:2", "--simulations", "2", "--db",
                     str(tmp_path / "o.db")]) == 0
    assert len(rec.made) == 3 and rec.unclosed() == []  # the probe and one env per tree
