"""The tiny offline model: training rows, deterministic build, cache, round trip, and (slow) that
the real build is a weak but non-trivial TextCraft policy on held-out tasks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.actions import CompositeAction, parse, render
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import TextCraftExpert
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.tiny import (
    META_FILE,
    TinyConfig,
    default_tiny_dir,
    encode_rows,
    ensure_tiny_model,
    rollout_outcomes,
    tiny_generator,
)
from engine.llm.tiny_data import build_rows
from engine.prompts import parse_critic_choice, parse_judgement

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Builds in a few seconds: it learns the answer format on its few short training rows (no more).
SMALL = TinyConfig(
    max_tasks=40,
    episodes_per_task=1,
    max_row_tokens=320,
    vocab_size=1024,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=128,
    steps=400,
    batch_tokens=1024,
)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", seed=0, config=SMALL, log=lambda _: None
    )


def test_rows_are_train_only_and_well_formed() -> None:
    rows = build_rows(replace(SMALL, max_tasks=60))
    assert {r.kind for r in rows} == {"actor", "critic", "judge"}
    assert all(r.task_id.startswith("train-") for r in rows)
    for r in rows:
        if r.kind == "actor":
            action = parse(r.answer)
            assert isinstance(action, CompositeAction) and render(action) == r.answer
        elif r.kind == "critic":
            n = r.prompt[1]["content"].count("\n[")
            assert 2 <= n <= 4 and parse_critic_choice(r.answer, n) is not None
        else:
            assert parse_judgement(r.answer) in ("Good", "Bad")
    verdicts = {parse_judgement(r.answer) for r in rows if r.kind == "judge"}
    assert verdicts == {"Good", "Bad"}


def test_actor_targets_are_the_expert_steps_never_its_mistakes() -> None:
    """Replay the noisy expert of the first task: its correct steps are the actor targets, in
    order, and its deliberate mistakes appear only in later prompts' history."""
    cfg = replace(SMALL, max_tasks=1, noise=0.5)
    rows = [r for r in build_rows(cfg) if r.kind == "actor"]
    env = TextCraftEnv()
    task = env.tasks("train")[0]
    env.reset(task.id)
    expert = TextCraftExpert(env, cfg.noise, f"{task.id}/{cfg.seed}/0")
    good, mistakes = [], []
    for t in range(30):
        step = expert.act(first_step=t == 0)
        (mistakes if step.is_mistake else good).append(step.action.command)
        if env.step(step.action.command).done:
            break
    assert mistakes, "noise 0.5 should produce at least one mistake on this task"
    targets = [parse(r.answer) for r in rows]
    assert [a.command for a in targets if isinstance(a, CompositeAction)] == good
    last_prompt = rows[-1].prompt[1]["content"]
    assert all(f"ACTION: {m}" in last_prompt for m in mistakes)


def test_build_is_deterministic_and_cached(small_model: Path, tmp_path: Path) -> None:
    again = ensure_tiny_model(tmp_path / "again", seed=0, config=SMALL, log=lambda _: None)
    a, b = load_file(small_model / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (small_model / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()

    logs: list[str] = []
    assert ensure_tiny_model(again, seed=0, config=SMALL, log=logs.append) == again
    assert logs == []  # same config: reused, not rebuilt
    meta = json.loads((again / META_FILE).read_text())
    assert meta["config"]["seed"] == 0 and meta["metrics"]["final_loss"] < meta["metrics"]["first_loss"]

    other = ensure_tiny_model(again, seed=1, config=replace(SMALL, steps=2), log=logs.append)
    assert logs and json.loads((other / META_FILE).read_text())["config"]["seed"] == 1
    c = load_file(other / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_round_trip_and_generated_actions_parse(small_model: Path) -> None:
    gen = HFGenerator(small_model, device="cpu", name="tiny")
    tok = gen.tokenizer
    assert tok.padding_side == "left" and tok.pad_token == "<|pad|>" and tok.eos_token == "<|im_end|>"
    assert "{% generation %}" in tok.chat_template  # TRL's assistant-only loss needs the markers
    rows = [r for r in build_rows(SMALL) if r.kind == "actor"]
    trained = [
        r for r, e in zip(rows, encode_rows(rows, tok), strict=True) if len(e.ids) <= SMALL.max_row_tokens
    ]
    params = SamplingParams(temperature=0.0, max_tokens=256)
    out = gen.sample([SampleRequest(r.prompt, params=params) for r in trained[:8]])
    parsed = [parse(cs[0].text) for cs in out]
    assert sum(isinstance(p, CompositeAction) for p in parsed) >= len(parsed) // 2
    # What the model generated is what it scores: sampled log-probs re-score (EOS-ended answers).
    ended = [
        (r.prompt, cs[0]) for r, cs in zip(trained[:8], out, strict=True) if cs[0].finish_reason == "stop"
    ]
    assert ended
    rescored = gen.logprobs([p for p, _ in ended], [c.text for _, c in ended])
    assert all(abs(c.logprob - s) < 1e-3 for (_, c), s in zip(ended, rescored, strict=True))  # type: ignore[operator]


def test_default_dir_respects_orchard_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path))
    assert default_tiny_dir() == tmp_path / "models" / "tiny"
    monkeypatch.delenv("ORCHARD_HOME")
    assert default_tiny_dir().parts[-3:] == ("data", "models", "tiny")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # builds the real model when not cached: ~4 min idle, far longer beside other tests
def test_real_tiny_model_is_weak_but_not_trivial() -> None:
    """The shipped config: solves some held-out (test split) tasks greedily, fails others."""
    gen = tiny_generator(device="cpu")
    assert gen.name == "tiny"
    test_ids = [t.id for t in TextCraftEnv().tasks("test")]
    outcomes = rollout_outcomes(gen, TextCraftEnv, test_ids, max_steps=15)
    assert any(outcomes.values()) and not all(outcomes.values())
    assert ensure_tiny_model(default_tiny_dir()) == default_tiny_dir()  # cached now
