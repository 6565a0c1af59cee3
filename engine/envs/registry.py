"""Env names -> env classes. `--env NAME` or `--env NAME:ARG` (the argument goes to the factory).

Built-ins are listed here; the env adapters issue adds third-party registration via entry points.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from engine.envs.base import Env, EnvError, TaskSpec

_RANGE = re.compile(r"^\d+$|^\d*:\d*(:\d*)?$")

BUILTIN = {
    "textcraft": "engine.envs.textcraft:TextCraftEnv",
}


def env_factory(spec: str) -> Callable[[], Env]:
    """A zero-argument constructor for the env named by `spec` (EnvError if unknown)."""
    name, _, arg = spec.partition(":")
    target = BUILTIN.get(name)
    if target is None:
        raise EnvError(f"unknown env {name!r} (known: {', '.join(sorted(BUILTIN))})")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    return (lambda: cls(arg)) if arg else cls


def select_tasks(env: Env, spec: str, split: str = "train") -> list[TaskSpec]:
    """Tasks by index range into a split ('0:16', '3', '0:100:5') or by ids ('train-1,train-4')."""
    tasks = env.tasks(split)
    spec = spec.strip()
    if not spec:
        raise EnvError("empty task selection (use e.g. --tasks 0:16)")
    if _RANGE.match(spec):
        parts = [int(p) if p else None for p in spec.split(":")]
        if len(parts) == 1:
            start, stop, step = parts[0], parts[0] + 1, 1
        else:
            start = parts[0] or 0
            stop = parts[1] if parts[1] is not None else len(tasks)
            step = parts[2] if len(parts) == 3 and parts[2] is not None else 1
        if stop <= start or step < 1:
            raise EnvError(f"bad task range {spec!r} (need START < STOP and STEP >= 1)")
        if stop > len(tasks):
            raise EnvError(f"task range {spec!r} is out of range: the {split} split has {len(tasks)} tasks")
        return tasks[start:stop:step]
    if ":" in spec:
        raise EnvError(f"bad task range {spec!r} (expected START:STOP[:STEP] with non-negative integers)")
    by_id = {t.id: t for t in tasks}
    chosen = []
    for tid in (p.strip() for p in spec.split(",")):
        if tid not in by_id:
            raise EnvError(f"unknown task id {tid!r} in the {split} split")
        chosen.append(by_id[tid])
    return chosen
