"""GPU check of Orchard's DPO trainer in bf16 (< 5 minutes on one GPU; no hub access).

On a local model folder (with a chat template), it builds step pairs from TextCraft actor prompts
(expert actions as chosen, noisy-expert actions as rejected), records their reference log-probs as
the replay buffer would (`HFGenerator.logprobs` in bf16 on the GPU), then trains ONE DPO step in
bf16 twice:
1. ref_source=auto: the stored values, spot-checked against the trainer's own bf16 reference pass
   (prints the largest per-token gap: how far bf16 generation-time and training-time log-probs are
   apart on this GPU; above --tolerance the run falls back to the reference pass, as designed);
2. ref_source=precompute: TRL's one-off reference pass.
Step 1 must give loss ~= log 2 in both (the policy IS the reference at step 1) and finite grads;
with --save, the trained model is saved and loaded back as a Generator.

    PYTHONPATH=. python bench/gpu/train_dpo_bf16.py /models/Qwen2.5-0.5B-Instruct [--pairs 16 --batch 8]
    [--lora] [--save] [--device cuda] [--precision bf16]

Prints one JSON line last; exits 1 when a check fails. (`--device cpu --precision bf16` runs the
same path on a CPU, slowly, for a smoke test.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch

from engine.actions import render
from engine.datasets.pairs import Pair
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import solve
from engine.llm.hf import HFGenerator
from engine.prompts import HistoryStep, actor_prompt
from engine.train.dpo import DPOTrainConfig, train_dpo


def make_pairs(count: int) -> list[Pair]:
    env = TextCraftEnv()
    tasks = env.tasks("train")
    pairs: list[Pair] = []
    i = 0
    while len(pairs) < count and i < 50 * count:
        task = tasks[i % len(tasks)]
        good, bad = solve(env, task.id, noise=0.0, seed=i), solve(env, task.id, noise=1.0, seed=i)
        cut = (i // len(tasks)) % max(1, len(good))
        history = [HistoryStep(s.action, r.observation) for s, r in good[:cut]]
        observation = history[-1].observation if history else env.reset(task.id)
        chosen, rejected = render(good[cut][0].action), render(bad[min(cut, len(bad) - 1)][0].action)
        if chosen != rejected:
            pairs.append(Pair(id=f"g{i}", kind="step", run_id="gpu-check", tree_id=None, task_id=task.id,
                              node_id=cut, chosen_node=1, rejected_node=2,
                              prompt=actor_prompt(env.describe(), task.goal, task.context, history, observation),
                              chosen=chosen, rejected=rejected, q_chosen=1.0, q_rejected=0.0, logprob_chosen=None,
                              logprob_rejected=None, depth=cut, status="approved"))
        i += 1
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--tolerance", type=float, default=0.02, help="stored vs re-scored, nats per token")
    ap.add_argument("--max-length", type=int, default=2048)
    args = ap.parse_args()
    began = time.perf_counter()
    checks: dict[str, bool] = {}
    summary: dict[str, object] = {"model": args.model, "device": args.device, "precision": args.precision}

    pairs = make_pairs(args.pairs)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    gen = HFGenerator(args.model, device=args.device, dtype=dtype, batch_size=args.batch)
    t = time.perf_counter()
    chosen = gen.logprobs([p.prompt for p in pairs], [p.chosen for p in pairs])
    rejected = gen.logprobs([p.prompt for p in pairs], [p.rejected for p in pairs])
    summary["score_s"] = time.perf_counter() - t
    pairs = [replace(p, logprob_chosen=c, logprob_rejected=r) for p, c, r in zip(pairs, chosen, rejected, strict=True)]
    del gen
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()

    base = {"max_steps": 1, "batch_size": args.batch, "learning_rate": 1e-6 if not args.lora else 1e-4,
            "lora": args.lora, "max_length": args.max_length, "verify_per_run": min(8, args.pairs),
            "ref_tolerance": args.tolerance}
    make = DPOTrainConfig.for_gpu if args.device.startswith("cuda") else DPOTrainConfig.for_cpu
    out_dir = Path(tempfile.mkdtemp(prefix="orchard-gpu-dpo-")) / "model" if args.save else None
    for mode in ("auto", "precompute"):
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        cfg = make(**base, ref_source=mode, device=args.device, precision=args.precision)
        t = time.perf_counter()
        result = train_dpo(args.model, pairs, cfg, out_dir if mode == "auto" else None)
        loss = next(h["loss"] for h in result.history if "loss" in h)
        grad = next((h.get("grad_norm") for h in result.history if "loss" in h), None)
        summary[mode] = {
            "seconds": time.perf_counter() - t, "step_loss": loss, "grad_norm": grad,
            "ref_stored": result.metrics.get("ref_stored"), "ref_computed": result.metrics.get("ref_computed"),
            "verify_max_diff_per_token": result.metrics.get("ref_verify_max_diff_per_token"),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None,
        }
        checks[f"{mode}_loss_is_log2"] = math.isfinite(loss) and abs(loss - math.log(2)) < 0.02
        checks[f"{mode}_grad_finite"] = grad is not None and math.isfinite(grad)
        print(f"{mode}: {json.dumps(summary[mode])}", flush=True)
    if out_dir is not None:
        from engine.llm.registry import load_generator

        reloaded = load_generator(str(out_dir))
        score = reloaded.logprobs([pairs[0].prompt], [pairs[0].chosen])[0]
        checks["saved_model_loads"] = score is not None and math.isfinite(score)
    summary["total_s"] = time.perf_counter() - began
    summary["checks"] = checks
    summary["ok"] = all(checks.values())
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
