"""A client Env for AgentGym-style HTTP env servers: `--env agentgym:http://HOST:PORT[/NAME][?options]`.

Drives the env servers people already run for AgentGym (and `orchard serve-env`): POST /create,
POST /reset, POST /step, GET /observation, POST /close. The request style is detected from the
/create answer: {"id": N} -> requests carry "id" (TextCraft, BabyAI, SciWorld servers); a bare N ->
requests carry "env_idx" (WebShop); step answers may say "observation" or "state". When the server
offers Orchard's GET /tasks and /describe, task ids, goals and the description come from there;
otherwise tasks are data indices "0".."n-1" (option n, default 100; their goals are in the first
observation). Every request has a timeout (option timeout, seconds, default 60); failures, server
errors and timeouts raise EnvError naming the server and endpoint. Restore is replay from reset.

Options: timeout=SECONDS, n=TASKS, style=auto|id|env_idx, score=100 (the server reports a 0..100
"score", as the SciWorld server does; default for paths naming sciworld/scienceworld).
"""

from __future__ import annotations

import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from engine import safejson
from engine.envs.base import EnvBase, EnvError, RemoteReplyError, Step, TaskSpec
from engine.envs.registry import split_options

OPTIONS = {"timeout": float, "n": int, "style": str, "score": float}
CLOSE_TIMEOUT_S = 2.0

GENERIC = """An environment served over HTTP (AgentGym protocol). Read each observation, then answer
with exactly one command in the form the environment asks for."""


def _close_remote(client: httpx.Client, url: str, key: str, idx: Any) -> None:
    """Best effort: free the server's instance when the env goes away (short timeout, no errors)."""
    try:
        client.post(f"{url}/close", json={key: idx}, timeout=CLOSE_TIMEOUT_S)
    except httpx.HTTPError:
        pass
    finally:
        client.close()


