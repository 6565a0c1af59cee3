"""Command-line flags generated from config dataclass fields (TRL's `field(metadata={"help": ...})`).

A flag's type, choices and help come from its field, and its help shows the dataclass default, so a
default lives in exactly one place: every generated flag defaults to None ("not given"), and the
command passes only the flags given as overrides to `engine.config.from_dict`. Fields whose values
are lists (tuples) take a comma-separated string, which the command parses (so a bad item is one
ConfigError line naming the flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def _plain(tp: Any) -> Any:
    """`X | None` -> X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp


def default_help(cls: type, name: str) -> str:
    """The field's help with its default: `simulations per task, T (default 16)`."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    text = f.metadata.get("help", "")
    default = _default(f)
    if default is not None and default != "" and not isinstance(default, bool):
        text = f"{text} (default {_show(default)})" if text else f"default {_show(default)}"
    return text.replace("%", "%%")


def add_flags(parser: argparse.ArgumentParser, cls: type, spec: dict[str, str]) -> None:
    """Add one flag per field: `spec` maps field name -> flag (`{"depth_limit": "--depth"}`)."""
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for name, flag in spec.items():
        f = by_name[name]
        tp = _plain(hints[name])
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": default_help(cls, name)}
        if tp is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = tp if tp in (int, float, str) else str
            choices = f.metadata.get("choices") or (typing.get_args(tp) if typing.get_origin(tp) is Literal else None)
            if choices:
                kwargs["choices"] = tuple(choices)
        parser.add_argument(flag, **kwargs)


def given(args: argparse.Namespace, spec: dict[str, str]) -> dict[str, Any]:
    """The flags of `spec` that were given, by field name (the overrides of a config)."""
    return {name: getattr(args, name) for name in spec if getattr(args, name, None) is not None}
