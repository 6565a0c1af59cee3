"""check_env passes on a good toy env and fails, naming the rule, on one deliberately broken env per rule."""

from __future__ import annotations

import copy
import itertools
import math
import re
import sys
import types
from pathlib import Path

import pytest

from engine.envs.base import EnvBase, EnvError, Step, TaskSpec
from engine.envs.check import RULES, EnvCheckError, check_env


class Counter(EnvBase):
    """Count up to the task's goal with 'inc'; 'dec' goes back. Progress = best position / goal (latched);
    done at the goal; snapshots are copies."""

    name = "counter"

    def __init__(self) -> None:
        self.state: dict | None = None

    def describe(self) -> str:
        return "Commands: inc, dec, look."

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        if split not in ("train", "test"):
            raise EnvError(f"unknown split {split!r}")
        goals = (2, 3, 4) if split == "train" else (5,)
        return [TaskSpec(id=f"{split}-{g}", goal=f"count to {g}", split=split) for g in goals]

    def task(self, task_id: str) -> TaskSpec:
        for t in self.tasks("train") + self.tasks("test"):
            if t.id == task_id:
                return t
        raise EnvError(f"unknown task id {task_id!r}")

    def goal(self, task_id: str) -> int:
        return int(task_id.rsplit("-", 1)[1])

    def reset(self, task_id: str) -> str:
        self.task(task_id)
        self.state = {"task": task_id, "pos": 0, "best": 0.0, "done": False}
        return self.observe()

    def observe(self) -> str:
        return f"At {self.state['pos']} of {self.goal(self.state['task'])}."

    def step(self, command: str) -> Step:
        if self.state is None:
            raise EnvError("step before reset")
        s = self.state
        if s["done"]:
            return Step("Over.", 0.0, True, s["best"])
        if command == "inc":
            s["pos"] += 1
        elif command == "dec":
            s["pos"] -= 1
        elif command != "look":
            return Step(f"Unknown command {command!r}.", 0.0, False, s["best"])
        goal = self.goal(s["task"])
        s["best"] = max(s["best"], min(max(s["pos"], 0) / goal, 1.0))
        s["done"] = s["pos"] == goal
        return Step(self.observe(), self.reward(), s["done"], self.progress())

    def reward(self) -> float:
        return 1.0 if self.state["done"] else 0.0

    def progress(self) -> float | None:
        return self.state["best"]

    def expert(self, task_id: str) -> list[str]:
        return ["inc", "dec", "look"] + ["inc"] * self.goal(task_id) + ["look"]

    def snapshot(self) -> dict:
        return copy.deepcopy(self.state)

    def restore(self, state: dict) -> None:
        self.state = copy.deepcopy(state)


class ReplayCounter(Counter):
    """Counter without snapshots (restore by replay)."""

    snapshot = None  # type: ignore[assignment]
    restore = None  # type: ignore[assignment]


def test_a_good_env_passes_every_rule() -> None:
    checked = check_env(Counter())
    assert set(checked) == set(RULES)


def test_an_env_without_snapshots_skips_the_snapshot_rules_and_takes_commands() -> None:
    class NoExpert(ReplayCounter):
        expert = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="pass commands="):
        check_env(NoExpert())
    checked = check_env(NoExpert(), commands=["inc", "inc", "inc", "inc", "look"], max_tasks=2)
    assert set(RULES) - set(checked) == {"snapshot-not-aliased", "snapshot-equals-replay"}


class NoDescription(Counter):
    def describe(self) -> str:
        return ""


class StepsBeforeReset(Counter):
    def step(self, command: str) -> Step:
        if self.state is None:
            return Step("Nothing here.")
        return super().step(command)


class NoTasks(Counter):
    def tasks(self, split: str = "train") -> list[TaskSpec]:
        return []


class DuplicateIds(Counter):
    def tasks(self, split: str = "train") -> list[TaskSpec]:
        tasks = super().tasks(split)
        return tasks + tasks[:1]


class TaskDoesNotRoundTrip(Counter):
    def task(self, task_id: str) -> TaskSpec:
        t = super().task(task_id)
        return TaskSpec(id=t.id, goal=t.goal.upper(), split=t.split)


class AcceptsUnknownTasks(Counter):
    def task(self, task_id: str) -> TaskSpec:
        try:
            return super().task(task_id)
        except EnvError:
            return self.tasks()[0]

    def goal(self, task_id: str) -> int:
        return int(self.task(task_id).id.rsplit("-", 1)[1])


class NonDeterministicReset(Counter):
    _count = itertools.count()

    def reset(self, task_id: str) -> str:
        return super().reset(task_id) + f" (visit {next(self._count)})"


class ResetDependsOnLastTask(Counter):
    """Deterministic twice in a row, but the first observation leaks the previous task."""

    last = ""

    def reset(self, task_id: str) -> str:
        obs = super().reset(task_id) + (f" (before: {self.last})" if self.last != task_id else "")
        self.last = task_id
        return obs


