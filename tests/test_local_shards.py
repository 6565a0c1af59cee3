"""Local shards (engine/search/local_shards.py): trees grown in worker processes of this machine, one
store writer, against the per-request-seeded delayed server: the same trees as one process, and a
worker killed mid-run loses nothing committed, whether the driver restarts it or a resume does."""

from __future__ import annotations

import os
import signal

import pytest
from delayed import delayed_server

from engine.config import ConfigError, SearchConfig
from engine.envs.registry import env_factory
from engine.llm.base import GeneratorError
from engine.llm.openai_http import OpenAIGenerator
from engine.search.local_shards import auto_shards, prepare_resume, prepare_run, shard_model_spec
from engine.search.runner import new_run
from engine.store import Store

CFG = SearchConfig(simulations=4, k=3, depth_limit=4, seed=11)


def _trees(store: Store, run_id: str):
    return {task_id: store.load_tree(tree_id) for tree_id, task_id in store.tree_ids(run_id)}


def _texts(tree):
    return [(n.parent, n.raw, n.action.command if n.action else None, n.N, round(n.value_sum, 9), n.Q_critic,
             n.critic_rank, n.terminal, n.observation) for n in tree.nodes]


def _sims(tree):
    return [(s.path, s.reward, s.rollout) for s in tree.simulations]


