"""Env names -> env classes. `--env NAME` or `--env NAME:ARG` (the argument goes to the factory).

Built-ins are listed in BUILTIN; other packages add envs through the `orchard.envs` entry-point group
(name -> "module:Class", the class taking the optional ARG string). Adapters for third-party
simulators import their package only when used, so the core install never needs them.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import parse_qsl

from engine.envs.base import Env, EnvError, TaskSpec
from engine.paths import cache_dir  # noqa: F401 - the adapters' cache, re-exported for them

_RANGE = re.compile(r"^\d+$|^\d*:\d*(:\d*)?$")
ENTRY_POINT_GROUP = "orchard.envs"

BUILTIN = {
    "textcraft": "engine.envs.textcraft:TextCraftEnv",
    "scienceworld": "engine.envs.scienceworld:ScienceWorldEnv",
    "babyai": "engine.envs.babyai:BabyAIEnv",
    "textworld": "engine.envs.textworld_games:make_env",
    "agentgym": "engine.envs.agentgym:AgentGymEnv",
    "web": "engine.envs.web:WebEnv",
}

# Which pip extra provides each adapter's simulator (for a clear error when it is missing).
EXTRAS = {"scienceworld": "scienceworld", "babyai": "minigrid", "textworld": "textworld"}


def _plugins() -> dict[str, object]:
    """Entry points of the `orchard.envs` group, by name (built-in names win)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN}


def known_envs() -> list[str]:
    return sorted({*BUILTIN, *_plugins()})


def _load(name: str) -> Callable[..., Env]:
    target = BUILTIN.get(name)
    if target is None:
        ep = _plugins().get(name)
        if ep is None:
            raise EnvError(f"unknown env {name!r} (known: {', '.join(known_envs())})")
        try:
            return ep.load()  # type: ignore[attr-defined]
        except Exception as e:  # a broken plugin must not crash the CLI with a traceback
            raise EnvError(f"env {name!r}: could not load entry point {ep.value!r}: {e}") from e  # type: ignore
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        extra = EXTRAS.get(name)
        if extra is None or e.name is None or not e.name.startswith(extra):
            raise
        raise EnvError(
            f"env {name!r} needs the {extra!r} package: pip install -e '.[envs]' ({e})"
        ) from e


def env_factory(spec: str) -> Callable[[], Env]:
    """A zero-argument constructor for the env named by `spec` (EnvError if unknown)."""
    name, _, arg = spec.partition(":")
    cls = _load(name)
    if not arg:
        return cls
    try:
        inspect.signature(cls).bind(arg)
    except TypeError:
        raise EnvError(f"env {name!r} takes no argument (got {spec!r}; use --env {name})") from None
    except ValueError:  # no signature to inspect (a C type): let the call tell
        pass
    return lambda: cls(arg)


def split_options(arg: str, allowed: dict[str, type], env: str) -> tuple[str, dict[str, Any]]:
    """`MAIN?key=value&...` -> (MAIN, typed options); unknown keys or bad values raise EnvError.
    Booleans accept 1/0/true/false/yes/no. (Values are Any: each one's type is `allowed[key]`, which
    a static signature cannot say.)"""
    main, _, query = arg.partition("?")
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        kind = allowed.get(key)
        if kind is None:
            raise EnvError(f"{env}: unknown option {key!r} (known: {', '.join(sorted(allowed)) or 'none'})")
        try:
            if kind is bool:
                if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(value)
                options[key] = value.lower() in ("1", "true", "yes")
            else:
                options[key] = kind(value)
        except ValueError:
            raise EnvError(f"{env}: option {key}={value!r} is not a valid {kind.__name__}") from None
    return main, options


def select_tasks(env: Env, spec: str, split: str = "train") -> list[TaskSpec]:
    """Tasks by index range into a split ('0:16', '3', '0:100:5') or by ids ('train-1,train-4')."""
    tasks = env.tasks(split)
    spec = spec.strip()
    if not spec:
        raise EnvError("empty task selection (use e.g. --tasks 0:16)")
    if _RANGE.match(spec):
        parts = [int(p) if p else None for p in spec.split(":")]
        if len(parts) == 1:
            start = int(spec)  # the regex's first branch: digits only
            stop, step = start + 1, 1
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