class ReturnsTuples(Counter):
    def step(self, command: str):
        s = super().step(command)
        return (s.observation, s.reward, s.done)


class RaisesOnUnknownCommands(Counter):
    def step(self, command: str) -> Step:
        if command not in ("inc", "dec", "look"):
            raise ValueError(f"cannot parse {command!r}")
        return super().step(command)


class NanReward(Counter):
    def reward(self) -> float:
        return math.nan if self.state["pos"] == 1 else super().reward()


class ProgressAboveOne(Counter):
    def progress(self) -> float | None:
        return 1.5 if self.state["done"] else super().progress()


class ProgressNotLatched(Counter):
    def progress(self) -> float | None:
        return max(self.state["pos"], 0) / self.goal(self.state["task"])


class PaysTwice(Counter):
    def step(self, command: str) -> Step:
        if self.state is not None and self.state["done"]:
            return Step("Over.", 1.0, True, 1.0)
        return super().step(command)


class ReplayDiffers(Counter):
    """Reset is deterministic, steps are not: a hidden counter survives resets."""

    steps_ever = 0

    def step(self, command: str) -> Step:
        type(self).steps_ever += 1
        s = super().step(command)
        return Step(s.observation + ("!" if self.steps_ever % 7 == 0 else ""), s.reward, s.done, s.progress)


class AliasingSnapshot(Counter):
    def snapshot(self) -> dict:
        return self.state  # a view of the live state, not a copy

    def reset(self, task_id: str) -> str:
        if self.state is None:
            self.state = {}
        self.task(task_id)
        self.state.update(task=task_id, pos=0, best=0.0, done=False)  # in place
        return self.observe()


class RestoreForgetsTheTask(Counter):
    def restore(self, state: dict) -> None:
        task = self.state["task"]
        super().restore(state)
        self.state["task"] = task


class CloseNotIdempotent(Counter):
    closed = False

    def close(self) -> None:
        if self.closed:
            raise RuntimeError("already closed")
        self.closed = True


class NoClose(Counter):
    close = None  # type: ignore[assignment]


BROKEN = [
    ("describe", NoDescription),
    ("step-before-reset", StepsBeforeReset),
    ("tasks-non-empty", NoTasks),
    ("task-ids-unique", DuplicateIds),
    ("task-round-trip", TaskDoesNotRoundTrip),
    ("unknown-task", AcceptsUnknownTasks),
    ("reset-deterministic", NonDeterministicReset),
    ("reset-deterministic", ResetDependsOnLastTask),
    ("step-returns-step", ReturnsTuples),
    ("step-returns-step", RaisesOnUnknownCommands),
    ("reward-in-range", NanReward),
    ("progress-in-range", ProgressAboveOne),
    ("progress-latched", ProgressNotLatched),
    ("step-after-done", PaysTwice),
    ("replay-deterministic", ReplayDiffers),
    ("snapshot-not-aliased", AliasingSnapshot),
    ("snapshot-equals-replay", RestoreForgetsTheTask),
    ("close", CloseNotIdempotent),
    ("close", NoClose),
]


@pytest.mark.parametrize(("rule", "broken"), BROKEN, ids=[cls.__name__ for _, cls in BROKEN])
def test_a_broken_env_fails_naming_the_rule(rule: str, broken: type) -> None:
    with pytest.raises(EnvCheckError) as caught:
        check_env(broken())
    assert caught.value.rule == rule
    message = str(caught.value)
    assert f"breaks rule '{rule}'" in message and message.startswith("env 'counter'")
    assert "\n" not in message


def test_every_rule_has_a_broken_env() -> None:
    assert {rule for rule, _ in BROKEN} == set(RULES)


def test_budget_options_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        check_env(Counter(), max_steps=0)
    env = Counter()
    assert "close" not in check_env(env, close=False, max_tasks=1, max_steps=3)


def test_the_readme_plugin_example_passes_the_checker() -> None:
    """README's "Registering your own env": its example env and its check_env snippet, run as written."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(# my_envs/coins\.py.*?)```", readme, re.DOTALL)
    snippet = re.search(r"```python\n(from engine\.envs\.check import check_env\n.*?)```", readme, re.DOTALL)
    assert example and snippet, "README lost its plugin example or its check_env snippet"
    module = types.ModuleType("my_envs.coins")
    exec(compile(example[1], "README.md", "exec"), module.__dict__)  # noqa: S102 - our own README
    names = {"my_envs": types.ModuleType("my_envs"), "my_envs.coins": module}
    with pytest.MonkeyPatch.context() as mp:
        for name, mod in names.items():
            mp.setitem(sys.modules, name, mod)
        exec(compile(snippet[1], "README.md", "exec"), {})  # noqa: S102 - raises EnvCheckError if it breaks a rule
