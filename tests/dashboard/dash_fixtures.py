"""Fixture stores for the dashboard tests: small real searches (scripted generator, line env).

A module of its own (not conftest) so tests and the browser test can import it by name."""

from __future__ import annotations

from pathlib import Path

from doubles import ScriptedGenerator, SnapshotLineEnv

from engine.config import SearchConfig
from engine.envs.base import Step
from engine.search.runner import new_run
from engine.store import Store

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboard" / "app.py"
XSS = "<script>alert(1)</script>"


class XssLineEnv(SnapshotLineEnv):
    """The line env, but 'wait' answers with markup that must be shown as text, never run."""

    def step(self, command: str) -> Step:
        step = super().step(command)
        if command.strip().lower() == "wait":
            return Step(f"{XSS} **bold** [link](http://example.com) You wait at {self.pos}.",
                        step.reward, step.done, step.progress)
        return step


def build_store(path: Path) -> dict[str, str]:
    """Two runs; the second has three tasks with format errors and the XSS observation."""
    with Store(path) as store:
        env = XssLineEnv()
        first, _ = new_run(store, "line", env.tasks()[:1], ScriptedGenerator(), SearchConfig(simulations=3, k=2,
                           depth_limit=3), "small-run", make_env=XssLineEnv)
        second, _ = new_run(store, "line", env.tasks()[2:5], ScriptedGenerator(p_right=0.4, p_garbage=0.15),
                            SearchConfig(simulations=10, k=3, depth_limit=5, alpha=0.3), "fixture-run",
                            make_env=XssLineEnv)
    return {"small": first, "main": second}
