"""Mixed precision and the GPU environment's transformers, on CPU: fp32 master weights under
bf16, the checkpointing argument under the name the installed transformers knows, and the GPU
check script's CPU run (slow)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_model_fixture import build_tiny_model

from engine.train.common import TrainConfig, checkpointing_kwarg, load_model, trl_common_args

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class OldTrainingArguments:  # transformers < 5.21 (what vLLM 0.33 pins): no activation_checkpointing
    output_dir: str = ""
    gradient_checkpointing: bool = False


@dataclasses.dataclass
class NewTrainingArguments(OldTrainingArguments):
    activation_checkpointing: bool = False


def test_checkpointing_uses_the_name_the_installed_transformers_knows() -> None:
    assert checkpointing_kwarg(True, OldTrainingArguments) == {"gradient_checkpointing": True}
    assert checkpointing_kwarg(False, NewTrainingArguments) == {"activation_checkpointing": False}
    # The installed versions take what trl_common_args builds (no unknown keyword -> no TypeError).
    from trl import DPOConfig, SFTConfig

    args = trl_common_args(TrainConfig(device="cpu", precision="fp32"), "cpu", "fp32", "/tmp/unused")
    assert DPOConfig(**args).output_dir == "/tmp/unused" and SFTConfig(**args).seed == 0


def test_bf16_training_keeps_fp32_master_weights(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "m")
    model, _tok, device, precision = load_model(folder, TrainConfig(device="cpu", precision="bf16"))
    assert (device, precision) == ("cpu", "bf16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    args = trl_common_args(TrainConfig(device="cpu", precision="bf16"), device, precision, tmp_path)
    assert args["bf16"] is True  # the Trainer then computes in bf16 autocast over fp32 weights


@pytest.mark.slow
def test_gpu_check_passes_on_cpu(tmp_path: Path) -> None:
    """bench/gpu/check.sh --cpu: HF sampling log-probs vs teacher forcing, constrained sampling, bf16
    DPO / LoRA / SFT steps that change the weights and lower the loss, reloads (the script exits 1 on
    a failed check); it says vLLM is not checked, and writes its JSON under $OUT."""
    import json

    out = subprocess.run(["bash", "bench/gpu/check.sh", "--cpu"], check=False, cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env={**__import__("os").environ, "PYTHON": sys.executable, "OUT": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert '"ok": true' in out.stdout.splitlines()[-1] and "vLLM cannot travel" in out.stdout
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["ok"] and {"hf constrained", "dpo full bf16", "sft full bf16"} <= set(summary["rows"])
    assert summary["checks"]["saved dpo models reload and score"]
