"""The tiny offline model: training rows, deterministic build, cache, round trip (the shipped
checkpoint and its stated numbers: test_tiny_checkpoint.py)."""

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
from engine.envs.textcraft_names import item_words
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.tiny import (
    META_FILE,
    MORE_FILE,
    TinyConfig,
    _texts,
    default_tiny_dir,
    encode_rows,
    ensure_tiny_model,
    train_more,
    train_tokenizer,
)
from engine.llm.tiny_data import Row, build_rows, validation_tasks
from engine.prompts import parse_critic_choice, parse_judgement

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The shipped recipe's data settings (compact texts, ...) on a model and build small enough to train in
# a few seconds: it learns the answer format on its few short training rows (no more).
SMALL = replace(
    TinyConfig(),
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
    warmup_steps=15,
    lr=3e-3,
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
    cfg = replace(SMALL, max_tasks=1, noise=0.5, rename_fraction=0.0, episodes_per_task=1)
    rows = [r for r in build_rows(cfg) if r.kind == "actor"]
    env = TextCraftEnv()
    task = env.tasks("train")[0]
    env.reset(task.id)
    expert = TextCraftExpert(env, cfg.noise, f"{task.id}/{cfg.seed}/0", compact=cfg.compact, chain=cfg.chain)
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


@pytest.mark.slow
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


@pytest.mark.slow  # its fixture trains a small model (46 s of the default suite's wall in a fresh clone)
def test_train_more_runs_the_builds_own_round_beside_its_rows_and_the_control_without_extra(
    small_model: Path, tmp_path: Path
) -> None:
    """train_more: the build's rows regenerated from its stored config plus the extra rows x copies, at the
    DAgger round's lr, a record beside the weights (not the build's META_FILE: these are not its weights);
    deterministic, and the control (no extra rows) trains other weights than the arm with them."""
    extra = [Row([{"role": "user", "content": "Goal: craft 1 stick"}], "ACTION: inventory", "actor", "train-0")]
    arm = train_more(small_model, extra, tmp_path / "arm", copies=3, steps=4, log=lambda _: None)
    train_more(small_model, extra, tmp_path / "again", copies=3, steps=4, log=lambda _: None)
    control = train_more(small_model, [], tmp_path / "control", steps=4, lr=1e-5, log=lambda _: None)
    own = len(build_rows(SMALL))
    assert arm["extra_rows"] == arm["extra_rows_kept"] == 1 and arm["copies"] == 3 and arm["steps"] == 4
    assert arm["lr"] == SMALL.dagger_lr
    assert 0 < arm["build_rows"] <= own and control["extra_rows"] == 0 and control["lr"] == 1e-5
    assert json.loads((tmp_path / "arm" / MORE_FILE).read_text())["base"] == str(small_model)
    assert not (tmp_path / "arm" / META_FILE).exists()
    base, a = load_file(small_model / "model.safetensors"), load_file(tmp_path / "arm" / "model.safetensors")
    b, c = load_file(tmp_path / "again" / "model.safetensors"), load_file(tmp_path / "control" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], base[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)
    assert HFGenerator(tmp_path / "arm", device="cpu", name="more").tokenizer.eos_token == "<|im_end|>"
    alone = train_more(small_model, extra, tmp_path / "alone", steps=2, own_rows=False, log=lambda _: None)
    assert alone["build_rows"] == 0 and alone["extra_rows_kept"] == 1
    with pytest.raises(ValueError, match="needs extra rows"):
        train_more(small_model, [], tmp_path / "x", steps=1, own_rows=False, log=lambda _: None)
    with pytest.raises(ValueError, match="not a tiny build"):
        train_more(tmp_path / "control", [], tmp_path / "x", steps=1, log=lambda _: None)


@pytest.mark.slow  # its fixture trains a small model: about a minute on a loaded 2-core machine
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


def test_validation_tasks_are_held_out_of_the_rows() -> None:
    val = {t.id for t in validation_tasks(10)}
    assert len(val) == len(TextCraftEnv().tasks("train")) // 10 and all(v.startswith("train-") for v in val)
    rows = build_rows(replace(SMALL, max_tasks=None, val_every=10, critic_fraction=0, judge_fraction=0))
    seen = {r.task_id for r in rows}
    assert not seen & val and len(seen) == len(TextCraftEnv().tasks("train")) - len(val)


def test_the_recipes_rows_for_goals_it_left_out_cover_those_goals_only() -> None:
    """The bench's expert-* oracles: the build's recipe applied to other goals (held-out val goals here)."""
    cfg = replace(SMALL, max_tasks=None, val_every=10, critic_fraction=0, judge_fraction=0)
    left_out = validation_tasks(10)[:5]
    rows = build_rows(cfg, left_out)
    assert {r.task_id for r in rows} == {t.id for t in left_out}
    assert rows == build_rows(cfg, left_out)  # deterministic
    assert build_rows(cfg, []) == []


@pytest.mark.slow
def test_the_default_recipe_keeps_its_actor_rows() -> None:
    """Regression: the first recipe dropped rows over 512 tokens, i.e. 39% of the actor steps and
    every step after the 8th, so the model had never seen the long prompts of late steps. Now only
    a few renamed rows (long swapped names) pass the limit."""
    cfg = TinyConfig()
    rows = build_rows(cfg)
    tok = train_tokenizer([t for r in rows for t in _texts(r)], cfg.vocab_size, item_words())
    actor = [r for r in rows if r.kind == "actor"]
    kept = [len(e.ids) <= cfg.max_row_tokens for e in encode_rows(actor, tok)]
    assert sum(kept) >= 0.995 * len(actor)


def test_compact_expert_texts_are_short_and_keep_the_five_parts() -> None:
    env = TextCraftEnv()
    task = env.tasks("train")[100]
    env.reset(task.id)
    full = TextCraftExpert(env, 0.0, 0).act(first_step=True).action
    short = TextCraftExpert(env, 0.0, 0, compact=True).act(first_step=True).action
    assert short.command == full.command and short.plan and short.thought and short.explanation
    assert len(render(short)) < 0.7 * len(render(full))
    assert parse(render(short)) == short
    assert all(" using " not in line for line in short.plan.splitlines())  # the recipes are in the task


def test_chain_expert_plans_with_the_tasks_own_commands_and_reasons_from_the_goal() -> None:
    env = TextCraftEnv()
    task = next(t for t in env.tasks("train") if t.meta["depth"] == 3)
    env.reset(task.id)
    expert = TextCraftExpert(env, 0.0, 0, compact=True, chain=True)
    first = expert.act(first_step=True).action
    goal = task.goal.removeprefix("craft 1 ")
    lines = [line.split(". ", 1)[1] for line in first.plan.splitlines()]
    assert len(lines) >= 2 and lines[0].startswith("craft ") and f" {goal} using " in lines[0]  # goal first
    assert all(line in task.context.splitlines() for line in lines)  # copied from the crafting commands
    assert first.thought.startswith(f"{goal} <- ")
    assert parse(render(first)) == first
