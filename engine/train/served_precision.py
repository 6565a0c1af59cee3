"""How much of a trained update a bf16 server still sees.

Training keeps fp32 master weights, but vLLM (`dtype auto`) and the HF backend on CUDA serve in bf16; a
small update (DPO at lr 1e-6: 99.96% of the fp32 weights change, 6.6% of their bf16 casts, measured on CPU
and on an H200) mostly rounds away, so the next search runs nearly the old policy. The loop records this
share per iteration and says so when it is below half (issue 29 item 8).
"""

from __future__ import annotations

from pathlib import Path

import torch

VISIBLE_ENOUGH = 0.5  # below this share of changed weights the loop warns


def load_weights(folder: str | Path) -> dict[str, torch.Tensor] | None:
    """A model folder's weights as fp32 tensors; None when it is not one `model.safetensors` file."""
    from safetensors.torch import load_file

    path = Path(folder) / "model.safetensors"
    return {k: v.float() for k, v in load_file(str(path)).items()} if path.is_file() else None


def share_changed(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor],
                  dtype: torch.dtype | None = None) -> float:
    """The share of `base`'s weights that differ in `new`, compared after a cast to `dtype` (None: as stored)."""
    changed = total = 0
    for name, w in base.items():
        if name in new:
            a, b = (w, new[name]) if dtype is None else (w.to(dtype), new[name].to(dtype))
            changed += int((a != b).sum())
            total += w.numel()
    return changed / max(total, 1)


def visible_share(before: str | Path, after: str | Path, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """The share of weights a `dtype` server sees changed between two model folders (None: unreadable)."""
    base, new = load_weights(before), load_weights(after)
    return None if base is None or new is None else share_changed(base, new, dtype)


def serves_in_bf16(model_spec: str) -> bool:
    """Whether the loop's generator serves a policy in bf16: a vLLM engine, or the HF backend on CUDA."""
    return model_spec.strip().startswith("vllm:") or torch.cuda.is_available()
