"""The environment protocol every env (built-in or adapter) implements.

Tiny on purpose, Gymnasium-style, text in and text out. Search needs exactly this: reset to a task,
step a command, and restore a state — through `snapshot()/restore()` when the env offers them,
otherwise by replaying the commands from `reset` (envs must be deterministic per task id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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
    """What one command did. `reward` is in [0, 1]; `progress` (latched, never decreasing) too."""

    observation: str
    reward: float = 0.0
    done: bool = False
    progress: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


class EnvError(ValueError):
    """Bad use of an env (unknown task id, step before reset): a clear message, not a traceback."""


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

    def step(self, command: str) -> Step: ...


@runtime_checkable
class SupportsSnapshot(Protocol):
    """Optional: a cheap copy of the env's state (must not alias later mutations)."""

    def snapshot(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


@runtime_checkable
class SupportsValidCommands(Protocol):
    """Optional: the commands that are valid now (offered to prompts, used for snapping)."""

    def valid_commands(self) -> list[str]: ...
