"""Does a wider expansion let search solve the goals it never solves? Search on fit goals of one recipe depth.

Expert iteration distils only what search finds, and a 16-simulation search of the shipped policy solves
almost no depth-3 goal (1 of 54; 0 of 16 at 64 simulations). This bench searches `--tasks` fit goals of
`--depth` (drawn with `--seed`; fit tasks only, never val or test) once per arm `K:T` (K candidates per
expansion, expansion temperature T; rollouts at temperature 1, no critic, progress backup, constrained
decoding, as the 256-task searches; the search seed is SearchConfig's default), and prints per arm: goals solved, distinct readable candidates per
expansion (duplicates are dropped, so K=4 samples give fewer than 4 children) and wall time.

    .venv/bin/python bench/search_width.py [--depth 3] [--tasks 12] [--simulations 32] [--arms 4:1.0,8:1.0,4:1.5]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from engine.config import SearchConfig
from engine.datasets.samples import tree_refs
from engine.envs.textcraft import TextCraftEnv
from engine.llm.registry import load_generator
from engine.search.runner import new_run
from engine.store import Store


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--depth", type=int, default=3, help="recipe depth of the goals searched")
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--simulations", type=int, default=32)
    ap.add_argument("--arms", default="4:1.0,8:1.0,4:1.5", help="K:temperature, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    arms = []
    for arm in args.arms.split(","):
        k, _, temp = arm.partition(":")
        try:
            arms.append((int(k), float(temp)))
        except ValueError:
            ap.error(f"--arms: {arm!r} is not K:temperature")
    pool = [t for t in TextCraftEnv().tasks("fit") if t.meta.get("depth") == args.depth]
    if len(pool) < args.tasks:
        ap.error(f"--tasks {args.tasks}: only {len(pool)} fit goals of depth {args.depth}")
    tasks = random.Random(args.seed).sample(pool, args.tasks)
    print(f"{args.tasks} fit goals of depth {args.depth} (seed {args.seed}) x {args.simulations} simulations, "
          f"model {args.model}, no critic, progress backup, rollouts at T=1, constrained", flush=True)
    generator = load_generator(args.model)
    rows = []
    for k, temp in arms:
        cfg = SearchConfig(simulations=args.simulations, k=k, temperature=temp, depth_limit=10, max_tokens=160,
                           backup="progress", critic=False, alpha=1.0, constrained=True)
        with tempfile.TemporaryDirectory() as d, Store(Path(d) / "width.db") as store:
            t = time.perf_counter()
            run_id, _ = new_run(store, "textcraft", tasks, generator, cfg, "width", make_env=TextCraftEnv)
            wall = time.perf_counter() - t
            children = [sum(not tree.nodes[c].format_error for c in node.children)
                        for ref in tree_refs(store, run_id, TextCraftEnv().describe())
                        for tree in [ref.tree] for node in tree.nodes if node.children]
            row = {"k": k, "temperature": temp, "solved": store.run(run_id).solved, "wall_s": wall,
                   "children": sum(children) / max(len(children), 1), "expansions": len(children)}
        rows.append(row)
        print(f"  K={k} T={temp}: solved {row['solved']}/{args.tasks}, {row['children']:.2f} distinct readable "
              f"candidates per expansion ({row['expansions']} expansions), {wall:.0f} s", flush=True)
    return rows


if __name__ == "__main__":
    main()
