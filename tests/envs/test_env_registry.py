"""The env registry: new built-in names, NAME:ARG?options, and third-party envs via entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from doubles import LineEnv

from engine.envs import registry
from engine.envs.base import EnvError


def test_builtin_names_and_unknown_env() -> None:
    assert {"textcraft", "scienceworld", "babyai", "textworld", "agentgym"} <= set(registry.known_envs())
    with pytest.raises(EnvError, match="unknown env 'nope'.*known: .*babyai"):
        registry.env_factory("nope:x")


def test_entry_point_plugins(monkeypatch) -> None:
    eps = [EntryPoint("line", "doubles:LineEnv", registry.ENTRY_POINT_GROUP),
           EntryPoint("broken", "no_such_module_xyz:Env", registry.ENTRY_POINT_GROUP),
           EntryPoint("textcraft", "doubles:LineEnv", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: [e for e in eps if e.group == group])
    assert "line" in registry.known_envs()
    env = registry.env_factory("line")()
    assert isinstance(env, LineEnv) and env.reset("goal-2").startswith("You are at 0")
    assert not isinstance(registry.env_factory("textcraft")(), LineEnv)  # built-ins win
    with pytest.raises(EnvError, match="could not load entry point 'no_such_module_xyz:Env'"):
        registry.env_factory("broken")


def test_split_options() -> None:
    allowed = {"n": int, "snap": bool, "mode": str}
    assert registry.split_options("boil?n=3&snap=no&mode=x", allowed, "e") == ("boil", {"n": 3, "snap": False,
                                                                                       "mode": "x"})
    assert registry.split_options("", allowed, "e") == ("", {})
    with pytest.raises(EnvError, match="e: unknown option 'speed'"):
        registry.split_options("a?speed=1", allowed, "e")
    with pytest.raises(EnvError, match="option n='many' is not a valid int"):
        registry.split_options("a?n=many", allowed, "e")
    with pytest.raises(EnvError, match="not a valid bool"):
        registry.split_options("a?snap=maybe", allowed, "e")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ORCHARD_CACHE", str(tmp_path / "c"))
    assert registry.cache_dir("x", "y") == tmp_path / "c" / "x" / "y" and (tmp_path / "c" / "x" / "y").is_dir()
    monkeypatch.delenv("ORCHARD_CACHE")
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "h"))
    assert registry.cache_dir("x") == tmp_path / "h" / "cache" / "x"


def test_missing_simulator_package_is_a_clear_error(monkeypatch) -> None:
    real = registry.importlib.import_module

    def fake(name: str):
        if name == "engine.envs.babyai":
            raise ModuleNotFoundError("No module named 'minigrid'", name="minigrid")
        return real(name)

    monkeypatch.setattr(registry.importlib, "import_module", fake)
    with pytest.raises(EnvError, match=r"needs the 'minigrid' package: pip install -e '.\[envs\]'"):
        registry.env_factory("babyai:GoToLocal")
