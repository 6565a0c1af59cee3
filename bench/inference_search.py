"""Search at inference on the embedded default: greedy vs MCTS with the same tiny model, held-out tasks.

Agent Q's other lever besides training: at every real step the agent spends `--simulations` MCTS
simulations (the model as actor, critic and rollout policy, in private env copies) and commits to
the best explored child (`EvalConfig(mode="mcts")`). This prints success, progress and loop rate
of greedy play and of MCTS play (reward and/or progress backup) on the first `--tasks` test tasks,
with 95% bootstrap intervals over tasks, and the wall time of each, measured in the same run.

    .venv/bin/python bench/inference_search.py [--tasks 32] [--simulations 4] [--k 4] [--max-steps 12]
        [--backup progress|reward|both] [--seed 0]

Greedy takes seconds; each MCTS mode about 10-12 minutes on 2 CPU cores with the defaults (the tiny
model must be built, or is built first).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig, evaluate
from engine.llm.registry import load_generator


def ci(m: dict) -> str:
    return f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=32, help="the first N held-out (test) tasks")
    ap.add_argument("--simulations", type=int, default=4, help="MCTS simulations per real step")
    ap.add_argument("--k", type=int, default=4, help="candidate actions per expansion")
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--backup", choices=("progress", "reward", "both"), default="progress")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    generator = load_generator("tiny")
    tasks = TextCraftEnv().tasks("test")[: args.tasks]
    common = {"max_steps": args.max_steps, "max_tokens": args.max_tokens, "seeds": (args.seed,)}
    configs = {"greedy": EvalConfig(mode="greedy", **common)}
    for backup in (("progress", "reward") if args.backup == "both" else (args.backup,)):
        configs[f"mcts/{backup}"] = EvalConfig(mode="mcts", mcts_simulations=args.simulations, mcts_k=args.k,
                                               mcts_backup=backup, **common)
    print(f"tiny model, {len(tasks)} held-out TextCraft tasks, max {args.max_steps} steps; "
          f"MCTS: {args.simulations} simulations per step, K={args.k}, seed {args.seed}")
    rows = {}
    for name, config in configs.items():
        began = time.perf_counter()
        metrics = evaluate(generator, TextCraftEnv, tasks, config).metrics
        rows[name] = (metrics, time.perf_counter() - began)
        print(f"{name:<14} success {ci(metrics['success'])}  progress {ci(metrics['progress'])}  "
              f"loop rate {ci(metrics['loop_rate'])}  {rows[name][1]:.0f} s", flush=True)
    base = rows["greedy"][0]
    for name, (metrics, seconds) in rows.items():
        if name != "greedy":
            gain = metrics["progress"]["mean"] - base["progress"]["mean"]
            print(f"{name}: progress {gain:+.3f} vs greedy, "
                  f"success {metrics['success']['mean'] - base['success']['mean']:+.3f}, "
                  f"{seconds / max(rows['greedy'][1], 1e-9):.0f}x the greedy time")


if __name__ == "__main__":
    main()