class AgentGymEnv(EnvBase):
    """One env instance on an AgentGym-style server (created at the first reset)."""

    name = "agentgym"

    def __init__(self, arg: str = "") -> None:
        if not arg:
            raise EnvError("agentgym needs the server URL, e.g. --env agentgym:http://127.0.0.1:36001/textcraft")
        parts = urlsplit(arg)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise EnvError(f"agentgym: {arg!r} is not an http(s) URL")
        _, opts = split_options("?" + parts.query, OPTIONS, "agentgym")
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.server_name = parts.path.rstrip("/").rsplit("/", 1)[-1].lower()
        self.timeout = float(opts.get("timeout", 60.0))
        if self.timeout <= 0:
            raise EnvError("agentgym: option timeout must be positive")
        self.n = int(opts.get("n", 100))
        self.style = str(opts.get("style", "auto"))
        if self.style not in ("auto", "id", "env_idx"):
            raise EnvError("agentgym: option style must be auto, id or env_idx")
        default_scale = 100.0 if self.server_name in ("sciworld", "scienceworld") else 0.0
        self.score_scale = float(opts.get("score", default_scale))
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)))
        self._idx: Any = None
        self._finalizer: weakref.finalize | None = None
        self._catalogue: dict[str, list[TaskSpec]] | None = None
        self._description: str | None = None
        self._orchard = False  # the server offers /tasks
        self._task: TaskSpec | None = None
        self._done = False

    # -- HTTP -------------------------------------------------------------------------------------------

    def _request(self, method: str, endpoint: str, body: dict[str, Any] | None = None,
                 params: dict[str, Any] | None = None, missing_ok: bool = False) -> Any:
        where = f"AgentGym server {self.url}: {method} /{endpoint}"
        try:
            response = self._client.request(method, f"{self.url}/{endpoint}", json=body, params=params)
        except httpx.TimeoutException:
            raise EnvError(f"{where} timed out after {self.timeout:g}s") from None
        except httpx.HTTPError as e:
            raise EnvError(f"{where} failed: {e}") from None
        if missing_ok and response.status_code in (404, 405, 422):
            return None
        unreadable = "null"
        try:
            payload = safejson.loads(response.content)  # bounded: the reply is untrusted
        except ValueError as e:
            payload, unreadable = None, getattr(e, "msg", str(e))
        if response.status_code != 200:
            detail = payload.get("error") or payload.get("detail") if isinstance(payload, dict) else None
            raise RemoteReplyError(f"{where} answered HTTP {response.status_code}: {detail or response.text[:200]}",
                                   where, response.content, response.status_code)
        if isinstance(payload, dict) and "error" in payload:
            raise RemoteReplyError(f"{where} reported an error: {payload['error']}", where, response.content, 200)
        if payload is None:
            raise RemoteReplyError(f"{where} answered something that is not acceptable JSON ({unreadable}): "
                                   f"{response.text[:200]!r}", where, response.content, 200)
        return payload

    def _key(self) -> str:
        return "env_idx" if self.style == "env_idx" else "id"

    def _create(self) -> None:
        answer = self._request("POST", "create", {})
        if isinstance(answer, dict) and ("id" in answer or "env_idx" in answer):
            self._idx = answer.get("id", answer.get("env_idx"))
            if self.style == "auto":
                self.style = "id" if "id" in answer else "env_idx"
        elif isinstance(answer, int) and not isinstance(answer, bool):
            self._idx = answer
            if self.style == "auto":
                self.style = "env_idx"
        else:
            raise RemoteReplyError(f"AgentGym server {self.url}: /create answered {str(answer)[:200]!r}, "
                                   "expected {\"id\": N} or a bare N", f"AgentGym server {self.url}: POST /create",
                                   str(answer))
        self._finalizer = weakref.finalize(self, _close_remote, self._client, self.url, self._key(), self._idx)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        else:
            self._client.close()

    # -- tasks ------------------------------------------------------------------------------------------

    def _tasks(self, split: str) -> list[TaskSpec]:
        if self._catalogue is None:
            self._catalogue = {}
        if split not in self._catalogue:
            rows = self._request("GET", "tasks", params={"split": split}, missing_ok=True)
            if isinstance(rows, list):
                bad = next((i for i, r in enumerate(rows) if not (isinstance(r, dict) and "id" in r)), None)
                if bad is not None:
                    raise RemoteReplyError(f"AgentGym server {self.url}: GET /tasks row {bad} is not an object "
                                           f"with an \"id\": {str(rows[bad])[:200]!r}",
                                           f"AgentGym server {self.url}: GET /tasks", str(rows))
                self._orchard = True
                self._catalogue[split] = [
                    TaskSpec(id=str(r["id"]), goal=str(r.get("goal", "")), context=str(r.get("context", "")),
                             split=split, meta={"data_idx": i}) for i, r in enumerate(rows)]
            elif split == "train":
                self._catalogue[split] = [
                    TaskSpec(id=str(i), goal=f"solve task {i} of {self.server_name or 'the server'} "
                             "(the task is stated in the first observation)", split="train",
                             meta={"data_idx": i}) for i in range(self.n)]
            else:
                self._catalogue[split] = []
        return self._catalogue[split]

    def describe(self) -> str:
        if self._description is None:
            info = self._request("GET", "describe", missing_ok=True)
            self._description = info["description"] if isinstance(info, dict) and "description" in info else GENERIC
        return self._description

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        return list(self._tasks(split))

    def task(self, task_id: str) -> TaskSpec:
        for split in ("train", "test"):
            for t in self._tasks(split):
                if t.id == task_id:
                    return t
        raise EnvError(f"unknown task id {task_id!r} on AgentGym server {self.url}")

    # -- episode ----------------------------------------------------------------------------------------

    def reset(self, task_id: str) -> str:
        task = self.task(task_id)
        if self._idx is None:
            self._create()
        body: dict[str, Any] = {self._key(): self._idx, "data_idx": task.meta["data_idx"]}
        if self._orchard:
            body["task_id"] = task.id
        answer = self._request("POST", "reset", body)
        self._task, self._done = task, False
        if isinstance(answer, list | tuple) and answer:
            return str(answer[0])
        if isinstance(answer, str):
            return answer
        if isinstance(answer, dict):
            if self._orchard and isinstance(answer.get("env_observation"), str):
                return answer["env_observation"]  # goal and context are in the task (from /tasks), not repeated
            observation = str(answer.get("observation", answer.get("state", "")))
            if answer.get("task_description"):
                observation = f"{answer['task_description']}\n{observation}"
            if not observation:
                observation = str(self._request("GET", "observation", params={self._key(): self._idx}))
            return observation
        raise RemoteReplyError(f"AgentGym server {self.url}: /reset answered {str(answer)[:200]!r}",
                               f"AgentGym server {self.url}: POST /reset", str(answer))

    def step(self, command: str) -> Step:
        if self._task is None:
            raise EnvError("step() before reset(): call reset(task_id) first")
        answer = self._request("POST", "step", {self._key(): self._idx, "action": command})
        if not isinstance(answer, dict):
            raise RemoteReplyError(f"AgentGym server {self.url}: /step answered {str(answer)[:200]!r}",
                                   f"AgentGym server {self.url}: POST /step", str(answer))
        observation = str(answer.get("observation", answer.get("state", "")))
        done = bool(answer.get("done", False))
        reward = _number(answer.get("reward", 0.0))
        if self.score_scale and answer.get("score") is not None:
            reward = _number(answer["score"]) / self.score_scale if done else 0.0
        progress = answer.get("progress")
        info = answer["info"] if isinstance(answer.get("info"), dict) else {}
        return Step(observation, reward, done, None if progress is None else _number(progress), dict(info))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
