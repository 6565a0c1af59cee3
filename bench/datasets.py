"""Dataset building speed: step pairs from one 100k-node tree (goal: under 2 s), plus the cost of
saving them to the store and exporting them as TRL DPO rows.

The tree is synthetic but shaped like a search tree: K=4 children per expanded node, visit counts
decreasing with depth, a critic score on every child, TextCraft-like composite actions and
observations. Prints nodes, pairs, seconds and pairs per second for each stage.

    .venv/bin/python bench/datasets.py [--nodes 100000] [--no-store]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.actions import CompositeAction, render
from engine.datasets.formats import dpo_rows, write_rows
from engine.datasets.pairs import PairsConfig, step_pairs
from engine.datasets.samples import TreeRef
from engine.envs.base import TaskSpec
from engine.tree_nodes import SearchTree

ITEMS = ["oak planks", "stick", "crafting table", "iron ingot", "cobblestone", "oak log", "torch", "coal"]


def synthetic_tree(n_nodes: int, k: int = 4, seed: int = 0) -> SearchTree:
    """A breadth-first grown tree of `n_nodes` nodes with K children per expanded node."""
    rng = random.Random(seed)
    tree = SearchTree.new(TaskSpec(id="bench-0", goal="craft 1 wooden pickaxe", context="Crafting commands: ..."),
                          "Crafting commands:\n" + "\n".join(f"craft 1 {i} using 2 {j}" for i in ITEMS for j in ITEMS[:3]))
    frontier = [tree.root]
    tree.root.N = n_nodes
    head = 0
    while len(tree.nodes) < n_nodes:
        parent = frontier[head]
        head += 1
        for r in range(k):
            if len(tree.nodes) >= n_nodes:
                break
            item = rng.choice(ITEMS)
            action = CompositeAction(
                thought=f"I need {item} next; my inventory has {rng.randint(0, 9)} of it.",
                command=f"craft {rng.randint(1, 4)} {item} using {rng.randint(1, 3)} {rng.choice(ITEMS)}",
                explanation=f"Getting {item} moves me closer to the goal.",
                plan="1. get logs\n2. craft planks\n3. craft sticks\n4. craft the pickaxe" if parent.id == 0 else None,
            )
            visits = max(0, parent.N // k - rng.randint(0, 2)) if parent.N else 0
            child = tree.add_child(
                parent, observation=f"Crafted {item}. Inventory: [{item}] ({rng.randint(1, 9)})",
                action=action, raw=render(action), N=visits, value_sum=visits * rng.random(),
                Q_critic=1.0 - r / (k - 1), critic_rank=r, logprob=-rng.uniform(5, 40),
            )
            frontier.append(child)
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--no-store", action="store_true", help="skip the store and export stages")
    args = ap.parse_args()

    t = time.perf_counter()
    tree = synthetic_tree(args.nodes)
    print(f"tree: {len(tree.nodes)} nodes, depth {max(n.depth for n in tree.nodes)}, "
          f"built in {time.perf_counter() - t:.2f}s")
    ref = TreeRef(tree=tree, run_id="bench", tree_id=None, env_description="Crafting in a Minecraft-like world.")

    t = time.perf_counter()
    pairs = step_pairs(ref, PairsConfig())
    dt = time.perf_counter() - t
    print(f"step pairs: {len(pairs)} pairs from {len(tree.nodes)} nodes in {dt:.2f}s "
          f"({len(pairs) / dt:,.0f} pairs/s, {len(tree.nodes) / dt:,.0f} nodes/s; goal < 2 s) "
          f"{'OK' if dt < 2.0 else 'SLOW'}")
    if args.no_store:
        return

    from engine.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        with Store(Path(tmp) / "bench.db") as store:
            run_id = store.create_run("bench", "bench", "none", {}, [tree.task])
            (tree_id, _), = store.tree_ids(run_id)
            pairs = [p.__class__(**{**p.__dict__, "run_id": run_id, "tree_id": tree_id}) for p in pairs]
            t = time.perf_counter()
            report = store.save_pairs(run_id, pairs)
            dt = time.perf_counter() - t
            print(f"store: saved {report.created} pairs in {dt:.2f}s ({report.created / dt:,.0f} pairs/s)")
            t = time.perf_counter()
            report = store.save_pairs(run_id, pairs)
            dt = time.perf_counter() - t
            print(f"store: rebuilt (unchanged: {report.unchanged}) in {dt:.2f}s")
            t = time.perf_counter()
            loaded = store.pairs(run_id=run_id)
            dt = time.perf_counter() - t
            print(f"store: loaded {len(loaded)} pairs in {dt:.2f}s")
        out = Path(tmp) / "pairs.parquet"
        t = time.perf_counter()
        write_rows(dpo_rows(loaded), out)
        dt = time.perf_counter() - t
        print(f"export: {len(loaded)} DPO rows to Parquet ({out.stat().st_size / 1e6:.1f} MB) in {dt:.2f}s")


if __name__ == "__main__":
    main()
