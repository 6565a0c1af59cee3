"""Test doubles: a tiny deterministic env and a scripted Generator (no LLM)."""

from __future__ import annotations

import copy
import random
import re
import time
from collections.abc import Sequence

from engine.envs.base import EnvError, Step, TaskSpec
from engine.llm.base import Completion, Prompt, SampleRequest

COMMANDS = ("left", "right", "wait")


class LineEnv:
    """Walk on a line from 0 to the goal position (task id 'goal-G'); 'right' moves +1, 'left' -1.
    Reward 1 (done) on reaching the goal; progress = furthest position / goal (latched)."""

    name = "line"

    def __init__(self, n_tasks: int = 8) -> None:
        self._tasks = [TaskSpec(id=f"goal-{g}", goal=f"reach position {g}", context="commands: left, right, wait")
                       for g in range(1, n_tasks + 1)]
        self.pos = None
        self.goal = 0
        self.best = 0.0
        self.steps = 0

    def describe(self) -> str:
        return "Commands: left, right, wait."

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        if split not in ("train", "test"):
            raise EnvError(f"unknown split {split!r}")
        return list(self._tasks) if split == "train" else []

    def task(self, task_id: str) -> TaskSpec:
        for t in self._tasks:
            if t.id == task_id:
                return t
        raise EnvError(f"unknown task {task_id!r}")

    def reset(self, task_id: str) -> str:
        self.goal = int(self.task(task_id).id.split("-")[1])
        self.pos, self.best, self.steps = 0, 0.0, 0
        return f"You are at 0. The goal is {self.goal}."

    def step(self, command: str) -> Step:
        if self.pos is None:
            raise EnvError("step before reset")
        self.steps += 1
        c = command.strip().lower()
        if c == "right":
            self.pos += 1
        elif c == "left":
            self.pos -= 1
        elif c != "wait":
            return Step(f"Unknown command {command!r}.", progress=self.best)
        self.best = max(self.best, min(self.pos / self.goal, 1.0))
        done = self.pos == self.goal
        return Step(f"You are at {self.pos}.", reward=1.0 if done else 0.0, done=done, progress=self.best)


class SnapshotLineEnv(LineEnv):
    def snapshot(self):
        return (self.goal, self.pos, self.best, self.steps)

    def restore(self, state) -> None:
        self.goal, self.pos, self.best, self.steps = copy.deepcopy(state)


def action_text(command: str, status: str = "CONTINUE") -> str:
    return f"THOUGHT: I will go {command}.\nACTION: {command}\nEXPLANATION: moves me.\nSTATUS: {status}"


class ScriptedGenerator:
    """Answers actor prompts with random walk actions (biased right) and critic prompts by
    preferring 'right'. Deterministic per request seed. Records every call's batch size."""

    name = "scripted"

    def __init__(self, p_right: float = 0.6, p_garbage: float = 0.0, delay_s: float = 0.0) -> None:
        self.p_right = p_right
        self.p_garbage = p_garbage
        self.delay_s = delay_s
        self.calls: list[int] = []

    def _actor(self, rng: random.Random) -> Completion:
        if rng.random() < self.p_garbage:
            return Completion(text="\x00garbage" if rng.random() < 0.5 else "", logprob=-9.0, n_tokens=3)
        command = "right" if rng.random() < self.p_right else rng.choice(["left", "wait"])
        return Completion(text=action_text(command), logprob=-1.0 - rng.random(), n_tokens=12)

    def _critic(self, prompt: Prompt) -> Completion:
        listed = re.findall(r"^\[(\d+)\] ACTION: (\S+)", prompt[-1]["content"], re.MULTILINE)
        best = next((i for i, c in listed if c == "right"), listed[0][0] if listed else "1")
        return Completion(text=f"REASON: moving right approaches the goal.\nBEST: {best}", logprob=-0.5, n_tokens=8)

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        self.calls.append(len(requests))
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for req in requests:
            rng = random.Random(req.params.seed)
            if "CANDIDATES:" in req.prompt[-1]["content"]:
                out.append([self._critic(req.prompt) for _ in range(req.n)])
            else:
                out.append([self._actor(rng) for _ in range(req.n)])
        return out

    def logprobs(self, prompts, completions):
        return [None for _ in completions]


def damaged_store(path, table: str):
    """A current-schema Orchard database with `table` dropped by hand (what a damaged file looks like)."""
    import sqlite3

    from engine.store import Store

    with Store(path):
        pass
    con = sqlite3.connect(path)
    con.execute(f"DROP TABLE {table}")
    con.commit()
    con.close()
    return path
