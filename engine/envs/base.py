"""The environment protocol every env (built-in or adapter) implements.

Tiny on purpose, Gymnasium-style, text in and text out. Search needs exactly this: reset to a task,
step a command, and restore a state — through `snapshot()/restore()` when the env offers them,
otherwise by replaying the commands from `reset` (envs must be deterministic per task id) — and
release what an env holds (`close()`: a browser page, a remote session, a simulator process) when the
caller is done with it. `engine.envs.check.check_env` tests an env against this contract.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Self, runtime_checkable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSpec:
    """One task. `goal` is the user's request; `context` is task material shown at every step
    (TextCraft: the crafting commands), because older observations are dropped from prompts."""

    id: str
    goal: str
    context: str = ""
    split: str = "train"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """What one command did. `reward` is in [0, 1]; `progress` (latched, never decreasing) too; the
    engine enforces both where steps enter it (`checked_step`)."""

    observation: str
    reward: float = 0.0
    done: bool = False
    progress: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


class EnvError(ValueError):
    """Bad use of an env (unknown task id, step before reset): a clear message, not a traceback."""


class RemoteReplyError(EnvError):
    """An env server's reply that is refused. `str()` quotes the start of what it sent (for the
    user's own log); `brief` names only where, the status and the length. WHY: a dashboard form probes
    the server a user names; the page shows `brief`, so a probe cannot be used to read what another
    service on this machine's network answers (docs/decisions.md)."""

    def __init__(self, message: str, where: str, reply: str | bytes, status: int | None = None) -> None:
        super().__init__(message)
        answer = f"HTTP {status}" if status is not None else "a reply"
        self.brief = f"{where} answered {answer} (length {len(reply)}) that is refused; its text is not shown here"


def env_label(env: object) -> str:
    """How errors name an env: its `name`, and the server it talks to where it has one."""
    name = str(getattr(env, "name", type(env).__name__))
    url = getattr(env, "url", None)
    return f"{name} at {url}" if isinstance(url, str) and url else name


def checked_step(step: Step, env: str, task_id: str, step_no: int, command: str) -> Step:
    """`step` with `reward` and `progress` validated: the one place Step values enter the search and
    the evaluation (docs/decisions.md, "Env rewards are validated where they enter the engine").
    A value that is not a finite number (NaN, inf, a string) is an EnvError naming env, task and step:
    it would poison every Q on the path, and SQLite stores NaN as NULL. A finite value outside [0, 1]
    is clamped into it, with a warning: scales differ between envs, the order of values survives."""
    reward, progress = step.reward, step.progress
    if type(reward) is float and 0.0 <= reward <= 1.0 and (
            progress is None or type(progress) is float and 0.0 <= progress <= 1.0):
        return step  # the common case, checked without the loop below (search takes ~10 steps per simulation)
    values: dict[str, Any] = {}
    for name in ("reward", "progress"):
        value = getattr(step, name)
        if value is None and name == "progress":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise EnvError(f"env {env}: task {task_id!r}, step {step_no} ({command[:80]!r}): {name} {value!r} "
                           "is not a finite number (the env or its server is broken)")
        if not 0.0 <= value <= 1.0:
            log.warning("env %s: task %r, step %d: %s %r clamped into [0, 1]", env, task_id, step_no, name, value)
            values[name] = min(max(float(value), 0.0), 1.0)
    return replace(step, **values) if values else step


@runtime_checkable
class Env(Protocol):
    name: str

    def describe(self) -> str:
        """How to act in this env (commands and their syntax), for the system prompt."""
        ...

    def tasks(self, split: str = "train") -> list[TaskSpec]: ...

    def task(self, task_id: str) -> TaskSpec: ...

    def reset(self, task_id: str) -> str:
        """Start task `task_id`; returns the first observation."""
        ...

    def step(self, command: str) -> Step:
        """Act. A command the env does not understand is an observation saying so, never an exception;
        step() before reset() raises EnvError; after done, step() returns done=True with reward 0."""
        ...

    def close(self) -> None:
        """Release what the env holds; idempotent. After close, reset() may start it again or raise
        EnvError (env-specific); search and evaluation never use a closed env."""
        ...


class EnvBase:
    """A base for envs: a no-op `close()` and `with env:` support. Subclass it and override `close`
    where the env holds something (the built-ins do)."""

    def close(self) -> None:
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_env(env: Any) -> None:
    """Close `env` if it has a `close()`: callers use this, so a plugin env without one still works."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


def close_envs(envs: Iterable[Any]) -> None:
    """Close every env (or anything with a close(), e.g. search jobs), even when one's close() raises;
    the first error is raised after the rest are closed."""
    error: BaseException | None = None
    for env in envs:
        try:
            close_env(env)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the other envs are closed
            error = error or e
    if error is not None:
        raise error


@runtime_checkable
class SupportsSnapshot(Protocol):
    """Optional: a cheap copy of the env's state (must not alias later mutations)."""

    def snapshot(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


@runtime_checkable
class SupportsValidCommands(Protocol):
    """Optional: the commands that are valid now (offered to prompts, used for snapping)."""

    def valid_commands(self) -> list[str]: ...


@runtime_checkable
class SupportsHindsight(Protocol):
    """Optional: whether the current state would count as success for another task of the env (a goal
    reached on the way to this one), so a search's trees can be relabelled (engine/datasets/hindsight.py)."""

    def achieves(self, task: TaskSpec) -> bool: ...


@runtime_checkable
class SupportsRenaming(Protocol):
    """Optional: a text -> text swap of the env's entity names (items, rooms ...) for others, the same
    swap for the function's lifetime (one episode), so a trajectory can be shown in a renamed world."""

    def renamer(self, rng: random.Random) -> Callable[[str], str]: ...
