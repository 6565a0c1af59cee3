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
