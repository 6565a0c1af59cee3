"""The cost of putting two trees of one task side by side (engine/search/compare_trees.py) on
bench/dashboard.py's synthetic MCTS-shaped trees, in memory: two trees of other seeds (only the
root's path shared) and a tree against a copy of itself (every node matched). Best of --repeat.

    .venv/bin/python bench/compare_trees.py [--nodes 10000 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dashboard import synthetic_tree
from engine.search.compare_trees import compare_trees


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for n in args.nodes:
        a = synthetic_tree(n, seed=1)
        for label, b in (("other seed", synthetic_tree(n, seed=2)), ("same tree", synthetic_tree(n, seed=1))):
            b.task = a.task  # one task: the synthetic trees name theirs by size only
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                c = compare_trees(a, b)
                times.append(time.perf_counter() - t0)
            print(f"{len(a.nodes):>7} nodes · {label:<10} · {min(times) * 1000:6.0f} ms · {len(c.rows)} depths · "
                  f"{c.matched} matched · first parting {c.first_parting}")


if __name__ == "__main__":
    main()
