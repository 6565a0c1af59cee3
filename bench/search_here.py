"""The cost of "search here" on a big stored tree: seconds from asking for it to the first new node
committed (engine/search/steer.py), on a TextCraft tree of about 10k nodes.

The tree is grown first by a real MCTS on one TextCraft task with the instant generator of
bench/search_overhead.py (canned valid composite actions: no model), committed to a SQLite store as
a search commits it. Then "search here" runs at the deepest open node of the most-visited path:
the tree is read back from the store, the env restored there (replay from reset: a stored tree
keeps no env snapshots), one expansion and rollout by the same instant generator, and the commit.
Prints the phases (tree read, env restore, to first commit) as medians of --repeat runs.

    .venv/bin/python bench/search_here.py [--nodes 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.search_overhead import InstantGenerator
from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.progress import MemoryReporter
from engine.search.runner import new_run
from engine.search.steer import SearchHere, open_target, run_steer
from engine.store import Store


class FirstCommit(MemoryReporter):
    """Notes the time of the first progress report after a simulation (it follows the commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: float | None = None

    def progress(self, data: dict[str, Any]) -> None:
        super().progress(data)
        if self.first is None and (data.get("step") or 0) >= 1:
            self.first = time.perf_counter()


def grow(store: Store, nodes: int) -> tuple[str, str]:
    """A run of one TextCraft task grown to about `nodes` nodes."""
    make_env = env_factory("textcraft")
    task = make_env().tasks("train")[0]
    # k=8 samples of 6 canned commands: about 4 new children per simulation (measured), one expansion a simulation
    config = SearchConfig(simulations=nodes // 4 + 1, k=8, depth_limit=12, critic=False)
    run_id, _ = new_run(store, "textcraft", [task], InstantGenerator(), config, "bench-search-here",
                        make_env=make_env)
    return run_id, task.id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "o.db") as store:
        t = time.perf_counter()
        run_id, task = grow(store, args.nodes)
        grown_s = time.perf_counter() - t
        target = open_target(store, run_id, task, 0)
        tree = target.tree
        path = [0, *tree.best_path(target.config.alpha)]
        at = next(n for n in reversed(path) if tree.nodes[n].terminal is None)
        print(f"tree: {len(tree.nodes)} nodes, {len(tree.simulations)} simulations (grown in {grown_s:.1f}s); "
              f"search here at node {at}, depth {tree.nodes[at].depth}")
        reads, restores, firsts = [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            opened = open_target(store, run_id, task, at)
            reads.append(time.perf_counter() - t0)
            env = env_factory("textcraft")()
            t1 = time.perf_counter()
            env.reset(task)
            for command in opened.tree.commands(opened.tree.nodes[at]):
                env.step(command)
            restores.append(time.perf_counter() - t1)
            reporter = FirstCommit()
            t2 = time.perf_counter()
            run_steer(store, SearchHere(run=run_id, task=task, at=at, simulations=1), reporter,
                      generator=InstantGenerator())
            assert reporter.first is not None
            firsts.append(reporter.first - t2)
        grown = open_target(store, run_id, task, 0).tree
        assert grown.check_invariants() == [], grown.check_invariants()[:3]
        print(f"median of {args.repeat}: tree read {statistics.median(reads) * 1000:.0f} ms · env restore "
              f"(replay of {tree.nodes[at].depth} steps) {statistics.median(restores) * 1000:.1f} ms · "
              f"time to the first new node committed {statistics.median(firsts) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
