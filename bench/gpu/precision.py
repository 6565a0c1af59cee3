"""Mixed precision, measured: does a bf16 training step actually change the weights?

Loading weights in bf16 and letting AdamW update them directly rounds most small updates away
(an update smaller than half a bf16 ulp of the weight is lost). Orchard's trainer keeps fp32
master weights and computes in bf16 autocast (`bf16=True` on an fp32 model). This bench prints,
for full fine-tuning and LoRA through Orchard's real DPO trainer (`engine.train.dpo.train_dpo`),
the share of weight elements the saved model changed against its base and the loss curve, in
fp32 and bf16; and, as the baseline the fix is measured against, the same AdamW steps in a plain
torch loop with bf16 weights updated directly vs fp32 master weights under bf16 autocast.

    PYTHONPATH=. python bench/gpu/precision.py [--device cuda|cpu] [--steps 4] [--model DIR]

Without --model it builds a small random-weights Llama offline (engine/llm/scratch_model.py).
Prints a table and one JSON line last; exits 1 when a check fails: the bf16 path must change at
least 90% of the weights that the fp32 path changes (full and LoRA), losses finite.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])  # the repository root, not bench/gpu
sys.path.insert(1, str(Path(__file__).resolve().parent))

import torch
from train_dpo_bf16 import make_pairs

from engine.llm.scratch_model import build_tiny_model
from engine.train.dpo import DPOTrainConfig, train_dpo
from engine.train.served_precision import load_weights, share_changed


def orchard_run(model: Path, pairs: list, device: str, precision: str, lora: bool, steps: int) -> dict:
    cfg = DPOTrainConfig(
        max_steps=steps, batch_size=4, learning_rate=1e-4 if lora else 1e-6, lora=lora, lora_r=8,
        ref_source="precompute", device=device, precision=precision, max_length=1024, seed=0,
        num_threads=2 if device == "cpu" else None,
    )
    out = Path(tempfile.mkdtemp(prefix="orchard-precision-")) / "model"
    t = time.perf_counter()
    result = train_dpo(str(model), pairs, cfg, out)
    return {
        "share_changed": share_changed(load_weights(model), load_weights(out)),
        "losses": [round(h["loss"], 5) for h in result.history if "loss" in h],
        "seconds": round(time.perf_counter() - t, 1),
        "output": str(out),
    }


def plain_loop(model_dir: Path, pairs: list, device: str, master_fp32: bool, steps: int) -> dict:
    """AdamW on the chosen texts' NLL: bf16 weights updated directly, or fp32 + bf16 autocast."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch.float32 if master_fp32 else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    before = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    torch.manual_seed(0)
    losses = []
    for step in range(steps):
        p = pairs[step % len(pairs)]
        text = tok.apply_chat_template(p.prompt + [{"role": "assistant", "content": p.chosen}], tokenize=False)
        ids = tok(text, return_tensors="pt", truncation=True, max_length=1024)["input_ids"].to(device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(float(loss), 5))
    after = {k: v.detach().float() for k, v in model.state_dict().items()}
    return {"share_changed": share_changed(before, after), "losses": losses}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--model", help="a local model folder (default: a small random-weights Llama)")
    args = ap.parse_args()
    began = time.perf_counter()
    pairs = make_pairs(args.pairs)
    texts = [m["content"] for p in pairs for m in p.prompt] + [p.chosen for p in pairs] + [p.rejected for p in pairs]
    model = Path(args.model) if args.model else build_tiny_model(
        Path(tempfile.mkdtemp(prefix="orchard-scratch-")) / "model", seed=0, hidden=128, layers=2, vocab=2048,
        corpus=texts)
    rows: dict[str, dict] = {}
    for lora in (False, True):
        for precision in ("fp32", "bf16"):
            rows[f"orchard {'lora' if lora else 'full'} {precision}"] = orchard_run(
                model, pairs, args.device, precision, lora, args.steps)
    rows["plain loop: bf16 weights updated directly"] = plain_loop(model, pairs, args.device, False, args.steps)
    rows["plain loop: fp32 master + bf16 autocast"] = plain_loop(model, pairs, args.device, True, args.steps)

    print(f"device {args.device}, {args.steps} steps, {args.pairs} pairs, lr 1e-6 full / 1e-4 LoRA")
    print(f"{'run':46} {'weights changed':>16}  losses")
    for name, row in rows.items():
        print(f"{name:46} {row['share_changed']:>15.2%}  {row['losses']}")
    checks = {
        kind: rows[f"orchard {kind} bf16"]["share_changed"] >= 0.9 * rows[f"orchard {kind} fp32"]["share_changed"]
        for kind in ("full", "lora")
    }
    checks["losses_finite"] = all(math.isfinite(x) for r in rows.values() for x in r["losses"])
    summary = {"device": args.device, "rows": rows, "checks": checks, "ok": all(checks.values()),
               "total_s": round(time.perf_counter() - began, 1)}
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
