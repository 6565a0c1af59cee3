"""Committing a search's simulations: one transaction per simulation vs one per scheduler round.

engine/search/runner.py now commits every simulation a batch of replies finished in one transaction
(`Store.save_simulations`). This replays the same writes both ways on a fresh SQLite file each: T
synthetic TextCraft-like trees (bench/dashboard.py's generator) of S simulations, simulation j of a
tree inserting its share of the tree's nodes and updating a path's values, in rounds of one simulation
per tree (the round-barrier scheduler's shape). Prints ms per simulation both ways and the ratio.

    .venv/bin/python bench/commit_batch.py [--trees 64] [--simulations 24] [--nodes 96] [--repeat 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.dashboard import synthetic_tree
from engine.store import Store
from engine.store.runs import SimulationRows, simulation_rows


def rounds(trees: int, sims: int, nodes: int) -> tuple[list, list[list[tuple[int, SimulationRows]]]]:
    """(trees, rounds): round r holds simulation r of every tree as (tree index, rows)."""
    grown = [synthetic_tree(nodes, seed=t) for t in range(trees)]
    for t, tree in enumerate(grown):  # one task each (a run holds a task once)
        tree.task = dataclasses.replace(tree.task, id=f"{tree.task.id}-{t}")
    out: list[list[tuple[int, SimulationRows]]] = [[] for _ in range(sims)]
    for t, tree in enumerate(grown):
        n = len(tree.nodes)
        for r in range(sims):
            first, last = r * n // sims, (r + 1) * n // sims
            rows = simulation_rows(0, tree, tree.simulations[-1], first)
            rows = dataclasses.replace(rows, nodes=rows.nodes[: last - first],
                                       observations=rows.observations[: last - first],
                                       simulation=(0, r, *rows.simulation[2:]), tree=(r + 1, 0, 0))
            out[r].append((t, rows))
    return grown, out


def replay(path: Path, grown: list, plan: list[list[tuple[int, SimulationRows]]], batched: bool) -> float:
    """Seconds to write every round's simulations, per simulation or per round."""
    with Store(path) as store:
        run_id = store.create_run("bench", "synthetic", "none", {"alpha": 0.5, "k": 4}, [t.task for t in grown])
        ids = [tree_id for tree_id, _ in store.tree_ids(run_id)]

        def bind(t: int, rows: SimulationRows) -> SimulationRows:
            tid = ids[t]
            return dataclasses.replace(
                rows, nodes=[(tid, *r[1:]) for r in rows.nodes], values=[(*r[:2], tid, r[3]) for r in rows.values],
                simulation=(tid, *rows.simulation[1:]), tree=(*rows.tree[:2], tid), ranks=[], media=[])

        bound = [[bind(t, rows) for t, rows in rnd] for rnd in plan]
        t0 = time.perf_counter()
        for rnd in bound:
            if batched:
                store.save_simulations(rnd)
            else:
                for rows in rnd:
                    store.save_simulations([rows])
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", type=int, default=64)
    ap.add_argument("--simulations", type=int, default=24)
    ap.add_argument("--nodes", type=int, default=96, help="nodes per synthetic tree")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    grown, plan = rounds(args.trees, args.simulations, args.nodes)
    total = args.trees * args.simulations
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name, batched in (("per simulation", False), ("per round", True)):
                s = replay(Path(tmp) / f"{name.replace(' ', '-')}-{i}.db", grown, plan, batched)
                best[name] = min(best.get(name, float("inf")), s)
    print(f"{args.trees} trees x {args.simulations} simulations ({total}), ~{args.nodes} nodes a tree, SQLite "
          f"file, best of {args.repeat}:")
    for name, s in best.items():
        print(f"  one transaction {name:<15} {1000 * s / total:7.3f} ms per simulation ({s:.2f} s)")
    print(f"ratio: {best['per simulation'] / best['per round']:.1f}x less commit time per simulation")
    return best


if __name__ == "__main__":
    main()
