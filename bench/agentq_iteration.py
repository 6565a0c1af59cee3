"""One Agent Q iteration on the embedded default, measured: does it improve the tiny model?

Runs Algorithm 1 once (`engine.train.iterate.run_loop`): MCTS with the tiny model on B train tasks,
step pairs (eq. 10, theta), DPO with the replay buffer's log-probs as reference, then greedy
evaluation of the base and the trained model on every held-out (test) task, and, as a check of
whether DPO learned anything at all, on the B train tasks that were searched. Prints:
- search: simulations that reached reward 1, simulations with partial value, tasks solved;
- pairs: how many, and how many are rollout-grounded (the two actions differ in Q~, i.e. the MCTS
  value, not only in the critic's Q^);
- before / after: success, progress and loop rate with 95% bootstrap intervals over tasks.

    .venv/bin/python bench/agentq_iteration.py [--backup reward|progress] [--alpha 0.5] [--tasks 32]
        [--simulations 16] [--lr 5e-5] [--epochs 2] [--iterations 1] [--seed 0]

About 10-15 minutes per iteration on 2 CPU cores (the tiny model must be built, or is built first).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig, evaluate
from engine.llm.registry import load_generator
from engine.store import Store
from engine.train.iterate import IterateConfig, run_loop


def ci(m: dict) -> str:
    return f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backup", choices=("reward", "progress"), default="reward")
    ap.add_argument("--alpha", type=float, default=0.5, help="eq. 10 weight of Q~ for the pairs")
    ap.add_argument("--tasks", type=int, default=32, help="B train tasks searched")
    ap.add_argument("--simulations", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--iterations", type=int, default=1, help="Algorithm 1 iterations (each model is the next pi_ref)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="orchard-agentq-"))
    config = IterateConfig(
        method="agentq", model="tiny", iterations=args.iterations, tasks_per_iteration=args.tasks, seed=args.seed,
        output_root=str(work / "models"), name="bench-agentq",
        search={"simulations": args.simulations, "k": 4, "depth_limit": 10, "max_tokens": 160,
                "backup": args.backup, "alpha": args.alpha},
        dpo={"learning_rate": args.lr, "epochs": args.epochs, "batch_size": 8, "beta": 0.1, "num_threads": 2,
             "device": "cpu", "precision": "fp32"},
        eval={"mode": "greedy", "max_steps": 15, "max_tokens": 160},
    )
    began = time.perf_counter()
    print(f"config: backup={args.backup} alpha={args.alpha} tasks={args.tasks} T={args.simulations} "
          f"lr={args.lr} epochs={args.epochs} iterations={args.iterations} seed={args.seed}")
    with Store(work / "bench.db") as store:
        loop_id = run_loop(store, config)
        base, *iterations = sorted(store.iterations(loop_id), key=lambda r: r["idx"])
        for it in iterations:
            print(f"iteration {it['idx']}:")
            search_stats(store, it["run_id"])
            if "eval" not in it:
                print(f"  no model trained: {it.get('skipped')}")
                return
            print(f"  held-out (test, {len(TextCraftEnv().tasks('test'))} tasks, greedy):")
            for key in ("success", "progress", "loop_rate"):
                print(f"    {key:<9} before {ci(base['eval'][key])}  after {ci(it['eval'][key])}")
    last = iterations[-1]
    env = TextCraftEnv()
    searched = [env.task(t) for t in last["tasks"]]
    cfg = EvalConfig(mode="greedy", max_steps=15, max_tokens=160)
    print(f"train tasks searched in the last iteration ({len(searched)}, greedy):")
    before = evaluate(load_generator("tiny"), TextCraftEnv, searched, cfg).metrics
    after = evaluate(load_generator(last["model"]), TextCraftEnv, searched, cfg).metrics
    for key in ("success", "progress", "loop_rate"):
        print(f"  {key:<9} before {ci(before[key])}  after {ci(after[key])}")
    print(f"total {time.perf_counter() - began:.0f} s; work folder {work}")


def search_stats(store: Store, run_id: int) -> None:
    """Simulations that reached reward, tasks solved, and how many pairs the rollouts ground."""
    run = store.run(run_id)
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
    print(f"  search: {sims} simulations, {reached} reached reward 1, {partial} partial; "
          f"{run.solved}/{run.trees} tasks solved in search")
    print(f"  pairs: {len(pairs)} step pairs, {grounded} rollout-grounded (Q~ differs), "
          f"{len(pairs) - grounded} ordered by the critic alone")


if __name__ == "__main__":
    main()
