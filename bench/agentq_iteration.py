"""Agent Q iterations on the embedded default, measured: does each one improve the policy?

Runs Algorithm 1 (`engine.loop.run_loop`, docs/algorithms.md §3), `--iterations` times (2 by
default): MCTS with the critic and reward backup on B train tasks, step pairs by eq. 10 and theta, DPO
with the replay buffer's stored log-probs as the reference, then greedy evaluation on the first
`--test-tasks` held-out tasks. The base model and every iteration's model are evaluated on the SAME
held-out tasks with the same evaluation; the table gives each with its 95% interval and the PAIRED
bootstrap interval of each gain (iteration 1 - base, iteration 2 - base, iteration 2 - iteration 1).
It also prints per iteration: simulations that reached reward 1, tasks solved in search, pairs (and
how many are rollout-grounded: the two actions differ in Q~, not only in the critic's Q^), and the
DPO reference's source, and the pairs checked against the expert (`bench/pair_check.py`: right vs
inverted); and, as a check of whether DPO learned anything at all, the last model on
the train tasks it searched. No model is selected on the test split: the last iteration is reported.

    .venv/bin/python bench/agentq_iteration.py [--model tiny] [--tasks 16] [--simulations 12]
        [--iterations 2] [--test-tasks 32] [--backup reward|progress] [--alpha 0.5] [--lr 5e-5]
        [--epochs 2] [--seed 0]

Sized for the 30-minute bench budget on 2 CPU cores: 26 minutes with the shipped 5.3M tiny model on
a host shared with a second bench (the wall time it prints is the measure).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    Table,
    add_common_args,
    add_loop_args,
    ci,
    greedy_config,
    greedy_settings,
    held_out,
    loop_search,
    stored_episodes,
)
from bench.pair_check import check_pairs, summary
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import evaluate
from engine.llm.registry import load_generator
from engine.loop import IterateConfig, run_loop
from engine.store import Store


def main(argv: list[str] | None = None) -> Table:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=32)
    add_loop_args(ap)
    ap.add_argument("--alpha", type=float, default=0.5, help="eq. 10 weight of Q~ for the pairs")
    ap.add_argument("--theta", type=float, default=0.1, help="minimum value gap of a step pair")
    ap.add_argument("--iterations", type=int, default=2, help="Algorithm 1 iterations (each model is the next pi_ref)")
    ap.add_argument("--check-train", action="store_true", help="also evaluate the last model on its searched tasks")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="orchard-agentq-"))
    tasks = held_out(args.test_tasks, args.split)
    config = IterateConfig(
        method="agentq", model=args.model, iterations=args.iterations, tasks_per_iteration=args.tasks,
        seed=args.seed, theta=args.theta, eval_split=args.split, train_split="fit", eval_tasks=f"0:{len(tasks)}", evaluate_base=False, output_root=str(work / "models"),
        name="bench-agentq",
        search=loop_search(args, alpha=args.alpha),
        dpo={"learning_rate": args.lr, "epochs": args.epochs, "batch_size": 8, "beta": 0.1, "num_threads": 2,
             "device": "cpu", "precision": "fp32", "ref_source": "auto"},
        eval=greedy_settings(args),
    )
    table = Table("Agent Q iterations vs the base policy, greedy on the same held-out TextCraft tasks",
                  {"model": args.model, "tasks": f"{args.split}[:{len(tasks)}]", "seed": args.seed,
                   "budget": f"{args.iterations} x ({args.tasks} train tasks x {args.simulations} simulations, "
                             f"K={args.k}, depth {args.depth_limit})",
                   "search": f"critic on, {args.backup} backup", "pairs": f"eq. 10 alpha={args.alpha} "
                   f"theta={args.theta}", "dpo": f"lr {args.lr}, {args.epochs} epochs, beta 0.1, stored reference"},
                  bootstrap=args.bootstrap, seed=args.seed, constrained=args.constrained)
    table.header()
    # The base is scored by the loop's own EvalConfig, so every arm has the same evaluation.
    table.evaluate("base", load_generator(args.model), TextCraftEnv, tasks, config.eval_config())
    with Store(work / "bench.db") as store:
        loop_id = run_loop(store, config)
        iterations = sorted(store.iterations(loop_id), key=lambda r: r["idx"])
        names = ["base"]
        for it in iterations:
            search_stats(store, it)
            if "eval" not in it:
                print(f"  iteration {it['idx']}: no model trained: {it.get('skipped')}")
                break
            name = f"iteration {it['idx']}"
            table.add(name, *_arm(store, it, it.get("seconds", 0.0)), note="(search + pairs + DPO + eval)")
            names.append(name)
    diffs = [("base", n) for n in names[1:]] + [(a, b) for a, b in itertools.pairwise(names[1:])]
    if diffs:
        table.print_diffs(diffs)
    if args.check_train and len(names) > 1:
        searched = [TextCraftEnv().task(t) for t in iterations[len(names) - 2]["tasks"]]
        cfg = greedy_config(args)
        print(f"train tasks searched in the last iteration ({len(searched)}, greedy):")
        before = evaluate(load_generator(args.model), TextCraftEnv, searched, cfg).metrics
        after = evaluate(load_generator(iterations[len(names) - 2]["model"]), TextCraftEnv, searched, cfg).metrics
        for key in ("success", "progress", "loop_rate"):
            print(f"  {key:<9} before {ci(before[key])}  after {ci(after[key])}")
    table.footer()
    print(f"work folder {work}")
    return table


def _arm(store: Store, record: dict, seconds: float) -> tuple[dict, list, float]:
    ev = next(e for e in store.evaluations() if e["id"] == record["eval"]["eval_id"])
    return ev["metrics"], stored_episodes(store, ev["id"]), seconds


def search_stats(store: Store, it: dict) -> None:
    """Simulations that reached reward, tasks solved, pairs and how many the rollouts ground."""
    run = store.run(it["run_id"])
    sims = reached = partial = grounded = 0
    trees = {}
    for tree_id, _ in store.tree_ids(run.id):
        trees[tree_id] = tree = store.load_tree(tree_id)
        for sim in tree.simulations:
            sims += 1
            reached += sim.reward >= 1.0
            partial += 0.0 < sim.reward < 1.0
    pairs = store.pairs(run_id=run.id, kind=["step"])
    for p in pairs:
        tree = trees[p.tree_id]
        grounded += abs(tree.nodes[p.chosen_node].Q_mcts - tree.nodes[p.rejected_node].Q_mcts) > 1e-9
    train = it.get("train") or {}
    print(f"  iteration {it['idx']}: search {sims} simulations, {reached} reached reward 1, {partial} partial, "
          f"{run.solved}/{run.trees} tasks solved, {it.get('search_s', 0):.0f} s; {len(pairs)} step pairs "
          f"({grounded} rollout-grounded); DPO reference: {train.get('ref_stored', 0)} stored, "
          f"{train.get('ref_computed', 0)} computed", flush=True)
    print(f"  iteration {it['idx']}: {summary(check_pairs(store, pairs, trees))}", flush=True)


if __name__ == "__main__":
    main()
