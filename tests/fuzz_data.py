"""Hostile inputs kept as data under tests/data/fuzz/ (see each file's "about"), built into test cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parent / "data" / "fuzz"


def _build(parts: list) -> str:
    return "".join(p if isinstance(p, str) else p[0] * p[1] for p in parts)


def model_outputs() -> list:
    """pytest params (id = case name) of hostile model answers / server reply bodies."""
    cases = json.loads((FUZZ / "model_outputs.json").read_text(encoding="utf-8"))["cases"]
    return [pytest.param(_build(c["parts"]), id=c["name"]) for c in cases]


def _value(v: object) -> object:
    return float(v["float"]) if isinstance(v, dict) else v


def env_rewards() -> list:
    """pytest params (id = case name) of (reward, progress, expect) an env may return."""
    cases = json.loads((FUZZ / "env_rewards.json").read_text(encoding="utf-8"))["cases"]
    return [pytest.param(_value(c["reward"]), _value(c["progress"]), c["expect"], id=c["name"]) for c in cases]
