"""AgentGym protocol: `orchard serve-env` in a subprocess over real HTTP on 127.0.0.1, driven by the
AgentGym client env (id and env_idx styles), server errors, timeouts, and a stored MCTS run."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from canned_http import canned_server
from doubles import LineEnv, ScriptedGenerator
from envtools import check_search, start_serve_env, stored_search
from fuzz_data import model_outputs

from engine.config import SearchConfig
from engine.envs.agentgym import AgentGymEnv
from engine.envs.base import EnvError, Step
from engine.envs.check import check_env
from engine.envs.serve import EnvService, make_server
from engine.envs.textcraft_expert import solve
from engine.search.runner import new_run
from engine.store import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    proc, url = start_serve_env("textcraft")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _expert_commands(task_id: str) -> list[str]:
    from engine.envs.textcraft import TextCraftEnv

    return [s.action.command for s, _ in solve(TextCraftEnv(), task_id)]


def test_client_solves_tasks_over_http(server: str) -> None:
    env = AgentGymEnv(server + "?timeout=10")
    tasks = env.tasks("train")
    assert tasks[0].id == "train-0" and tasks[0].goal.startswith("craft")  # from the /tasks extension
    assert "TextCraft" in env.describe()
    for task in tasks[:3]:
        assert env.reset(task.id).startswith("You are carrying nothing")
        steps = [env.step(c) for c in _expert_commands(task.id)]
        assert steps[-1].done and steps[-1].reward == 1.0 and steps[-1].progress == 1.0
    env.close()


def test_raw_protocol_both_request_styles(server: str) -> None:
    base = server.rsplit("/", 1)[0]  # endpoints also answer without the /textcraft prefix
    created = httpx.post(f"{base}/create", timeout=5).json()
    idx = created["id"]
    first = httpx.post(f"{base}/reset", json={"id": idx, "data_idx": 2}, timeout=5).json()
    assert first["task_id"] == "train-2" and first["done"] is False
    step = httpx.post(f"{base}/step", json={"env_idx": idx, "action": "inventory"}, timeout=5).json()
    assert step["observation"] == step["state"] and step["reward"] == 0.0 and step["done"] is False
    assert httpx.get(f"{base}/observation", params={"env_idx": idx}, timeout=5).json() == step["observation"]
    assert httpx.post(f"{base}/close", json={"id": idx}, timeout=5).json() == {"closed": True}
    gone = httpx.post(f"{base}/step", json={"id": idx, "action": "inventory"}, timeout=5)
    assert gone.status_code == 404 and "no environment with id" in gone.json()["error"]


def test_server_errors_are_clear(server: str) -> None:
    env = AgentGymEnv(server + "?timeout=10")
    with pytest.raises(EnvError, match="unknown task id 'nope'"):
        env.reset("nope")
    base = server
    bad = httpx.post(f"{base}/reset", content=b"{not json", timeout=5)
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
    idx = httpx.post(f"{base}/create", timeout=5).json()["id"]
    out = httpx.post(f"{base}/reset", json={"id": idx, "data_idx": 10**6}, timeout=5)
    assert out.status_code == 400 and "data_idx must be" in out.json()["error"]
    missing = AgentGymEnv(base + "/nothing/here?timeout=5")
    with pytest.raises(EnvError, match=r"HTTP 404: no endpoint POST /nothing/here/create"):
        missing._request("POST", "create", {})


def test_the_env_contract_holds_over_http(server: str) -> None:
    """check_env through the client: determinism and replay over HTTP, step after done; close frees
    the server's instance."""
    env = AgentGymEnv(server + "?timeout=10")
    checked = check_env(env, commands=lambda t: _expert_commands(t.id), max_tasks=2, max_steps=40)
    assert {"replay-deterministic", "step-after-done", "close"} <= set(checked)
    gone = httpx.post(f"{server}/step", json={"id": env._idx, "action": "inventory"}, timeout=5)
    assert gone.status_code == 404


class _Faulty(LineEnv):
    def step(self, command: str) -> Step:
        if command == "boom":
            raise RuntimeError("the simulator crashed")
        return super().step(command)


def _thread_server(service: EnvService) -> tuple[str, object]:
    srv = make_server(service)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/line", srv


def test_env_idx_style_and_env_failures_in_process() -> None:
    url, srv = _thread_server(EnvService(_Faulty, "line", style="env_idx", max_envs=1, idle_s=3600,
                                                 extensions=False))
    try:
        assert httpx.post(url.rsplit("/", 1)[0] + "/create", timeout=5).json() == 0  # a bare N
        env = AgentGymEnv(url + "?timeout=5&n=3")
        assert [t.id for t in env.tasks()] == ["0", "1", "2"]  # no /tasks: data indices
        assert env.describe().startswith("An environment served over HTTP")
        with pytest.raises(EnvError, match="HTTP 503: too many environments"):
            env.reset("0")  # max_envs=1 and that one is in use
        httpx.post(url + "/close", json={"env_idx": 0}, timeout=5)
        # [observation, null] answer; with no /tasks the goal is known only from the first observation
        assert env.reset("1") == "Your goal: reach position 2\ncommands: left, right, wait\nYou are at 0. The goal is 2."
        assert env.style == "env_idx"
        assert env.step("right").observation == "You are at 1."
        assert env.step("right").reward == 1.0
        with pytest.raises(EnvError, match="HTTP 500: RuntimeError: the simulator crashed"):
            env.step("boom")
    finally:
        srv.shutdown()
        srv.server_close()


