"""Typed configs. Configs are data: stored as JSON with every run, loadable from TOML/JSON files.

Unknown keys and out-of-range values are errors naming the field, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or file is wrong; the message names the field (and file)."""


@dataclass(frozen=True)
class SearchConfig:
    """MCTS settings (docs/algorithms.md §2). Defaults are the papers'; unpublished values are ours."""

    simulations: int = field(default=16, metadata={"help": "simulations per task, T"})
    k: int = field(default=4, metadata={"help": "candidates sampled per expansion"})
    c_exp: float = field(default=1.0, metadata={"help": "UCB1 exploration constant (eq. 7)"})
    depth_limit: int = field(default=12, metadata={"help": "depth limit, D"})
    temperature: float = field(default=1.0, metadata={"help": "expansion sampling temperature"})
    rollout_temperature: float = field(default=1.0, metadata={"help": "rollout temperature, 0 = greedy"})
    max_tokens: int = field(default=256, metadata={"help": "tokens per composite action"})
    critic: bool = True  # AI process supervision on/off
    critic_mapping: str = "linear"  # rank -> Q^: "linear" (1 - r/(K-1)) or "reciprocal" (1/(r+1))
    critic_max_tokens: int = 128
    value_model: str = field(default="", metadata={
        "help": "a value-model folder (trained by engine/train/value_model.py): with the critic on, Q^ of each candidate is "
                "its predicted value instead of the policy's ranking; empty = the policy critic"})
    alpha: float = field(default=0.5, metadata={"help": "eq. 10 weight of the MCTS value Q~ against the critic's Q^"})
    selection_value: str = "mcts"  # value in UCB1: "mcts" (Q~) or "combined" (eq. 10 Q)
    success_threshold: float = 1.0  # a terminal reward at least this is a "success" leaf
    # What eq. 8 backs up: "reward" (the terminal R, the papers' default) or "progress" (the larger of R
    # and the latched progress the episode reached: a score in [0, 1] for envs whose success is rare).
    backup: str = field(default="reward", metadata={
        "help": "value backed up (eq. 8): the terminal reward, or max(reward, latched progress)",
        "choices": ("reward", "progress")})
    trees_in_flight: int = field(default=64, metadata={
        "help": "trees advanced together; their LLM requests share one batch"})
    seed: int = field(default=0, metadata={"help": "search seed"})
    constrained: bool = field(default=False, metadata={
        "help": "decode the actor's composite actions under their grammar, commands from the env's own pattern "
                "(engine/grammar.py; HF and vLLM backends)"})

    def __post_init__(self) -> None:
        checks = {
            "simulations": self.simulations >= 1,
            "k": self.k >= 1,
            "c_exp": self.c_exp >= 0,
            "depth_limit": self.depth_limit >= 1,
            "temperature": self.temperature >= 0,
            "rollout_temperature": self.rollout_temperature >= 0,
            "max_tokens": self.max_tokens >= 1,
            "critic_mapping": self.critic_mapping in ("linear", "reciprocal"),
            "critic_max_tokens": self.critic_max_tokens >= 1,
            "alpha": 0.0 <= self.alpha <= 1.0,
            "selection_value": self.selection_value in ("mcts", "combined"),
            "backup": self.backup in ("reward", "progress"),
            "trees_in_flight": self.trees_in_flight >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"SearchConfig.{name}: invalid value {getattr(self, name)!r}")
        if self.value_model.strip() != self.value_model:
            raise ConfigError(f"SearchConfig.value_model: leading or trailing spaces in {self.value_model!r}")
        if self.value_model and not self.critic:
            raise ConfigError("SearchConfig.value_model: set, but critic is off (the value model is a critic: "
                              "turn critic on, or leave value_model empty)")


def to_dict(config: Any) -> dict[str, Any]:
    return asdict(config)


def from_dict(cls: type[T], data: Any, where: str = "config") -> T:
    """Build a config dataclass from a mapping (a parsed TOML/JSON table, a stored config, CLI flags).

    The one loader of every config dataclass: each value is checked against its field's annotation
    (bool, int, float, str, `X | None`, `Literal[...]`, `tuple[X, ...]`, `list[X]`, `dict[K, V]`,
    nested config dataclasses; `Any` takes anything), a JSON list becomes a tuple where the field is
    one, an integral float an int; unknown keys are named. Every failure is one ConfigError line
    starting with `where` (the file, or what the data is) and naming the field.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a table of {cls.__name__} settings, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(map(str, unknown))} for {cls.__name__}")
    missing = [name for name, f in known.items() if name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)} for {cls.__name__}")
    hints = _field_types(cls)
    values = {name: _coerce(value, hints[name], where, name) for name, value in data.items()}
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _field_types(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except NameError as e:  # an annotation naming a TYPE_CHECKING-only class: a bug in the config class
        raise TypeError(f"{cls.__name__}: field annotations must be resolvable at run time ({e})") from None


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple or origin is list:
        return f"a list of {_describe(args[0])}" if args else "a list"
    if origin is dict or tp is dict:
        return "a table"
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


class _Mismatch(Exception):
    """A value does not fit a type (internal: turned into one ConfigError line by `_coerce`)."""


def _coerce(value: Any, tp: Any, where: str, name: str) -> Any:
    try:
        return _fit(value, tp, where, name)
    except _Mismatch:
        raise ConfigError(f"{where}: field {name} must be {_describe(tp)}, got {value!r}") from None


def _fit(value: Any, tp: Any, where: str, name: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise _Mismatch
    if origin in (Union, types.UnionType):
        for option in sorted(args, key=lambda a: a is not type(None)):  # None first: no coercion into it
            try:
                return _fit(value, option, where, name)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int or tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Mismatch
        if tp is int:
            if not math.isfinite(value) or float(value) != int(value):
                raise _Mismatch
            return int(value)
        return float(value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if origin is tuple or origin is list:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):  # tuple[X, Y]: fixed
            if len(value) != len(args):
                raise _Mismatch
            items = [_fit(v, a, where, name) for v, a in zip(value, args, strict=True)]
        else:
            items = [_fit(v, args[0], where, name) for v in value] if args else list(value)
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch
        if len(args) == 2:
            return {_fit(k, args[0], where, name): _fit(v, args[1], where, name) for k, v in value.items()}
        return dict(value)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, where=f"{where}: {name}")
        raise _Mismatch
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _Mismatch
    return value


def config_fields(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help) of a config dataclass's fields: help from each field's metadata (the
    CLI's flags read the same), else the `# comment` after it in its source (the dashboard's forms
    show every setting without a hand-copied list)."""
    import inspect
    import re

    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        source = ""
    comments = dict(re.findall(r"^\s+(\w+):[^=\n]*=[^#\n]*#\s*(.+)$", source, re.MULTILINE))
    return [(f.name, f.default, str(f.metadata.get("help") or comments.get(f.name, "")).strip()) for f in fields(cls)]


def read_table(path: str | Path, section: str | None = None) -> dict[str, Any]:
    """The settings in a .toml or .json file: its `[section]` table where it has one, else the top
    level. Unreadable files, bad syntax and anything but a table are ConfigErrors naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {e}") from None
    if isinstance(data, dict) and section is not None and isinstance(data.get(section), dict):
        data = data[section]
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a table of settings, got {type(data).__name__}")
    return data


def load_file(cls: type[T], path: str | Path) -> T:
    """Load a config from a .toml or .json file (a `[search]` table or the top level)."""
    data = read_table(path, "search" if cls is SearchConfig else None)
    return from_dict(cls, data, where=str(path))
