"""SFT with per-turn loss masks: masked turns get exactly zero gradient, trained turns do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from doubles import action_text
from tiny_model_fixture import build_tiny_model

from engine.datasets.samples import Sample, Task, Turn
from engine.llm.tokens import encode_prompt
from engine.prompts import actor_prompt
from engine.train.common import TRAIN_META, TrainError
from engine.train.sft import SFTTrainConfig, build_trainer, mix_revisions, rft_config, sft_rows, train_sft


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-sft"))


def _sample(sid: str = "s1", kind: str = "revision") -> Sample:
    """Trained, UNtrained (a mistake), trained, trained."""
    task = Task(id="goal-3", goal="reach position 3", context="commands: left, right, wait",
                first_observation="You are at 0.", system="You are an agent.")
    return Sample(id=sid, kind=kind, task=task, turns=(
        Turn(action_text("right"), "You are at 1.", True),
        Turn(action_text("left"), "You are at 0.", False),
        Turn(action_text("wait"), "You are at 0.", True),
        Turn(action_text("right", "SUCCESS"), None, True),
    ))


def _cfg(**kw) -> SFTTrainConfig:
    return SFTTrainConfig.for_cpu(**{"max_steps": 2, "batch_size": 4, "learning_rate": 1e-3, **kw})


def _hidden_grad(trainer, batch: dict) -> torch.Tensor:
    """Gradient of the loss w.r.t. the final hidden states (the LM head's input): position t's row
    is what the prediction of token t + 1 contributes."""
    captured = {}

    def hook(module, inputs, output):
        output.retain_grad()
        captured["h"] = output

    model = trainer.model
    handle = model.model.norm.register_forward_hook(hook)
    try:
        model.train()
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
    finally:
        handle.remove()
    return captured["h"].grad[0]


@pytest.mark.parametrize("fmt", ["chat", "steps"])
def test_masked_turns_receive_zero_gradient(model_dir: Path, fmt: str) -> None:
    trainer, tok, rows = build_trainer(model_dir, [_sample()], _cfg(format=fmt, batch_size=1))
    bad = tok(action_text("left"), add_special_tokens=False)["input_ids"]
    checked_bad = 0
    for row in trainer.train_dataset:
        ids, labels = row["input_ids"], row["labels"]
        mask = next(r["assistant_masks"] for r in rows if r["input_ids"] == ids)
        assert [lab != -100 for lab in labels] == [bool(m) for m in mask]  # TRL's labels follow the masks
        batch = trainer.data_collator([row])
        grad = _hidden_grad(trainer, batch)
        norms = grad.norm(dim=-1)
        for t in range(len(ids) - 1):  # row t predicts token t + 1
            if mask[t + 1]:
                assert norms[t] > 0, f"trained token {t + 1} got no gradient"
            else:
                assert norms[t] == 0, f"masked token {t + 1} got gradient {norms[t]}"
        # the masked mistake's tokens are in the sequence (as context) but never targets
        for start in range(len(ids) - len(bad) + 1):
            if ids[start : start + len(bad)] == bad:
                assert not any(mask[start : start + len(bad)])
                checked_bad += 1
        trainer.model.zero_grad()
    assert checked_bad >= 1


def test_step_rows_use_the_inference_prompt_and_skip_untrained_turns(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from engine.actions import parse
    from engine.prompts import HistoryStep

    tok = AutoTokenizer.from_pretrained(model_dir)
    sample = _sample()
    rows = sft_rows([sample], tok, "steps")
    assert [r["id"] for r in rows] == ["s1:0", "s1:2", "s1:3"]  # the mistake (turn 1) gets no row
    history = [HistoryStep(parse(t.text), t.observation or "") for t in sample.turns[:2]]
    prompt = actor_prompt("", sample.task.goal, sample.task.context, history, "You are at 0.")
    prompt[0] = {"role": "system", "content": sample.task.system}
    p_ids = encode_prompt(tok, prompt)
    row = rows[1]
    assert row["input_ids"][: len(p_ids)] == p_ids  # turn 2 sees the mistake in its history
    assert row["assistant_masks"] == [0] * len(p_ids) + [1] * (len(row["input_ids"]) - len(p_ids))
    assert row["input_ids"][-1] == tok.eos_token_id


def test_action_only_loss_trains_exactly_the_command_tokens(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    sample = _sample()
    whole, action = sft_rows([sample], tok, "steps"), sft_rows([sample], tok, "steps", loss_on="action")
    assert [r["input_ids"] for r in action] == [r["input_ids"] for r in whole]  # same tokens, other targets
    for row, turn in zip(action, [sample.turns[i] for i in (0, 2, 3)], strict=True):
        trained = [t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
        command = turn.text.split("ACTION:")[1].splitlines()[0].strip()
        assert tok.decode(trained).strip() == command  # the command, neither THOUGHT nor STATUS nor the EOS
        assert row["input_ids"][-1] == tok.eos_token_id and row["assistant_masks"][-1] == 0
    trainer, _, rows = build_trainer(model_dir, [sample], _cfg(loss_on="action", batch_size=1))
    assert rows == action  # the config reaches the rows, and TRL's labels follow them
    assert sorted(sum(lab != -100 for lab in r["labels"]) for r in trainer.train_dataset) == \
        sorted(sum(r["assistant_masks"]) for r in action)


def test_action_only_loss_refusals() -> None:
    from engine.config import ConfigError

    with pytest.raises(ConfigError, match="loss_on: 'action' needs format 'steps'"):
        SFTTrainConfig(format="chat", loss_on="action")
    with pytest.raises(ConfigError, match="loss_on: 'thought' is not one of completion, action"):
        SFTTrainConfig(loss_on="thought")


def test_mix_revisions_reaches_the_share() -> None:
    rev = [_sample(f"r{i}", "revision") for i in range(6)]
    good = [_sample(f"g{i}", "good") for i in range(20)]
    for share in (0.25, 0.5, 0.75):
        mixed = mix_revisions(rev + good, share, seed=1)
        n_rev = sum(s.kind == "revision" for s in mixed)
        assert n_rev == 6 and n_rev / len(mixed) == pytest.approx(share, abs=0.05)
    few_good = mix_revisions(rev + good[:2], 0.5, seed=1)
    assert sum(s.kind == "revision" for s in few_good) == 2 and len(few_good) == 4
    assert mix_revisions(rev + good, 0.5, seed=1) == mix_revisions(rev + good, 0.5, seed=1)


def test_sft_and_rft_save_loadable_models(model_dir: Path, tmp_path: Path) -> None:
    from engine.llm.registry import load_generator

    out = tmp_path / "sft"
    result = train_sft(model_dir, [_sample()], _cfg(format="chat"), out)
    meta = json.loads((out / TRAIN_META).read_text())
    assert meta["kind"] == "sft" and meta["data_ids"] == ["s1"] and meta["metrics"]["steps"] == 2
    assert result.metrics["last_loss"] < result.metrics["first_loss"]
    assert load_generator(str(out)).name == f"hf:{out.resolve()}"
    cfg = rft_config(**_cfg().to_dict() | {"kinds": ("rft",)})
    assert cfg.kinds == ("rft",)
    rft = train_sft(model_dir, [_sample("w", "rft")], cfg, tmp_path / "rft", kind="rft")
    assert json.loads((tmp_path / "rft" / TRAIN_META).read_text())["kind"] == "rft" and rft.output
    with pytest.raises(TrainError, match="no samples"):
        train_sft(model_dir, [], _cfg(), None)
