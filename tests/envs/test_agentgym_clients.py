"""AgentGym's own clients against `orchard serve-env`: the first observation they read must carry the
task's goal and context, phrased the way AgentGym's server for that env phrases it.

The clients below re-implement, request for request, the env clients of AgentGym
(agentenv/envs/{textcraft,babyai,sciworld,webshop}.py in WooooDyy/AgentGym): the same endpoints, JSON
fields and library (`requests`), and the same way of reading the observation (`observe()` after
`reset(idx)`, which is what AgentGym's task loop shows the model first). Written from reading that
code, not copied; nothing else of AgentGym is used.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
import requests
from doubles import LineEnv
from envtools import start_serve_env

from engine.envs.serve import EnvService, make_server
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import solve

TIMEOUT = 30


class _IdClient:
    """What AgentGym's TextCraft, BabyAI and SciWorld clients share: POST bodies get "id" added,
    every answer must be HTTP 200 and is read as JSON."""

    def __init__(self, base: str, create_body: dict[str, Any] | None) -> None:
        self.env_server_base = base
        ok = requests.post(f"{base}/create", timeout=TIMEOUT, **({"json": create_body} if create_body else {}))
        assert ok.status_code == 200, ok.text
        self.created = ok.json()
        self.env_id = self.created["id"]
        self.info: dict[str, Any] = {}

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        data["id"] = self.env_id
        res = requests.post(f"{self.env_server_base}/{path}", json=data, timeout=TIMEOUT)
        assert res.status_code == 200, res.text
        return res.json()

    def observe(self) -> str:
        return self.info["observation"]

    def close(self) -> Any:
        return self._post("close", {})


class TextCraftClient(_IdClient):
    """agentenv/envs/textcraft.py: /create with minecraft_dir/commands/goal (its answer's observation
    is kept), reset with data_idx, the action is the last 'Action:' line stripped to [A-Za-z0-9, ]."""

    def __init__(self, base: str) -> None:
        super().__init__(base, {"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None})
        self.info = {"observation": self.created["observation"], "reward": 0, "done": False}

    def reset(self, idx: int = 0) -> Any:
        response = self._post("reset", {"data_idx": idx})
        self.info.update({"observation": response["observation"], "reward": 0, "done": False})
        return response

    def step(self, action: str) -> tuple[str, float, bool]:
        matches = re.findall(r"Action:\s*(.*?)(?=\n|$)", action, re.DOTALL)
        if len(matches) > 1:
            return "Error: Only one 'Action' is allowed per response. Please adjust your response.", 0, False
        action = matches[-1] if matches else ""
        action = " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", action).split()).strip()
        response = self._post("step", {"action": action})
        self.info = {"observation": response["observation"], "reward": response["reward"], "done": response["done"]}
        return response["observation"], response["reward"], response["done"]


class BabyAIClient(_IdClient):
    """agentenv/envs/babyai.py: /create with no body; reset reads observation, reward, score, done."""

    def __init__(self, base: str) -> None:
        super().__init__(base, None)

    def reset(self, data_idx: int = 0) -> Any:
        response = self._post("reset", {"data_idx": data_idx})
        self.info = {"observation": response["observation"], "reward": response["reward"],
                     "score": response["score"], "done": response["done"]}
        return response

    def step(self, action: str) -> tuple[str, float, bool]:
        response = self._post("step", {"action": action})
        self.info = {"observation": response["observation"], "reward": response["reward"],
                     "score": response["score"], "done": response["done"]}
        return response["observation"], response["score"], response["done"]


class SciWorldClient(BabyAIClient):
    """agentenv/envs/sciworld.py: like BabyAI, but the first observation is the /reset answer's
    task_description + newline + observation."""

    def reset(self, data_idx: int = 0) -> Any:
        response = self._post("reset", {"data_idx": data_idx})
        self.info = {"observation": response["task_description"] + "\n" + response["observation"],
                     "reward": 0, "score": 0, "done": False}
        return response


class WebShopClient:
    """agentenv/envs/webshop.py: /create answers a bare index; POST bodies carry "env_idx"; reset
    sends session_id and then reads the observation with GET /observation?env_idx=N."""

    def __init__(self, base: str) -> None:
        self.env_server_base = base
        ok = requests.post(f"{base}/create", timeout=TIMEOUT)
        assert ok.status_code == 200, ok.text
        self.env_id = ok.json()

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        data["env_idx"] = self.env_id
        res = requests.post(f"{self.env_server_base}/{path}", json=data, timeout=TIMEOUT)
        assert res.status_code == 200, res.text
        return res.json()

    def observe(self) -> Any:
        res = requests.get(f"{self.env_server_base}/observation?env_idx={self.env_id}", timeout=TIMEOUT)
        assert res.status_code == 200, res.text
        return res.json()

    def reset(self, idx: int) -> Any:
        response = self._post("reset", {"session_id": idx})
        response[0] = self.observe()
        return response


@pytest.fixture(scope="module")
def textcraft_server():
    proc, url = start_serve_env("textcraft")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _in_process(service: EnvService):
    srv = make_server(service)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/{service.name}"


def test_textcraft_client_reads_commands_and_goal_and_solves_the_task(textcraft_server):
    """AgentGym's TextCraft server answers 'Crafting commands:\\n...\\n\\nGoal: craft X.'; so must ours,
    with the task's own recipes; an agent that reads only that text then solves the task."""
    local = TextCraftEnv()
    for idx in (0, 5):
        task = local.tasks("train")[idx]
        client = TextCraftClient(textcraft_server)
        assert isinstance(client.observe(), str)  # /create's observation is read, too
        client.reset(idx)
        first = client.observe()
        match = re.fullmatch(r"Crafting commands:\n((?:.+\n)+)\nGoal: (craft .+)\.", first)
        assert match, first
        assert match[1].splitlines() == task.context.splitlines()[1:]
        assert match[2] == task.goal
        for step in solve(local, task.id):
            observation, reward, done = client.step(f"Thought:\nI need this.\n\nAction:\n{step[0].action.command}")
        assert (reward, done) == (1, True), observation
        assert client.close() == {"closed": True}


