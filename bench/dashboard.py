"""Dashboard server-side cost for big trees: load from the store, tidy layout, plotly figure.

Builds synthetic MCTS-shaped SearchTrees (random branching 1-4, realistic composite actions,
observations, critic ranks, log-probs and terminals, every expansion followed by a simulation that is
back-propagated by the engine), writes each to a temporary store through the Store API, and times
what the Tree explorer does on a first view: `Store.load_tree`, `layout_tree`, `tree_figure`, and
the JSON serialisation Streamlit performs (`plotly.io.to_json`). Goals: 10k nodes < 1 s, 100k < 5 s.

    .venv/bin/python bench/dashboard.py [--sizes 1000 10000 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
logging.getLogger("streamlit").setLevel(logging.ERROR)  # "no runtime" notes from st.cache_* imports

import plotly.io as pio

from dashboard.data import read_tree
from dashboard.figures import tree_figure
from dashboard.layout import layout_tree
from engine.actions import CompositeAction, render
from engine.envs.base import TaskSpec
from engine.search.tree import SearchTree, Simulation
from engine.store import Store

T = TypeVar("T")
ITEMS = ["oak planks", "stick", "crafting table", "iron ingot", "cobblestone", "furnace", "torch", "chest"]


def synthetic_tree(n_nodes: int, seed: int = 0, depth_limit: int = 40) -> SearchTree:
    """An MCTS-like tree of about `n_nodes` nodes (random branching, one simulation per expansion)."""
    rng = random.Random(seed)
    task = TaskSpec(id=f"synthetic-{n_nodes}", goal="craft 1 chest", context="recipes ...")
    tree = SearchTree.new(task, "Crafting commands: get, craft, inventory. Goal: craft 1 chest.")
    open_leaves = [0]
    while len(tree.nodes) < n_nodes and open_leaves:
        parent = tree.nodes[open_leaves.pop(rng.randrange(len(open_leaves)))]
        k = rng.randint(1, 4)
        children = []
        for rank in range(k):
            item = rng.choice(ITEMS)
            if rng.random() < 0.05:
                children.append(tree.add_child(
                    parent, observation="Format error: no ACTION section. The environment was not stepped.",
                    raw="I think I should craft something", format_error="no ACTION section",
                    terminal="format_error", reward=0.0, logprob=-rng.uniform(5, 40), critic_rank=k - 1,
                    Q_critic=0.0, critic_reason="(format error: not shown to the critic)", n_tokens=12,
                ))
                continue
            action = CompositeAction(
                thought=f"I have what I need for {item}; next I craft it.",
                command=f"craft {rng.randint(1, 4)} {item} using {rng.randint(1, 3)} {rng.choice(ITEMS)}",
                explanation=f"This should give me {item}.",
                status="CONTINUE" if rng.random() < 0.97 else "SUCCESS",
                plan="1. get logs\n2. craft planks\n3. craft chest" if parent.parent is None else None,
            )
            depth = parent.depth + 1
            roll = rng.random()
            terminal = ("success" if roll < 0.04 else "failure" if roll < 0.08 else
                        "stopped" if action.status != "CONTINUE" else
                        "depth_limit" if depth >= depth_limit else None)
            children.append(tree.add_child(
                parent, action=action, raw=render(action),
                observation=f"Crafted {item}. Inventory: [{item}] ({rng.randint(1, 64)})"
                if rng.random() < 0.7 else "Could not find enough items to craft.",
                reward=1.0 if terminal == "success" else 0.0, progress=round(rng.random(), 2),
                terminal=terminal, logprob=-rng.uniform(5, 40), critic_rank=rank,
                Q_critic=1 - rank / max(1, k - 1), critic_reason=f"Candidate {rank + 1} moves toward the goal.",
                n_tokens=rng.randint(40, 120), gen_ms=rng.uniform(5, 50), env_ms=rng.uniform(0.1, 2),
            ))
        open_leaves += [c.id for c in children if c.terminal is None]
        leaf = rng.choice(children)
        reward = 1.0 if leaf.terminal == "success" or rng.random() < 0.2 else 0.0
        path = [n.id for n in tree.path(leaf)]
        tree.backpropagate(path, reward)
        tree.simulations.append(Simulation(tuple(path), reward))
    return tree


def write_store(path: Path, tree: SearchTree) -> int:
    """The whole tree in one transaction, through the Store API; returns its tree id."""
    with Store(path) as store:
        run_id = store.create_run("bench", "synthetic", "none", {"alpha": 0.5, "k": 4}, [tree.task])
        ((tree_id, _),) = store.tree_ids(run_id)
        store.save_simulation(tree_id, tree, tree.simulations[-1], first_new=0)
    return tree_id


def best_of(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    print(f"{'nodes':>8} {'load s':>8} {'layout s':>9} {'figure s':>9} {'total s':>8} {'json s':>7} "
          f"{'+json s':>8} {'json MB':>8}")
    layout_per_node: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            tree = synthetic_tree(size)
            db = Path(tmp) / f"bench-{size}.db"
            tree_id = write_store(db, tree)
            t_load, loaded = best_of(lambda db=db, tid=tree_id: read_tree(str(db), tid), args.repeat)
            assert loaded is not None and len(loaded.nodes) == len(tree.nodes)
            t_layout, lay = best_of(lambda t=loaded: layout_tree(t), args.repeat)
            t_fig, fig = best_of(lambda t=loaded, lay=lay: tree_figure(t, lay, "q", 0.5, t.best_path(0.5)),
                                 args.repeat)
            t_json, spec = best_of(lambda fig=fig: pio.to_json(fig.to_dict(), validate=False), args.repeat)
            total = t_load + t_layout + t_fig
            layout_per_node[len(loaded.nodes)] = t_layout / len(loaded.nodes)
            print(f"{len(loaded.nodes):>8} {t_load:>8.3f} {t_layout:>9.3f} {t_fig:>9.3f} {total:>8.3f} "
                  f"{t_json:>7.3f} {total + t_json:>8.3f} {len(spec) / 1e6:>8.1f}")
    sizes = sorted(layout_per_node)
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        ratio = layout_per_node[hi] * hi / (layout_per_node[lo] * lo)
        print(f"layout {lo} -> {hi} nodes ({hi / lo:.0f}x): time x{ratio:.1f}, "
              f"per node {layout_per_node[lo] * 1e6:.2f} -> {layout_per_node[hi] * 1e6:.2f} us "
              f"(linear keeps per-node time flat; quadratic would be x{(hi / lo) ** 2:.0f})")


if __name__ == "__main__":
    main()
