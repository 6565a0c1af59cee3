"""The GPU check: one script, one table, <= 8 minutes on one H200 (its python3 has torch,
transformers, accelerate and peft; TRL and datasets travel as wheels, see bench/gpu/README.md).

It runs, on a small random-weights Llama built offline (engine/llm/scratch_model.py) or --model DIR:
1. HF backend: batched sampling (K completions per prompt, several prompts), tokens/s, and the
   sampled completions' log-probs against teacher-forced scoring of the same texts;
2. a bf16 DPO step and an SFT step, fp32 master weights (bench/gpu/precision.py's question):
   the share of weights that change, and whether the loss falls over the steps;
3. the same DPO with LoRA (merged on save).
`--device cpu` runs every check on the CPU (CI does, through `bench/gpu/check.sh --cpu`).
Exits 1 when a check fails; prints a table, then one JSON line.
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
from precision import load_weights, orchard_run, share_changed
from train_dpo_bf16 import make_pairs

from engine.datasets.samples import Sample, Task, Turn
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.scratch_model import build_tiny_model
from engine.train.sft import SFTTrainConfig, train_sft


def sampling_check(model: Path, pairs: list, device: str, dtype: torch.dtype) -> dict:
    gen = HFGenerator(model, device=device, dtype=dtype, batch_size=64, seed=0)
    reqs = [SampleRequest(p.prompt, n=4, params=SamplingParams(temperature=1.0, max_tokens=48, seed=i))
            for i, p in enumerate(pairs)]
    gen.sample(reqs[:1])  # warm-up (kernels, allocator)
    t = time.perf_counter()
    out = gen.sample(reqs)
    seconds = time.perf_counter() - t
    comps = [(r.prompt, c) for r, cs in zip(reqs, out, strict=True) for c in cs]
    tokens = sum(c.n_tokens for _, c in comps)
    # Teacher-forced scoring of exactly the sampled ids (EOS included where the model ended),
    # against the log-probs recorded while sampling: the replay buffer's promise.
    gaps = []
    for prompt, c in comps:
        if c.logprob is None or not c.token_ids or c.finish_reason == "stop" and c.token_ids[-1] not in gen.eos_ids:
            continue  # a stop-string cut scores only part of its ids
        scored = gen._score([(gen.encode_prompt(prompt) + list(c.token_ids), len(c.token_ids))])[0]
        gaps.append(abs(scored - c.logprob) / len(c.token_ids))
    return {"tokens_per_s": round(tokens / seconds, 1), "completions": len(comps),
            "compared": len(gaps), "max_gap_per_token": max(gaps) if gaps else None}


def sft_check(model: Path, device: str, precision: str, steps: int) -> dict:
    task = Task(id="t", goal="reach position 3", context="commands: left, right, wait",
                first_observation="You are at 0.", system="You are an agent.")
    samples = [Sample(id=f"s{i}", kind="good", task=task, turns=(
        Turn("THOUGHT: go right\nACTION: right\nEXPLANATION: closer\nSTATUS: CONTINUE", f"You are at {i}.", True),
        Turn("THOUGHT: done\nACTION: wait\nEXPLANATION: there\nSTATUS: SUCCESS", None, True),
    )) for i in range(8)]
    cfg = SFTTrainConfig(max_steps=steps, batch_size=4, learning_rate=1e-4, device=device, precision=precision,
                         max_length=1024, num_threads=2 if device == "cpu" else None)
    out = Path(tempfile.mkdtemp(prefix="orchard-check-sft-")) / "model"
    result = train_sft(str(model), samples, cfg, out)
    losses = [round(h["loss"], 4) for h in result.history if "loss" in h]
    return {"share_changed": share_changed(load_weights(model), load_weights(out)), "losses": losses}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", help="a local model folder (default: a small random-weights Llama)")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    began = time.perf_counter()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: run with --device cpu (bench/gpu/check.sh --cpu)")
        return 2
    pairs = make_pairs(8)
    texts = [m["content"] for p in pairs for m in p.prompt] + [p.chosen for p in pairs] + [p.rejected for p in pairs]
    model = Path(args.model) if args.model else build_tiny_model(
        Path(tempfile.mkdtemp(prefix="orchard-check-")) / "model", seed=0, vocab=2048, corpus=texts,
        **({"hidden": 256, "layers": 4} if args.device.startswith("cuda") else {"hidden": 128, "layers": 2}))
    rows: dict[str, dict] = {}
    rows["hf sampling bf16"] = sampling_check(model, pairs, args.device, torch.bfloat16)
    rows["hf sampling fp32"] = sampling_check(model, pairs, args.device, torch.float32)
    rows["dpo full bf16"] = orchard_run(model, pairs, args.device, "bf16", False, args.steps)
    rows["dpo lora bf16"] = orchard_run(model, pairs, args.device, "bf16", True, args.steps)
    rows["sft full bf16"] = sft_check(model, args.device, "bf16", args.steps)

    checks = {
        "fp32 log-probs match scoring (<1e-3/token)": rows["hf sampling fp32"]["compared"] > 0
        and rows["hf sampling fp32"]["max_gap_per_token"] < 1e-3,
        "bf16 log-probs near scoring (<0.05/token)": rows["hf sampling bf16"]["compared"] > 0
        and rows["hf sampling bf16"]["max_gap_per_token"] < 0.05,
        "dpo full: >90% weights change": rows["dpo full bf16"]["share_changed"] > 0.9,
        "dpo lora: merged weights change": rows["dpo lora bf16"]["share_changed"] > 0.1,
        "sft full: >90% weights change": rows["sft full bf16"]["share_changed"] > 0.9,
        "dpo/sft losses finite and falling": all(
            all(math.isfinite(x) for x in r["losses"]) and r["losses"][-1] < r["losses"][0]
            for k, r in rows.items() if "losses" in r),
    }
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'CPU'}), "
          f"torch {torch.__version__}")
    for name, row in rows.items():
        print(f"  {name:18} {json.dumps(row)}")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    summary = {"device": args.device, "rows": rows, "checks": checks, "ok": all(checks.values()),
               "total_s": round(time.perf_counter() - began, 1)}
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
