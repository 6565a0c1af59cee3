"""Search on a REAL local two-node Ray cluster (head + a second node, separate processes on loopback)
against the per-request-seeded delayed server: the same trees as a local run, and a worker killed
mid-run loses nothing committed."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    if not os.path.exists(RAY):
        pytest.skip("no ray command next to the interpreter")
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus=1", "--disable-usage-stats"]
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                    "--include-dashboard=false", *common], check=True, env=env, capture_output=True, timeout=120)
    try:
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", *common],
                       check=True, env=env, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([RAY, "stop", "--force"], check=False, env=env, capture_output=True, timeout=120)


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
