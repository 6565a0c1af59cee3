"""The GPU check: one script, one table, <= 8 minutes on one H200 (its python3 has torch,
transformers, accelerate and peft; TRL and datasets travel as wheels, see bench/gpu/README.md).

It runs, on a small random-weights Llama built offline (engine/llm/scratch_model.py) or --model DIR:
1. HF backend: batched sampling (K completions per prompt, several prompts), tokens/s, and the
   sampled completions' log-probs against teacher-forced scoring of the same texts;
2. a bf16 DPO step and an SFT step, fp32 master weights (bench/gpu/precision.py's question):
   the share of weights that change, and whether the loss falls over the steps;
3. the same DPO with LoRA (merged on save); the saved models reload and score finite log-probs;
4. HF constrained sampling: every completion in the grammar (a prefix where max_tokens cut it; a
   random-weights model rarely ends a free-text line), mask time per decode step;
5. on CUDA, a DPO step with 85% of the GPU held by a stand-in allocation (a resident vLLM engine);
   peak GPU memory per phase. The JSON summary also goes to $OUT/gpu_check.json when $OUT is set.
vLLM is not checked here: it cannot travel to the lent machine (bench/gpu/check.sh says so).
`--device cpu` runs every check on the CPU (CI does, through `bench/gpu/check.sh --cpu`).
Exits 1 when a check fails; prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
from engine.train.served_precision import visible_share
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


def phase(rows: dict, name: str, device: str, run) -> None:
    """Run one phase, recording its wall time and (CUDA) peak allocated memory in its row."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    row = run()
    row["phase_s"] = round(time.perf_counter() - t, 2)
    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3) if device.startswith("cuda") else None
    rows[name] = row


def constrained_check(model: Path, pairs: list, device: str) -> dict:
    """Sampling under the composite-action grammar (the HF backend's token masks)."""
    from engine.grammar import ActionGrammar

    gen = HFGenerator(model, device=device, dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32,
                      batch_size=64, seed=0)
    grammar = ActionGrammar("inventory|get [1-9] [a-z ]+|craft [1-9] [a-z ]+ using [0-9a-z ,]+")
    masks = {"calls": 0, "s": 0.0}
    inner = gen._masks

    def timed(*a, **k):
        t = time.perf_counter()
        out = inner(*a, **k)
        masks["calls"] += 1
        masks["s"] += time.perf_counter() - t
        return out

    gen._masks = timed  # type: ignore[method-assign]
    reqs = [SampleRequest(p.prompt, n=2, params=SamplingParams(temperature=1.0, max_tokens=96, seed=i, grammar=grammar))
            for i, p in enumerate(pairs)]
    out = gen.sample(reqs)
    comps = [c for cs in out for c in cs]
    finished = [c for c in comps if c.finish_reason == "stop"]
    def inside(c) -> bool:  # finished: a whole action; cut by max_tokens: still a prefix of one
        if c.finish_reason == "stop":
            return grammar.accepts(c.text)
        placed = grammar.place(c.text)
        return placed is not None and grammar.viable(*placed)

    return {"completions": len(comps), "finished": len(finished),
            "outside": sum(not inside(c) for c in comps), "vocab": len(gen.tokenizer),
            "mask_ms_per_step": round(1000 * masks["s"] / max(1, masks["calls"]), 3)}


def reload_check(folder: str, pairs: list, device: str) -> bool:
    """A saved model loads again and scores finite log-probs."""
    gen = HFGenerator(Path(folder), device=device, seed=0)
    scores = gen.logprobs([p.prompt for p in pairs[:4]], [p.chosen for p in pairs[:4]])
    return all(s is not None and math.isfinite(s) for s in scores)


def held_memory_dpo(model: Path, pairs: list, device: str, steps: int) -> dict:
    """DPO with 85% of the GPU taken by a stand-in allocation, as a resident vLLM engine would."""
    free, total = torch.cuda.mem_get_info()
    hold = max(0, int(0.85 * total) - (total - free))
    block = torch.empty(hold, dtype=torch.uint8, device=device)
    try:
        row = orchard_run(model, pairs, device, "bf16", False, steps)
    finally:
        del block
        torch.cuda.empty_cache()
    row["held_gib"] = round(hold / 2**30, 2)
    return row


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
    dev = args.device
    phase(rows, "hf sampling bf16", dev, lambda: sampling_check(model, pairs, dev, torch.bfloat16))
    phase(rows, "hf sampling fp32", dev, lambda: sampling_check(model, pairs, dev, torch.float32))
    phase(rows, "hf constrained", dev, lambda: constrained_check(model, pairs, dev))
    phase(rows, "dpo full bf16", dev, lambda: orchard_run(model, pairs, dev, "bf16", False, args.steps))
    phase(rows, "dpo lora bf16", dev, lambda: orchard_run(model, pairs, dev, "bf16", True, args.steps))
    phase(rows, "sft full bf16", dev, lambda: sft_check(model, dev, "bf16", args.steps))
    if dev.startswith("cuda"):
        phase(rows, "dpo 85% held", dev, lambda: held_memory_dpo(model, pairs, dev, 1))
    reloads = {k: reload_check(r["output"], pairs, dev) for k, r in rows.items() if "output" in r}
    # What a bf16 server (vLLM's dtype auto, HF on CUDA) sees of the fp32 update at lr 1e-6.
    rows["dpo full bf16"]["share_changed_as_served_bf16"] = visible_share(model, rows["dpo full bf16"]["output"])

    checks = {
        "fp32 log-probs match scoring (<1e-3/token)": rows["hf sampling fp32"]["compared"] > 0
        and rows["hf sampling fp32"]["max_gap_per_token"] < 1e-3,
        "bf16 log-probs near scoring (<0.05/token)": rows["hf sampling bf16"]["compared"] > 0
        and rows["hf sampling bf16"]["max_gap_per_token"] < 0.05,
        "dpo full: >90% weights change": rows["dpo full bf16"]["share_changed"] > 0.9,
        "dpo lora: merged weights change": rows["dpo lora bf16"]["share_changed"] > 0.1,
        "sft full: >90% weights change": rows["sft full bf16"]["share_changed"] > 0.9,
        "dpo step 1 loss ~ log 2": abs(rows["dpo full bf16"]["losses"][0] - math.log(2)) < 0.01,
        "hf constrained: every completion in the grammar (a prefix where cut)": rows["hf constrained"]["completions"] > 0
        and rows["hf constrained"]["outside"] == 0,
        "saved dpo models reload and score": bool(reloads) and all(reloads.values()),
        **({"dpo with 85% of the GPU held": math.isfinite(rows["dpo 85% held"]["losses"][0])}
           if "dpo 85% held" in rows else {}),
        "dpo/sft losses finite and falling": all(
            all(math.isfinite(x) for x in r["losses"]) and r["losses"][-1] < r["losses"][0]
            for k, r in rows.items() if "losses" in r and len(r["losses"]) > 1),
    }
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'CPU'}), "
          f"torch {torch.__version__}")
    for name, row in rows.items():
        print(f"  {name:18} {json.dumps(row)}")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    served = rows["dpo full bf16"]["share_changed_as_served_bf16"]
    if served < 0.5:
        print(f"  WARNING  only {served:.1%} of the weights change once cast to bf16 for serving: the next search "
              "on a bf16 engine mostly runs the old policy (serve fp32, or train with a larger learning rate)")
    summary = {"device": args.device, "rows": rows, "checks": checks, "ok": all(checks.values()),
               "total_s": round(time.perf_counter() - began, 1)}
    print(json.dumps(summary))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
