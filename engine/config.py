"""Typed configs. Configs are data: stored as JSON with every run, loadable from TOML/JSON files.

Unknown keys and out-of-range values are errors naming the field, never silently ignored.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or file is wrong; the message names the field (and file)."""


@dataclass(frozen=True)
class SearchConfig:
    """MCTS settings (docs/algorithms.md §2). Defaults are the papers'; unpublished values are ours."""

    simulations: int = 16  # T, per task
    k: int = 4  # candidates sampled per expansion
    c_exp: float = 1.0  # UCB1 exploration constant (eq. 7)
    depth_limit: int = 12  # D
    temperature: float = 1.0  # expansion sampling temperature
    rollout_temperature: float = 1.0  # 0 = greedy rollouts
    max_tokens: int = 256  # per composite action
    critic: bool = True  # AI process supervision on/off
    critic_mapping: str = "linear"  # rank -> Q^: "linear" (1 - r/(K-1)) or "reciprocal" (1/(r+1))
    critic_max_tokens: int = 128
    alpha: float = 0.5  # eq. 10 weight of Q~ against Q^
    selection_value: str = "mcts"  # value in UCB1: "mcts" (Q~) or "combined" (eq. 10 Q)
    success_threshold: float = 1.0  # a terminal reward at least this is a "success" leaf
    # What eq. 8 backs up: "reward" (the terminal R, the papers' default) or "progress" (the larger of R
    # and the latched progress the episode reached: a score in [0, 1] for envs whose success is rare).
    backup: str = "reward"
    trees_in_flight: int = 64  # trees advanced together; their LLM requests share one batch
    seed: int = 0

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


def to_dict(config: Any) -> dict[str, Any]:
    return asdict(config)


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build a config dataclass from a mapping; unknown keys and wrong types are ConfigErrors."""
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)} for {cls.__name__}")
    values = {}
    for name, value in data.items():
        default = getattr(cls, name, None)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ConfigError(f"{where}: field {name} must be true/false, got {value!r}")
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}: field {name} must be a number, got {value!r}")
            if isinstance(default, int) and not isinstance(default, bool) and float(value) != int(value):
                raise ConfigError(f"{where}: field {name} must be an integer, got {value!r}")
            value = type(default)(value)
        values[name] = value
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


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
