"""DAgger rounds of the tiny build: the model's own states, labelled by the expert (engine/llm/tiny_dagger)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.actions import CompositeAction, render
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import TextCraftExpert
from engine.llm.base import Completion, SampleRequest
from engine.llm.tiny import META_FILE, build_tiny_model, ensure_tiny_model
from engine.llm.tiny_dagger import dagger_rows
from engine.llm.tiny_data import validation_tasks
from tests.test_tiny_model import SMALL

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FixedActor:
    """A test double for the policy: the same composite action for every request."""

    name = "fixed"

    def __init__(self, command: str) -> None:
        self.text = render(CompositeAction("Check.", command, "Look."))
        self.requests: list[SampleRequest] = []

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        self.requests += requests
        return [[Completion(self.text)] for _ in requests]

    def logprobs(self, prompts, completions):  # pragma: no cover - not used by DAgger
        return [None] * len(prompts)


class ExpertActor(FixedActor):
    """A test double that plays the clean expert on its own env copies (stepped in lockstep with the
    ones under test), so it never leaves the expert's path."""

    def __init__(self, cfg, tasks) -> None:
        super().__init__("inventory")
        self.cfg, self.envs = cfg, {}
        for t in tasks:
            self.envs[t.goal] = TextCraftEnv()
            self.envs[t.goal].reset(t.id)

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        out = []
        for r in requests:
            text = r.prompt[1]["content"]
            env = self.envs[max((g for g in self.envs if g in text), key=len)]
            step = TextCraftExpert(env, 0.0, 0, compact=self.cfg.compact, chain=self.cfg.chain).act(
                first_step="Step 1:" in text)
            env.step(step.action.command)
            out.append([Completion(render(step.action))])
        return out


CFG = replace(SMALL, max_tasks=6, rename_fraction=0.0, dagger_max_steps=4, dagger_temperature=0.0)


def test_every_departed_state_is_labelled_with_the_experts_next_action() -> None:
    actor = FixedActor("inventory")  # never the expert's move: every state from step 1 on departs
    rows = dagger_rows(actor, CFG, 0, log=lambda _: None)
    assert len(rows) == 6 * CFG.dagger_max_steps and {r.kind for r in rows} == {"actor"}
    held_out = {t.id for t in validation_tasks(CFG.val_every)}
    assert not held_out & {r.task_id for r in rows}
    env = TextCraftEnv()
    for tid in dict.fromkeys(r.task_id for r in rows):
        env.reset(tid)  # "inventory" changes nothing: the label is the expert's move from the start
        mine = [r for r in rows if r.task_id == tid]
        for t, row in enumerate(mine):
            want = TextCraftExpert(env, 0.0, 0, compact=True, chain=True).act(first_step=t == 0).action
            assert row.answer == render(want)
            assert f"Step {t + 1}: give your composite action." in row.prompt[1]["content"]
            if t:  # the policy's own (wrong) moves are the history the label follows
                assert row.prompt[1]["content"].count("ACTION: inventory") == t
    assert all(r.params.seed is not None and r.params.grammar is not None for r in actor.requests)


def test_states_on_the_experts_path_are_not_added() -> None:
    held_out = {t.id for t in validation_tasks(CFG.val_every)}
    tasks = [t for t in TextCraftEnv().tasks("train") if t.id not in held_out][: CFG.max_tasks]
    assert dagger_rows(ExpertActor(CFG, tasks), CFG, 0, log=lambda _: None) == []


@pytest.mark.slow
def test_a_build_with_dagger_rounds_is_deterministic_and_records_them(tmp_path: Path) -> None:
    cfg = replace(SMALL, steps=40, dagger_rounds=1, dagger_steps=10, max_tasks=8, dagger_max_steps=3)
    a = ensure_tiny_model(tmp_path / "a", seed=0, config=cfg, log=lambda _: None)
    b = ensure_tiny_model(tmp_path / "b", seed=0, config=cfg, log=lambda _: None)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    (rnd,) = json.loads((a / META_FILE).read_text())["metrics"]["dagger"]
    assert rnd["rows"] > 0 and rnd["rows_total"] <= rnd["rows"] and rnd["rollout_seconds"] > 0
    base = ensure_tiny_model(tmp_path / "base", seed=0, config=replace(cfg, dagger_rounds=0), log=lambda _: None)
    wbase = load_file(base / "model.safetensors")
    assert not all(torch.equal(wa[k], wbase[k]) for k in wa)  # the round trained on
    # Only the round, on the finished first stage: the same folder as the whole build.
    c = build_tiny_model(tmp_path / "c", cfg, log=lambda _: None, base=base)
    wc = load_file(c / "model.safetensors")
    assert all(torch.equal(wa[k], wc[k]) for k in wa)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (a / name).read_bytes() == (c / name).read_bytes(), name
    with pytest.raises(ValueError, match="not a first-stage build"):
        build_tiny_model(tmp_path / "d", replace(cfg, lr=1e-3), log=lambda _: None, base=base)
    with pytest.raises(ValueError, match="not a first-stage build"):
        build_tiny_model(tmp_path / "e", cfg, log=lambda _: None, base=a)  # a build with rounds already
