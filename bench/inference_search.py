"""Search at inference on the embedded default: greedy vs MCTS with the same model, held-out tasks.

Agent Q's other lever besides training: at every real step the agent spends `--simulations` MCTS
simulations (the model as actor, critic and rollout policy, in private env copies) and commits to
the best explored child (`EvalConfig(mode="mcts")`, reward backup by default as in the paper). This
prints success, progress and loop rate of greedy play and of MCTS play on the first `--test-tasks`
held-out tasks with 95% bootstrap intervals over tasks, the wall time of each, and the PAIRED
interval of MCTS - greedy (the same resampled tasks for both arms).

    .venv/bin/python bench/inference_search.py [--model tiny] [--test-tasks 32] [--simulations 4] [--k 4]
        [--max-steps 12] [--backup reward|progress|both] [--seed 0]

Greedy takes seconds; MCTS with the defaults and `--constrained` 23 minutes with the shipped 5.3M tiny
model on 2 CPU cores shared with a second bench, inside the 30-minute bench budget (unconstrained, where
episodes run to the step limit, it does not fit: 16 minutes with the previous 2.3M model).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import Table, add_common_args, greedy_config, held_out
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig
from engine.llm.registry import load_generator


def main(argv: list[str] | None = None) -> Table:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=32)
    ap.set_defaults(max_steps=12)
    ap.add_argument("--simulations", type=int, default=4, help="MCTS simulations per real step")
    ap.add_argument("--k", type=int, default=4, help="candidate actions per expansion")
    ap.add_argument("--backup", choices=("progress", "reward", "both"), default="reward")
    args = ap.parse_args(argv)

    generator = load_generator(args.model)
    tasks = held_out(args.test_tasks, args.split)
    table = Table("MCTS at inference vs greedy, same model, held-out TextCraft tasks",
                  {"model": args.model, "tasks": f"{args.split}[:{len(tasks)}]", "seed": args.seed,
                   "budget": f"MCTS {args.simulations} simulations per real step, K={args.k}",
                   "max steps": args.max_steps}, bootstrap=args.bootstrap, seed=args.seed, constrained=args.constrained)
    table.header()
    base = greedy_config(args)
    table.evaluate("greedy", generator, TextCraftEnv, tasks, base)
    for backup in (("progress", "reward") if args.backup == "both" else (args.backup,)):
        config = EvalConfig(**{**base.__dict__, "mode": "mcts", "mcts_simulations": args.simulations,
                               "mcts_k": args.k, "mcts_backup": backup})
        arm = table.evaluate(f"mcts/{backup}", generator, TextCraftEnv, tasks, config)
        table.annotate(arm.name, f"{arm.seconds / max(table.arms['greedy'].seconds, 1e-9):.0f}x the greedy time")
    table.print_diffs([("greedy", name) for name in table.arms if name != "greedy"])
    table.footer()
    return table


if __name__ == "__main__":
    main()