class _ThreadBound(LineEnv):
    """An env whose objects belong to one thread (like the web env's browser): records every call's thread."""

    thread_bound = True
    threads: ClassVar[set[str]] = set()  # names: unlike idents, never reused

    def __init__(self) -> None:
        super().__init__()
        self.threads.add(threading.current_thread().name)

    def reset(self, task_id: str) -> str:
        self.threads.add(threading.current_thread().name)
        return super().reset(task_id)

    def step(self, command: str) -> Step:
        self.threads.add(threading.current_thread().name)
        return super().step(command)


def test_thread_bound_env_is_served_from_one_thread() -> None:
    url, srv = _thread_server(EnvService(_ThreadBound, "line"))
    _ThreadBound.threads.clear()  # the service's probe was made on this thread
    try:
        for _ in range(3):  # a new connection (a new server thread) each time
            with httpx.Client(timeout=5) as client:
                idx = client.post(f"{url}/create").json()["id"]
                client.post(f"{url}/reset", json={"id": idx, "data_idx": 1})
                assert client.post(f"{url}/step", json={"id": idx, "action": "right"}).json()["reward"] == 0.0
        assert len(_ThreadBound.threads) == 1 and threading.current_thread().name not in _ThreadBound.threads
    finally:
        srv.shutdown()
        srv.server_close()


def test_timeouts_and_unreachable_servers_fail_fast() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    port = silent.getsockname()[1]
    try:
        env = AgentGymEnv(f"http://127.0.0.1:{port}/textcraft?timeout=0.5&n=2")
        start = time.monotonic()
        with pytest.raises(EnvError, match=r"GET /tasks timed out after 0.5s"):
            env.reset("0")
        assert time.monotonic() - start < 5
    finally:
        silent.close()
    with pytest.raises(EnvError, match="failed"):
        AgentGymEnv(f"http://127.0.0.1:{port}/textcraft?timeout=2&n=2").reset("0")  # nothing listens now
    with pytest.raises(EnvError, match="not an http"):
        AgentGymEnv("ftp://example/x")


@pytest.mark.parametrize("body", model_outputs())
def test_hostile_reply_bodies_are_one_line_env_errors(body: str) -> None:
    """Server replies are untrusted (tests/data/fuzz/model_outputs.json): deep nesting, huge numbers
    and lone surrogates are an EnvError naming the server, never a RecursionError traceback."""
    with canned_server(lambda method, path, data: (200, body.encode("utf-8", "surrogatepass"))) as url:
        env = AgentGymEnv(f"{url}/textcraft?timeout=5&n=2")
        with pytest.raises(EnvError) as err:
            env.reset("0")
    msg = str(err.value)
    assert msg.startswith(f"AgentGym server {url}/textcraft: ") and "\n" not in msg.strip()


class _NaNLine(LineEnv):
    """A simulator behind an AgentGym server that reports NaN as the reward of one step."""

    def step(self, command: str) -> Step:
        s = super().step(command)
        return Step(s.observation, float("nan"), s.done, s.progress) if self.pos == 1 else s


def test_nan_reward_from_the_server_is_a_clear_search_error(tmp_path) -> None:
    """A NaN reward (JSON `NaN`, as Python servers write it) used to pass the client's clamp and end
    the search with an IntegrityError traceback from the store; now one EnvError naming server, task
    and step, the run interrupted with that reason and nothing stored for the bad step."""
    url, srv = _thread_server(EnvService(_NaNLine, "line", idle_s=3600))
    try:
        make_env = lambda: AgentGymEnv(url + "?timeout=5")
        tasks = [make_env().task("goal-2")]
        with Store(tmp_path / "o.db") as store:
            with pytest.raises(EnvError, match=re.escape(f"env agentgym at {url}: task 'goal-2', step 1 ('right'): "
                                                          "reward nan is not a finite number")):
                new_run(store, f"agentgym:{url}", tasks, ScriptedGenerator(p_right=1.0),
                        SearchConfig(simulations=4, k=2, depth_limit=3), "nan", make_env=make_env)
            (info,) = store.runs()
            assert info.status == "interrupted" and "reward nan" in info.stats["error"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_cli_errors_are_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "engine.cli", "serve-env", "nosuchenv", "--port", "0"],
                         check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("orchard: error: unknown env 'nosuchenv'")
    assert "Traceback" not in out.stderr


def test_mcts_run_through_the_client_stores_trees(tmp_path, server: str) -> None:
    spec = f"agentgym:{server}?timeout=10"
    env = AgentGymEnv(server + "?timeout=10")
    tasks = env.tasks("train")[:2]
    commands = sorted({c for t in tasks for c in _expert_commands(t.id)} | {"inventory"})
    stats, trees = stored_search(tmp_path, spec, lambda: AgentGymEnv(server + "?timeout=10"), tasks, commands)
    check_search(stats, trees, 2)
    assert stats.replays > 0  # restore by replay over HTTP