def _killer(search, after: int, killed: list):
    """A progress callback that SIGKILLs shard 0's worker once its trees have `after` committed simulations."""

    def progress(job, sim):
        if not killed and 0 in search.pids:
            done = sum(len(m.job.tree.simulations) for m in search.mirrors[0::2] if m.job)
            if done >= after:
                killed.append(search.pids[0][0])
                os.kill(search.pids[0][0], signal.SIGKILL)

    return progress


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server URL, tasks, the trees one process grows with CFG)."""
    tasks = env_factory("textcraft")().tasks("train")[:4]
    with delayed_server(commands=None, time_scale=0.1) as (url, _), \
            Store(tmp_path_factory.mktemp("local") / "local.db") as store:
        gen = OpenAIGenerator(url, "m")
        run_id, _ = new_run(store, "textcraft", tasks, gen, CFG, "local")
        gen.close()
        yield url, tasks, _trees(store, run_id)


def test_two_shards_grow_the_trees_one_process_grows_and_a_killed_worker_loses_nothing(served, tmp_path):
    url, tasks, local = served
    with Store(tmp_path / "shards.db") as store:
        killed: list[int] = []
        search = prepare_run(store, "textcraft", tasks, f"openai:{url}#m", CFG, "sharded", shards=2)
        search.progress = _killer(search, 3, killed)
        stats = search.run()
        assert store.run(search.run_id).status == "finished" and store.run(search.run_id).simulations == 16
        sharded = _trees(store, search.run_id)
    assert killed and search.attempts == {0: 2, 1: 1}  # shard 0 started again from the mirrors
    assert len({pid for pid, _ in search.pids.values()} | set(killed)) == 3 and os.getpid() not in killed
    assert stats.simulations == 4 * 4  # each committed once
    for task in tasks:
        tree = sharded[task.id]
        assert tree.check_invariants() == [] and len(tree.simulations) == 4
        assert _texts(tree) == _texts(local[task.id]) and _sims(tree) == _sims(local[task.id])


def test_a_run_whose_worker_is_killed_resumes_from_the_committed_simulations(served, tmp_path):
    """No retries: the kill leaves the run interrupted with what was committed; a 2-shard resume
    finishes it to the trees of an uninterrupted run, what was committed kept in order, nothing doubled."""
    url, tasks, local = served
    db = tmp_path / "half.db"
    with Store(db) as store:
        killed: list[int] = []
        search = prepare_run(store, "textcraft", tasks, f"openai:{url}#m", CFG, "half", shards=2, max_retries=0)
        search.progress = _killer(search, 2, killed)
        with pytest.raises(GeneratorError, match=r"shard 0 failed 1 times; the last: worker process \d+ ended"):
            search.run()
        info = store.run(search.run_id)
        assert killed and info.status == "interrupted" and 2 <= info.simulations < 16
        before = _trees(store, search.run_id)
        resumed = prepare_resume(store, "half", shards=2)
        stats = resumed.run()
        info = store.run(search.run_id)
        assert info.status == "finished" and info.simulations == 16
        after = _trees(store, search.run_id)
    assert stats.simulations == 16 - sum(len(t.simulations) for t in before.values() if t)  # only the missing
    for task in tasks:
        tree = after[task.id]
        assert tree.check_invariants() == [] and len(tree.simulations) == 4
        assert tree.nodes[0].N == 4  # every simulation passes through the root once
        assert _texts(tree) == _texts(local[task.id]) and _sims(tree) == _sims(local[task.id])
        kept = before[task.id]
        if kept is not None:
            assert _sims(tree)[:len(kept.simulations)] == _sims(kept)


def test_the_cli_and_a_job_take_a_shard_count(served, tmp_path, capsys):
    from engine import cli
    from engine.jobs.kinds import load_job

    url, _, local = served
    db = tmp_path / "cli.db"
    rc = cli.main(["search", "--db", str(db), "--env", "textcraft", "--tasks", "0:4", "--simulations", "4", "--k", "3",
                   "--depth", "4", "--seed", "11", "--name", "cli", "--shards", "2", "--model", f"openai:{url}#m"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "4 trees, 16 simulations in 2 local shards" in err
    with Store(db, must_exist=True) as store:
        for task_id, tree in _trees(store, store.find_run("cli")).items():
            assert _texts(tree) == _texts(local[task_id])
    from pathlib import Path

    from engine.jobs.runner import JobRunner
    from engine.jobs.submit import submit_search

    with Store(db) as store:  # a queued job carries the count to the job's worker, which runs the same stage
        job_id = submit_search(store, tasks="0:2", model=f"openai:{url}#m", name="job", shards=2,
                               search={"simulations": 2, "k": 2, "depth_limit": 2})
        assert store.job(job_id).config["shards"] == 2
        done = JobRunner(store).wait(job_id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        assert "2 trees, 4 simulations in 2 local shards" in Path(done.log_path).read_text()
    assert load_job("search", {"tasks": "0:2", "shards": 3}).shards == 3
    assert load_job("search", {"resume": "x", "shards": 2}).shards == 2
    with pytest.raises(ConfigError, match="shards"):
        load_job("search", {"tasks": "0:2", "shards": 0})


def test_the_automatic_shard_count_follows_the_requests_in_flight_and_the_cores():
    spec = "openai:http://127.0.0.1:8000/v1#m?concurrency=256"
    assert auto_shards(64, 64, spec, n_cores=16) == 1
    assert auto_shards(1024, 256, spec, n_cores=16) == 1  # the limit, not the trees, bounds what is in flight
    assert auto_shards(1024, 1024, spec, n_cores=16) == 1
    assert auto_shards(1024, 1024, "openai:http://a:1/v1,http://b:1/v1,http://c:1/v1,http://d:1/v1#m?concurrency=256",
                       n_cores=16) == 4
    assert auto_shards(1024, 1024, "openai:http://a:1/v1,http://b:1/v1,http://c:1/v1,http://d:1/v1#m?concurrency=256",
                       n_cores=2) == 2
    assert auto_shards(4096, 4096, "tiny", n_cores=16) == 1  # a model in the process is never sharded by default
    assert shard_model_spec("openai:http://a:1/v1,http://b:1/v1#m?concurrency=5&retries=0", 0, 2) == \
        "openai:http://a:1/v1,http://b:1/v1#m?concurrency=3&retries=0"
    assert shard_model_spec("openai:http://a:1/v1#m", 1, 2) == "openai:http://a:1/v1#m?concurrency=32"


def test_shards_start_under_a_main_script_that_cannot_run_again(served, tmp_path, monkeypatch):
    """Under Streamlit or AppTest the parent's __main__ is the dashboard script; spawn would run it again in
    each worker (where it fails), so the workers start without it."""
    import sys
    import types

    url, tasks, local = served
    script = tmp_path / "app.py"
    script.write_text("raise SystemExit('the parent script ran again in a shard worker')\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with Store(tmp_path / "main.db") as store:
        search = prepare_run(store, "textcraft", tasks[:2], f"openai:{url}#m", CFG, "under-main", shards=2)
        search.run()
        assert store.run(search.run_id).status == "finished"
        assert search.attempts == {0: 1, 1: 1}  # no worker died
        trees = _trees(store, search.run_id)
    assert sys.modules["__main__"] is main
    for task in tasks[:2]:
        assert _texts(trees[task.id]) == _texts(local[task.id])


def test_an_env_registered_at_run_time_reaches_the_shard_workers(served, tmp_path, monkeypatch):
    """A bench (or a notebook) registers its own env in the parent; the workers, started without the
    parent's __main__, must know it too (bench/scale.py's textcraft-repeat failed 'unknown env')."""
    from engine.envs import registry

    url, tasks, local = served
    monkeypatch.setitem(registry.BUILTIN, "textcraft-again", "engine.envs.textcraft:TextCraftEnv")
    with Store(tmp_path / "registered.db") as store:
        search = prepare_run(store, "textcraft-again", tasks[:2], f"openai:{url}#m", CFG, "registered", shards=2)
        search.run()
        assert store.run(search.run_id).status == "finished"
        trees = _trees(store, search.run_id)
    for task in tasks[:2]:
        assert _texts(trees[task.id]) == _texts(local[task.id])
