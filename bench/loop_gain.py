"""Does the loop pay? The policy-improvement curve of `orchard iterate`, iteration after iteration.

Runs `engine.loop.run_loop` (`--method`, default the loop's default, expert iteration) for
`--iterations` iterations from the base policy: search B fit train tasks, build the method's data,
train, evaluate greedily on the held-out tasks. The base and every iteration's model are evaluated
on the SAME held-out tasks with the same evaluation (the README's: greedy, constrained with
`--constrained`, 15 steps, 160 tokens); the table gives each with its 95% interval and the PAIRED
bootstrap interval of its difference from the base and from the iteration before, plus per
iteration the data rows, tasks solved in search, simulations per second and wall / CPU time. No
model is selected on the test split: every iteration is reported. Choose settings with
`--split val` (43 train tasks held out of the model and of every search).

With `--method exit-mcts`, `--simulations` is MCTS at inference's simulations per real step (use 4);
with `--method exit-sampled`, `--samples` sampled episodes are played on each task greedy fails.

    .venv/bin/python bench/loop_gain.py [--method exit] [--iterations 3] [--tasks 64] [--simulations 12]
        [--sft-lr 1e-4] [--epochs 3] [--split val|test] [--test-tasks 0] [--constrained] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    Table,
    add_common_args,
    add_loop_args,
    greedy_settings,
    held_out,
    loop_search,
    stored_episodes,
)
from engine.loop import METHODS, IterateConfig, run_loop
from engine.store import Store


def main(argv: list[str] | None = None) -> Table:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=0)
    add_loop_args(ap, tasks=64, simulations=12)
    ap.add_argument("--method", choices=METHODS, default=IterateConfig().method)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--sft-lr", type=float, default=1e-4, help="SFT learning rate (exit, visits, agentr)")
    ap.add_argument("--per-tree", type=int, default=1, help="exit: successful trajectories kept per solved tree")
    ap.add_argument("--no-critic", action="store_true", help="search without the critic (exit, visits need none)")
    ap.add_argument("--trees-in-flight", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8, help="exit-sampled: episodes per task greedy fails")
    ap.add_argument("--corrections", type=int, default=0, help="exit-mcts / exit-sampled: search-labelled corrections "
                                                                "at up to N failing steps of each greedy failure")
    ap.add_argument("--gate-split", default=None, help="the promotion gate's split (default: val, or none when "
                                                        "--split val: the gate must be held out of the evaluation)")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="orchard-loop-gain-"))
    tasks = held_out(args.test_tasks, args.split)
    train = {"learning_rate": args.sft_lr if args.method != "agentq" else args.lr, "epochs": args.epochs,
             "batch_size": 8, "num_threads": 2, "device": "cpu", "precision": "fp32"}
    search = loop_search(args, trees_in_flight=args.trees_in_flight,
                         **({"critic": False, "alpha": 1.0} if args.no_critic else {}))
    config = IterateConfig(
        method=args.method, model=args.model, iterations=args.iterations, tasks_per_iteration=args.tasks,
        seed=args.seed, eval_split=args.split, train_split="fit", eval_tasks=f"0:{len(tasks)}",
        gate_split=args.gate_split if args.gate_split is not None else ("" if args.split == "val" else "val"),
        include_pending=True,  # nobody curates a bench: the rows search produced, as the method builds them
        output_root=str(work / "models"), name=f"bench-{args.method}", search=search,
        dpo={**train, "beta": 0.1, "ref_source": "auto"} if args.method == "agentq" else {},
        sft=train if args.method != "agentq" else {}, distill={"per_tree": args.per_tree}, corrections=args.corrections,
        eval=greedy_settings(args),
        # exit-mcts plays with MCTS at inference: --simulations per real step (4 is the measured operator)
        play=({"seeds": [args.seed * 1000 + j for j in range(args.samples)]} if args.method == "exit-sampled" else
              {"mcts_simulations": args.simulations, "mcts_k": args.k, "mcts_backup": args.backup}),
    )
    table = Table(f"The loop's curve ({args.method}) vs the base policy, greedy on the same held-out TextCraft tasks",
                  {"model": args.model, "tasks": f"{args.split}[:{len(tasks)}]", "seed": args.seed,
                   "budget": (f"{args.iterations} x ({args.tasks} fit tasks, greedy; MCTS at inference on its failures, "
                              f"{args.simulations} simulations per real step, K={args.k}, critic on, {args.backup} backup)"
                              if args.method == "exit-mcts" else
                              f"{args.iterations} x ({args.tasks} fit tasks, greedy; {args.samples} sampled episodes of "
                              f"each failure, merged into a tree)" + (f", corrections at <= {args.corrections} failing "
                                                                       "steps per greedy failure" if args.corrections else "")
                              if args.method == "exit-sampled" else
                              f"{args.iterations} x ({args.tasks} fit tasks x {args.simulations} simulations, K={args.k}, "
                              f"depth {args.depth_limit}, critic {'off' if args.no_critic else 'on'}, {args.backup} backup)"),
                   "train": f"lr {train['learning_rate']}, {args.epochs} epochs, batch 8"},
                  bootstrap=args.bootstrap, seed=args.seed, constrained=args.constrained)
    table.header()
    began_cpu = time.process_time()
    with Store(work / "bench.db") as store:
        loop_id = run_loop(store, config)
        records = sorted(store.iterations(loop_id), key=lambda r: r["idx"])
        names = []
        for r in records:
            name = "base" if r["idx"] == 0 else f"iteration {r['idx']}"
            if "eval" not in r:
                print(f"  {name}: no model trained: {r.get('skipped')}")
                break
            ev = next(e for e in store.evaluations() if e["id"] == r["eval"]["eval_id"])
            table.add(name, ev["metrics"], stored_episodes(store, ev["id"]), r.get("seconds", 0.0), note=_note(store, r))
            names.append(name)
    if len(names) > 1:
        table.print_diffs([("base", n) for n in names[1:]] + list(itertools.pairwise(names[1:])))
    print(f"loop cpu time {time.process_time() - began_cpu:.0f} s in this process")
    table.footer()
    print(f"work folder {work}")
    return table


def _note(store: Store, r: dict) -> str:
    """Per iteration: data rows, the curation gate, tasks solved in search, simulations per second."""
    if r["idx"] == 0:
        return ""
    run = store.run(r["run_id"])
    sims = r["play"]["simulations"] if "play" in r else run.simulations
    search_s = r.get("search_s") or 0.0
    played = (f"greedy solved {r['play']['greedy_solved']}/{r['play']['tasks']}, MCTS solved "
              f"{r['play']['solved']}/{r['play']['played']} of the rest; ") if "play" in r else ""
    rows = r.get("samples", r.get("pairs", 0))
    train = r.get("train") or {}
    return (f"rows {rows} ({train.get('rows', '?')} step rows, {train.get('steps', '?')} optimizer steps); "
            f"{played}solved in search {run.solved}/{run.trees}; {sims} simulations, {sims / max(search_s, 1e-9):.2f}/s; "
            f"cpu {r.get('cpu_s', 0):.0f} s; gate: {(r.get('gate') or {}).get('why', 'none')}")


if __name__ == "__main__":
    main()
