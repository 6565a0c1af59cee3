"""Search on a REAL local two-node Ray cluster (head + a second node, separate processes on loopback)
against the per-request-seeded delayed server: the same trees as a local run, and a worker killed
mid-run loses nothing committed.

WHY a network namespace: Ray turns 127.0.0.1 into the machine's routable interface address for its
nodes (`resolve_ip_for_localhost`), so on a normal host the cluster's traffic leaves the loopback
range. In a fresh network namespace (`unshare -n`, only `lo` up) that address is 127.0.0.1, and
every byte stays on loopback. `test_cluster_tests_in_a_loopback_only_namespace` re-runs this module
there (ORCHARD_RAY_ISOLATED=1); the cluster fixture refuses to start a cluster anywhere else."""

from __future__ import annotations

import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from delayed import delayed_server

from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.llm.openai_http import OpenAIGenerator
from engine.search.runner import new_run
from engine.store import Store

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(args: list[str], env: dict[str, str], check: bool = True) -> None:
    done = subprocess.run([RAY, *args], check=False, env=env, capture_output=True, text=True, timeout=120)
    if check and done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"ray {' '.join(args)} failed: {' | '.join(tail)}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head + a second node, 1 CPU each. Token auth is set explicitly for both nodes and this process
    (Ray 2.60 turns it on for a head that finds ~/.ray/auth_token but not for a joining node)."""
    if importlib.util.find_spec("ray") is None or not os.path.exists(RAY):
        pytest.skip("ray is not installed (pip install -e .[ray])")
    if os.environ.get("ORCHARD_RAY_ISOLATED") != "1":
        pytest.skip("runs inside a loopback-only network namespace: test_cluster_tests_in_a_loopback_only_namespace")
    token = tmp_path_factory.mktemp("ray") / "auth_token"
    token.write_text(secrets.token_hex(32))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)  # the driver (this process) joins with the same token: set before ray is imported
    ray = pytest.importorskip("ray")
    env = dict(os.environ)
    port = _free_port()
    common = ["--num-cpus=1", "--disable-usage-stats"]
    try:
        _ray(["start", "--head", f"--port={port}", "--include-dashboard=false", *common], env)
        _ray(["start", f"--address=127.0.0.1:{port}", *common], env)
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _ray(["stop", "--force"], env, check=False)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _trees(store: Store, run_id: str):
    out = {}
    for tree_id, task_id in store.tree_ids(run_id):
        tree = store.load_tree(tree_id)
        out[task_id] = tree
    return out


def _texts(tree):
    return [(n.parent, n.raw, n.action.command if n.action else None, n.N, round(n.value_sum, 9), n.Q_critic,
             n.critic_rank, n.terminal, n.observation) for n in tree.nodes]


@pytest.mark.slow
def test_two_node_search_matches_a_local_run_and_survives_a_killed_worker(cluster, tmp_path):
    from engine.search.ray_search import prepare_run_on_ray

    cfg = SearchConfig(simulations=5, k=3, depth_limit=4, seed=11)
    tasks = env_factory("textcraft")().tasks("train")[:4]
    with delayed_server(commands=None, time_scale=0.2) as (url, _):
        with Store(tmp_path / "local.db") as store:
            gen = OpenAIGenerator(url, "m")
            local_id, _ = new_run(store, "textcraft", tasks, gen, cfg, "local")
            gen.close()
            local = _trees(store, local_id)
        with Store(tmp_path / "ray.db") as store:
            killed: list[tuple[int, int]] = []

            def progress(job, sim):
                # after shard 0 committed 3 simulations, kill its worker process (SIGKILL, mid-run)
                if not killed and 0 in search.pids:
                    done = sum(len(m.job.tree.simulations) for m in search.mirrors[0::2] if m.job)
                    if done >= 3:
                        pid = search.pids[0][0]
                        killed.append((pid, done))
                        os.kill(pid, signal.SIGKILL)

            search = prepare_run_on_ray(store, "textcraft", tasks, f"openai:{url}#m", cfg, "ray",
                                        address=cluster, shards=2, progress=progress)
            stats = search.run()
            remote = _trees(store, search.run_id)
            assert store.run(search.run_id).status == "finished"
    assert killed and search.attempts[0] == 2 and search.attempts[1] == 1
    assert len({node for _, node in search.pids.values()}) == 2  # both nodes grew trees
    assert stats.simulations == 4 * 5  # committed: each once
    for task in tasks:
        tree = remote[task.id]
        assert tree.check_invariants() == [] and len(tree.simulations) == 5
        assert _texts(tree) == _texts(local[task.id])  # the same trees; nothing lost or doubled


def test_ray_flag_without_ray_says_how_to_install(monkeypatch, tmp_path, capsys):
    import builtins

    from engine import cli

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    rc = cli.main(["search", "--db", str(tmp_path / "x.db"), "--env", "textcraft", "--tasks", "0:1", "--ray"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err == 'orchard: error: Ray is not installed: pip install "orchard[ray]" (or "ray[default]>=2.60")'
    assert not (tmp_path / "x.db").exists()  # refused before anything was written


@pytest.mark.slow
def test_cli_search_with_ray_commits_every_simulation(cluster, tmp_path, capsys):
    from engine import cli

    db = tmp_path / "cli.db"
    with delayed_server(commands=None, time_scale=0.1) as (url, _):
        rc = cli.main(["search", "--db", str(db), "--env", "textcraft", "--tasks", "0:3", "--simulations", "3",
                       "--k", "2", "--depth", "3", "--name", "on-ray", "--ray", cluster,
                       "--model", f"openai:{url}#m?concurrency=4"])
    assert rc == 0, capsys.readouterr().err
    with Store(db, must_exist=True) as store:
        run_id = store.find_run("on-ray")
        info = store.run(run_id)
        assert info.status == "finished" and info.simulations == 9 and info.model == f"openai:{url}#m?concurrency=4"
        for tree in _trees(store, run_id).values():
            assert tree.check_invariants() == [] and len(tree.simulations) == 3


def _sims(tree):
    return [(s.path, s.reward, s.rollout) for s in tree.simulations]


@pytest.mark.slow
def test_cli_resume_on_ray_continues_from_the_committed_simulations(cluster, tmp_path, capsys):
    """A run interrupted locally after 6 of 12 simulations (one tree whole, one half, one never
    committed: trees_in_flight=1) is finished on Ray by `search --resume RUN --ray`: the trees of an
    uninterrupted run, nothing lost or doubled."""
    from engine import cli

    class Stop(Exception):
        pass

    cfg = SearchConfig(simulations=4, k=2, depth_limit=3, seed=5, trees_in_flight=1)
    tasks = env_factory("textcraft")().tasks("train")[:3]
    db = tmp_path / "half.db"
    with delayed_server(commands=None, time_scale=0.1) as (url, _):
        with Store(tmp_path / "full.db") as store:
            gen = OpenAIGenerator(url, "m")
            full_id, _ = new_run(store, "textcraft", tasks, gen, cfg, "full")
            gen.close()
            full = _trees(store, full_id)
        with Store(db) as store:
            gen = OpenAIGenerator(url, "m")
            seen: list[int] = []

            def stop_after_six(job, sim):
                seen.append(1)
                if len(seen) == 6:
                    raise Stop

            with pytest.raises(Stop):
                new_run(store, "textcraft", tasks, gen, cfg, "half", progress=stop_after_six)
            gen.close()
            run_id = store.find_run("half")
            assert store.run(run_id).status == "interrupted"
            before = {task_id: store.load_tree(tree_id) for tree_id, task_id in store.tree_ids(run_id)}
        counts = sorted(len(t.simulations) if t else 0 for t in before.values())
        assert counts == [0, 2, 4], counts  # whole, half and never committed: each resume path
        capsys.readouterr()
        rc = cli.main(["search", "--db", str(db), "--resume", "half", "--ray", cluster, "--model", f"openai:{url}#m"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"run {run_id} (half): 3 trees, 6 simulations on Ray" in err  # only the missing ones were searched
    with Store(db, must_exist=True) as store:
        info = store.run(run_id)
        assert info.status == "finished" and info.simulations == 12
        after = _trees(store, run_id)
    for task in tasks:
        tree = after[task.id]
        assert tree.check_invariants() == [] and len(tree.simulations) == 4
        assert tree.nodes[0].N == len(tree.simulations)  # every simulation passes through the root once
        assert _texts(tree) == _texts(full[task.id]) and _sims(tree) == _sims(full[task.id])
        kept = before[task.id]
        if kept is not None:  # what was committed stays, in order
            assert _sims(tree)[:len(kept.simulations)] == _sims(kept)
            assert [n.raw for n in tree.nodes[:len(kept.nodes)]] == [n.raw for n in kept.nodes]


@pytest.mark.slow
def test_a_queued_search_job_with_a_ray_address_runs_on_ray(cluster, tmp_path):
    """The job config the dashboard's New search form queues ({"ray": ADDRESS}): the job's worker is
    the driver, the trees grow on the cluster."""
    from engine.jobs.runner import JobRunner
    from engine.jobs.submit import submit_search

    with delayed_server(commands=None, time_scale=0.1) as (url, _), Store(tmp_path / "job.db") as store:
        job_id = submit_search(store, tasks="0:2", model=f"openai:{url}#m", name="job-on-ray",
                               search={"simulations": 2, "k": 2, "depth_limit": 2}, ray=cluster)
        assert store.job(job_id).config["ray"] == cluster and store.job(job_id).device == "cpu"
        done = JobRunner(store).wait(job_id, timeout=240)
        log = Path(done.log_path).read_text()
        assert done.state == "succeeded", log[-2000:]
        assert "2 trees, 4 simulations on Ray" in log
        run_id = store.find_run("job-on-ray")
        assert store.run(run_id).status == "finished"
        for tree in _trees(store, run_id).values():
            assert tree.check_invariants() == [] and len(tree.simulations) == 2


@pytest.mark.parametrize("address", ["", "auto", "127.0.0.1:6379", "head-1.cluster.local:10001", "[::1]:6379",
                                     "  10.0.0.2:6379 "])
def test_ray_addresses_the_cli_takes(address):
    from engine.search.ray_search import check_address

    assert check_address(address) == address.strip()


@pytest.mark.parametrize("address", ["head", "head:", ":6379", "head:0", "head:65536", "head:port",
                                     "ray://head:10001", "http://head:6379", "he ad:6379", "[::zz]:6379",
                                     "a..b:1", "-head:1"])
def test_malformed_ray_addresses_are_refused_in_one_line(address, tmp_path, capsys, monkeypatch):
    from engine import cli
    from engine.search import ray_search

    monkeypatch.setattr(ray_search, "connect", _no_worker)
    rc = cli.main(["search", "--db", str(tmp_path / "x.db"), "--tasks", "0:1", f"--ray={address}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == (f"orchard: error: ray address {address!r}: expected HOST:PORT, auto (the cluster "
                               "this machine has joined) or empty (start a local Ray)")
    assert not (tmp_path / "x.db").exists()


def _unreachable(port: int) -> str:
    return (f"cannot reach the Ray cluster at 127.0.0.1:{port}: connection refused (is its head started there "
            "with `ray start --head`?)")


def test_an_address_nothing_answers_is_refused_in_seconds_and_writes_nothing(tmp_path, capsys):
    """`ray.init` waits over a minute on a HOST:PORT nothing answers; the probe before it refuses in
    one line naming the address, before the database is opened."""
    pytest.importorskip("ray")
    import time

    from engine import cli

    port = _free_port()  # bound, then closed: nothing listens
    t0 = time.perf_counter()
    rc = cli.main(["search", "--db", str(tmp_path / "x.db"), "--tasks", "0:1", "--ray", f"127.0.0.1:{port}"])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"orchard: error: {_unreachable(port)}", err
    assert elapsed < 10, elapsed
    assert not (tmp_path / "x.db").exists()  # nothing written: not even a database file


def test_a_resume_on_an_address_nothing_answers_is_refused_and_leaves_the_run_as_it_was(tmp_path, capsys):
    pytest.importorskip("ray")
    import time
    from dataclasses import asdict

    from engine import cli

    db = tmp_path / "x.db"
    with Store(db) as store:
        run_id = store.create_run("half", "textcraft", "tiny", asdict(SearchConfig()),
                                  env_factory("textcraft")().tasks("train")[:2])
        store.set_run_status(run_id, "interrupted")
        stamp = store.run(run_id).to_dict()
    port = _free_port()  # bound, then closed: nothing listens
    t0 = time.perf_counter()
    rc = cli.main(["search", "--db", str(db), "--resume", "half", "--ray", f"127.0.0.1:{port}"])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"orchard: error: {_unreachable(port)}", err
    assert elapsed < 10, elapsed
    with Store(db) as store:
        assert store.run(run_id).to_dict() == stamp and [r.id for r in store.runs()] == [run_id]


def test_a_job_whose_ray_address_stopped_answering_fails_with_that_reason(tmp_path):
    """Submitting probes the address (nothing queued when nothing answers); a cluster gone between
    submission and start fails the job in seconds with the one-line reason, and no run is written."""
    pytest.importorskip("ray")
    import time

    from engine.jobs.runner import JobRunner
    from engine.jobs.submit import submit_search
    from engine.llm.base import GeneratorError

    with Store(tmp_path / "job.db") as store:
        port = _free_port()  # bound, then closed: nothing listens
        t0 = time.perf_counter()
        with pytest.raises(GeneratorError) as refused:
            submit_search(store, tasks="0:1", name="nowhere", ray=f"127.0.0.1:{port}")
        assert time.perf_counter() - t0 < 10 and str(refused.value) == _unreachable(port)
        assert store.jobs() == []
        with socket.socket() as head:  # answers while the job is submitted, then goes
            head.bind(("127.0.0.1", 0))
            head.listen()
            port = head.getsockname()[1]
            job_id = submit_search(store, tasks="0:1", name="gone", ray=f"127.0.0.1:{port}")
        done = JobRunner(store).wait(job_id, timeout=120)
        assert done.state == "failed", Path(done.log_path).read_text()[-2000:]
        assert done.error == f"RayUnavailable: {_unreachable(port)}"
        assert done.started_at is not None and done.finished_at is not None
        assert done.finished_at - done.started_at < 10, done.finished_at - done.started_at
        assert store.runs() == []  # joined before the run is written


def test_the_probe_passes_an_address_that_answers_and_leaves_local_and_auto_alone():
    from engine.search.ray_search import probe_address

    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        probe_address(f"127.0.0.1:{head.getsockname()[1]}")
    probe_address("")
    probe_address("auto")


def _no_worker(*args, **kwargs):
    raise AssertionError("the driver joined Ray: a worker would start")


def test_a_bad_model_spec_with_ray_is_refused_by_the_driver(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    from engine import cli
    from engine.search import ray_search

    monkeypatch.setattr(ray_search, "connect", _no_worker)
    port = _free_port()
    down = f"openai:http://127.0.0.1:{port}/v1#m"
    for spec, words in [("/no/such/model", "model '/no/such/model': no such folder"),
                        (down, f"model {down!r}: the server at"),
                        ("openai:http://127.0.0.1:1/v1", "model 'openai:http://127.0.0.1:1/v1': expected")]:
        rc = cli.main(["search", "--db", str(tmp_path / "x.db"), "--tasks", "0:1", "--model", spec, "--ray"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.startswith(f"orchard: error: {words}") and "\n" not in err, err
        assert not (tmp_path / "x.db").exists()  # nothing written: not even a database file


def test_resume_on_ray_with_a_bad_stored_model_is_refused_before_any_worker(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    from dataclasses import asdict

    from engine import cli
    from engine.jobs.kinds import load_job
    from engine.jobs.submit import submit_search
    from engine.llm.base import GeneratorError
    from engine.progress import MemoryReporter
    from engine.search import ray_search
    from engine.search.stage import run_search

    monkeypatch.setattr(ray_search, "connect", _no_worker)
    db = tmp_path / "x.db"
    tasks = env_factory("textcraft")().tasks("train")[:2]
    with Store(db) as store:
        run_id = store.create_run("gone", "textcraft", "/no/such/model", asdict(SearchConfig()), tasks)
        store.set_run_status(run_id, "interrupted")
        stamp = store.run(run_id).to_dict()
    rc = cli.main(["search", "--db", str(db), "--resume", "gone", "--ray"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("orchard: error: model '/no/such/model': no such folder"), err
    with Store(db) as store:
        assert store.run(run_id).to_dict() == stamp  # untouched
        # a queued job (the dashboard's Resume, or a job queued before the model folder went) alike
        with pytest.raises(GeneratorError, match="no such folder"):
            submit_search(store, resume=run_id, ray="")
        with pytest.raises(GeneratorError, match="no such folder"):
            run_search(store, load_job("search", {"resume": run_id, "ray": ""}), MemoryReporter())
        with pytest.raises(GeneratorError, match="no such folder"):
            run_search(store, load_job("search", {"tasks": "0:1", "model": "/no/such/model", "name": "x",
                                                  "ray": "auto"}), MemoryReporter())
        assert store.run(run_id).to_dict() == stamp and [r.id for r in store.runs()] == [run_id]
        assert store.jobs() == []


@pytest.mark.slow
def test_cluster_tests_in_a_loopback_only_namespace() -> None:
    """Run this module's cluster tests in a new network namespace where loopback is the only interface."""
    if os.environ.get("ORCHARD_RAY_ISOLATED") == "1":
        pytest.skip("already inside the namespace")
    if importlib.util.find_spec("ray") is None or not os.path.exists(RAY):
        pytest.skip("ray is not installed (pip install -e .[ray])")
    probe = subprocess.run(["unshare", "-n", "true"], check=False, capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot create a network namespace here (needs root and util-linux unshare)")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "ORCHARD_RAY_ISOLATED": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = (f"ip link set lo up && exec {sys.executable} -m pytest -q -p no:cacheprovider -p no:xdist "
           f"{Path(__file__).resolve()} -k 'not in_a_loopback_only_namespace'")
    done = subprocess.run(["unshare", "-n", "sh", "-c", cmd], check=False, cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]


def test_the_drivers_allow_http_key_reaches_the_workers_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_shard (a shard's body, Ray or not) loads its model with the driver's --allow-http-key."""
    from engine.llm import registry
    from engine.search import ray_search

    seen: list[object] = []

    def fake_load(spec: str, log=print, allow_http_key=None):
        seen.append(allow_http_key)
        raise RuntimeError("stop here")

    monkeypatch.setattr(registry, "load_generator", fake_load)
    for allow in (True, None):
        with pytest.raises(RuntimeError, match="stop here"):
            next(ray_search.run_shard("textcraft", "openai:http://10.0.0.1:8000/v1#m", {}, [], allow))
    assert seen == [True, None]
