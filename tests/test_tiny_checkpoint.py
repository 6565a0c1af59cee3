"""The shipped tiny checkpoint: it verifies and loads with no build, a damaged or mismatched copy is
refused in one line naming the rebuild command, and (slow) it meets its stated numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.actions import CompositeAction, parse
from engine.envs.textcraft import TextCraftEnv
from engine.llm import tiny_checkpoint
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.tiny_checkpoint import (
    MANIFEST,
    MAX_BYTES,
    SHIPPED_DIR,
    CheckpointError,
    tiny_model_dir,
    verify,
)
from engine.prompts import actor_prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_shipped_checkpoint_verifies_and_loads_without_a_build() -> None:
    manifest = verify(SHIPPED_DIR)
    assert (SHIPPED_DIR / "model.safetensors").stat().st_size <= MAX_BYTES
    assert manifest["rebuild"] == tiny_checkpoint.REBUILD and manifest["stated"]
    assert tiny_model_dir(log=pytest.fail) == SHIPPED_DIR  # no build message, no build
    gen = HFGenerator(SHIPPED_DIR, device="cpu", name="tiny", num_threads=1)
    env = TextCraftEnv()
    task = env.tasks("test")[0]
    prompt = actor_prompt(env.describe(), task.goal, task.context, [], env.reset(task.id))
    (completion,) = gen.sample([SampleRequest(prompt, params=SamplingParams(temperature=0.0, max_tokens=160))])[0:1]
    assert isinstance(parse(completion[0].text), CompositeAction)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "textcraft-tiny"
    shutil.copytree(SHIPPED_DIR, dst)
    return dst


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(CheckpointError) as info:
        verify(path)
    message = str(info.value)
    assert "\n" not in message and "python -m engine.llm.tiny_checkpoint --out" in message
    assert str(path) in message
    for needle in needles:
        assert needle in message
    return message


def test_a_changed_weight_file_is_refused(copy: Path) -> None:
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    _refused(copy, "model.safetensors", "sha256", "does not match")


def test_a_missing_file_or_manifest_is_refused(copy: Path) -> None:
    (copy / "tokenizer.json").unlink()
    _refused(copy, "tokenizer.json is missing")
    (copy / MANIFEST).unlink()
    _refused(copy, f"{MANIFEST} is missing")


def test_another_config_is_refused(copy: Path) -> None:
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["config"]["steps"] += 1
    (copy / MANIFEST).write_text(json.dumps(manifest))
    _refused(copy, "another config", "steps")


def test_a_garbled_manifest_is_refused(copy: Path) -> None:
    (copy / MANIFEST).write_text("{not json")
    _refused(copy, "unreadable")


def test_the_cli_refuses_a_damaged_shipped_checkpoint_in_one_line(
    copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli import main

    (copy / "config.json").write_text("{}")
    monkeypatch.setattr(tiny_checkpoint, "SHIPPED_DIR", copy)
    code = main(["eval", "--model", "tiny", "--split", "test", "--tasks", "0:1", "--db", str(copy.parent / "o.db")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "config.json" in err and "sha256" in err and "python -m engine.llm.tiny_checkpoint" in err


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_shipped_checkpoint_meets_its_stated_numbers_on_a_fixed_sample() -> None:
    """Greedy on a fixed third of the held-out test tasks (every third), the README's settings, without
    and with constrained decoding."""
    from engine.evaluate import EvalConfig, evaluate

    stated = verify(SHIPPED_DIR)["stated"]["sample"]
    tasks = TextCraftEnv().tasks("test")[:: stated["every"]]
    gen = HFGenerator(SHIPPED_DIR, device="cpu", name="tiny", num_threads=1)
    config = EvalConfig(mode="greedy", max_steps=stated["max_steps"], max_tokens=stated["max_tokens"], bootstrap=0)
    metrics = evaluate(gen, TextCraftEnv, tasks, config).metrics
    assert metrics["tasks"] == stated["tasks"]
    assert metrics["success"]["mean"] >= stated["success_at_least"]
    assert metrics["progress"]["mean"] >= stated["progress_at_least"]
    assert metrics["format_error_rate"] <= stated["format_errors_at_most"]
    constrained = evaluate(gen, TextCraftEnv, tasks, EvalConfig(**{**config.__dict__, "constrained": True})).metrics
    assert constrained["success"]["mean"] >= stated["constrained_success_at_least"]
    assert constrained["progress"]["mean"] >= stated["constrained_progress_at_least"]
    assert constrained["format_error_rate"] <= stated["format_errors_at_most"]
