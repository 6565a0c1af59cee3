"""Search speed on the GPU: MCTS at inference with the shipped policy, the CPU and CUDA in one run.

The loop's cost is its search (issue 27: one iteration in 45 minutes on 2 cores). This runs the
same MCTS-at-inference evaluation (fit tasks drawn with the seed, constrained decoding, K=4,
reward backup) with the transformers backend on the CPU (the baseline, `--cpu-threads`) and on
CUDA (fp32, then bf16), and prints simulations per second per arm with the ratio to the CPU arm;
then CUDA alone on `--wide` tasks at once (the batching a large search gets). Solved counts are
printed beside the speed, not asserted equal: a sampled token can flip where two logits sit
within rounding, and bf16 rounds more.

    PYTHONPATH=. python bench/gpu/search_speed.py [--tasks 8] [--wide 64] [--simulations 2] [--max-steps 6]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])  # the repository root, not bench/gpu

import torch

from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig, evaluate
from engine.llm.hf import HFGenerator
from engine.llm.tiny_checkpoint import tiny_model_dir


def arm(name: str, folder: str, tasks: list, config: EvalConfig, simulations: int, **gen_args: object) -> dict:
    gen = HFGenerator(folder, seed=config.seeds[0], **gen_args)  # type: ignore[arg-type]
    t = time.perf_counter()
    episodes = evaluate(gen, TextCraftEnv, tasks, config).episodes
    wall = time.perf_counter() - t
    sims = sum(e.steps for e in episodes) * simulations
    row = {"arm": name, "tasks": len(tasks), "wall_s": round(wall, 1), "simulations": sims,
           "simulations_per_s": round(sims / wall, 3), "solved": sum(e.success for e in episodes)}
    print(f"  {name:<26} {row['wall_s']:7.1f} s  {sims:5d} simulations  {row['simulations_per_s']:8.3f}/s  "
          f"solved {row['solved']}/{len(tasks)}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="a model folder (default: the shipped tiny policy)")
    ap.add_argument("--tasks", type=int, default=8, help="tasks of the CPU-vs-CUDA comparison")
    ap.add_argument("--wide", type=int, default=64, help="tasks of the CUDA-only run (0: none)")
    ap.add_argument("--simulations", type=int, default=2, help="MCTS simulations per real step")
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--cpu-threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device here: this bench compares the CPU with CUDA")
        return 2
    folder = args.model or str(tiny_model_dir())
    fit = TextCraftEnv().tasks("fit")
    tasks = random.Random(args.seed).sample(fit, args.tasks)
    config = EvalConfig(mode="mcts", seeds=(args.seed,), mcts_simulations=args.simulations, mcts_k=4,
                        mcts_backup="reward", max_steps=args.max_steps, constrained=True)
    print(f"MCTS at inference, fit tasks drawn with seed {args.seed}, {args.simulations} simulations per real step, "
          f"K=4, {args.max_steps} steps, constrained; model {folder}; {torch.cuda.get_device_name()}")
    rows = [arm(f"cpu ({args.cpu_threads} threads) fp32", folder, tasks, config, args.simulations,
                device="cpu", num_threads=args.cpu_threads),
            arm("cuda fp32", folder, tasks, config, args.simulations, device="cuda", dtype=torch.float32),
            arm("cuda bf16", folder, tasks, config, args.simulations, device="cuda", dtype=torch.bfloat16)]
    base = rows[0]["simulations_per_s"]
    for row in rows[1:]:
        row["ratio_to_cpu"] = round(row["simulations_per_s"] / base, 2)
        print(f"  {row['arm']}: {row['ratio_to_cpu']}x the CPU arm's simulations per second")
    if args.wide:
        wide = random.Random(args.seed).sample(fit, args.wide)
        rows.append(arm(f"cuda fp32, {args.wide} tasks", folder, wide, config, args.simulations,
                        device="cuda", dtype=torch.float32))
    print(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