def test_babyai_client_reads_goal_view_and_available_actions():
    pytest.importorskip("minigrid")
    from engine.envs.babyai import BabyAIEnv

    service = EnvService(lambda: BabyAIEnv("GoToLocal?n=3"), "babyai", extensions=False)
    srv, url = _in_process(service)
    try:
        client = BabyAIClient(url)
        client.reset(1)
        task, local = service._tasks[1], BabyAIEnv("GoToLocal?n=3")
        view = local.reset(task.id)
        listed = ", ".join(f'"{c}"' for c in local.valid_commands())
        assert client.observe() == f"Your goal: {task.goal.rstrip('.')}\n{view}\nAvailable actions: [{listed}]"
        observation, score, done = client.step("turn left")
        assert isinstance(observation, str) and score == 0 and done is False
    finally:
        srv.shutdown()
        srv.server_close()


def test_sciworld_client_reads_the_task_description():
    """The SciWorld client builds its first observation from "task_description" (a KeyError without it)."""
    service = EnvService(LineEnv, "scienceworld", extensions=False)
    srv, url = _in_process(service)
    try:
        client = SciWorldClient(url)
        client.reset(2)
        task = service._tasks[2]
        assert client.observe() == f"{task.goal}\n{task.context}\nYou are at 0. The goal is 3."
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("style", ["id", "env_idx"])
def test_other_envs_carry_goal_and_context_in_the_first_observation(style):
    """Any other env: 'Your goal: ...' then the context, then the env's observation (BabyAI's phrasing);
    WebShop-style clients read it back from GET /observation."""
    service = EnvService(LineEnv, "line", style=style)
    srv, url = _in_process(service)
    try:
        want = "Your goal: reach position 4\ncommands: left, right, wait\nYou are at 0. The goal is 4."
        if style == "env_idx":
            client = WebShopClient(url)
            assert client.reset(3)[0] == want
        else:
            client = BabyAIClient(url)
            answer = client.reset(3)
            assert client.observe() == want
            assert answer["env_observation"] == "You are at 0. The goal is 4."  # Orchard's extension
    finally:
        srv.shutdown()
        srv.server_close()
