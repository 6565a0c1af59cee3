"""What a bf16 server sees of a trained update (engine/train/served_precision.py, issue 29 item 8)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.train.served_precision import serves_in_bf16, share_changed, visible_share


def _folder(path: Path, weights: dict[str, torch.Tensor]) -> Path:
    path.mkdir()
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_an_update_below_half_a_bf16_ulp_is_invisible_to_a_bf16_server(tmp_path: Path) -> None:
    """Hand-worked: 1.0 + 1e-6 rounds back to 1.0 in bf16 (its spacing at 1.0 is 2**-7); 1.0 + 0.01 does not."""
    base = {"w": torch.ones(4), "b": torch.ones(4)}
    tiny = {"w": torch.ones(4) + 1e-6, "b": torch.ones(4) + 1e-6}
    mixed = {"w": torch.ones(4) + 1e-6, "b": torch.ones(4) + 0.01}
    assert share_changed(base, tiny) == 1.0
    assert share_changed(base, tiny, torch.bfloat16) == 0.0
    assert share_changed(base, mixed, torch.bfloat16) == 0.5
    before, after = _folder(tmp_path / "a", base), _folder(tmp_path / "b", mixed)
    assert visible_share(before, after) == 0.5
    assert visible_share(before, tmp_path / "missing") is None


def test_vllm_specs_serve_in_bf16() -> None:
    assert serves_in_bf16("vllm:/models/x")
    assert serves_in_bf16("tiny") == torch.cuda.is_available()
