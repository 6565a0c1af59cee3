"""Orchard's search design vs Agent-R's, same env, tasks and simulation budget: simulations per minute.

- Orchard: many trees in flight; against a server, each request goes out as soon as its tree needs
  it (no round barrier, `submit`), with a batched backend one batched call per round; env states
  restored from snapshots.
- Agent-R (as its MCTS runs): one tree at a time and one node expanded at a time, every request
  waited for before the next, the env replayed from reset for every expansion (no snapshots).

Against bench/delayed_server.py (concurrent requests do not slow each other, as on a GPU server)
the gain is the concurrency; with `--tiny` also on CPU with the embedded tiny model, where batches
barely speed the model up (the gain there is all batching).

    .venv/bin/python bench/search_design.py [--trees 32] [--simulations 2] [--time-scale 0.25] [--tiny]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from scale import start_server

from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.llm.openai_http import OpenAIGenerator
from engine.search.mcts import MCTS, start_tree


class NoSnapshot:
    """The env without snapshot/restore: every expansion replays from reset (Agent-R)."""

    def __init__(self, env) -> None:
        self._env = env

    def __getattr__(self, name: str):
        if name in ("snapshot", "restore"):
            raise AttributeError(name)
        return getattr(self._env, name)


class BatchOnly:
    """A generator seen through `sample` only (no `submit`): the round-barrier scheduler."""

    def __init__(self, gen) -> None:
        self.gen, self.name = gen, gen.name

    def sample(self, requests):
        return self.gen.sample(requests)

    def logprobs(self, prompts, completions):
        return self.gen.logprobs(prompts, completions)


def run(design: str, generator, trees: int, simulations: int) -> dict:
    make = env_factory("textcraft")
    tasks = make().tasks("train")[:trees]
    agent_r = design == "agent-r"
    make_env = (lambda: NoSnapshot(make())) if agent_r else make
    cfg = SearchConfig(simulations=simulations, k=4, depth_limit=5, seed=2, trees_in_flight=1 if agent_r else trees)
    jobs = [start_tree(t, make_env, cfg.simulations) for t in tasks]
    t = time.perf_counter()
    stats = MCTS(BatchOnly(generator) if agent_r else generator, cfg).run(jobs)
    wall = time.perf_counter() - t
    return {"wall": wall, "sims": stats.simulations, "per_min": 60 * stats.simulations / wall,
            "replays": stats.replays, "solved": sum(j.tree.solved() for j in jobs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=32)
    ap.add_argument("--simulations", type=int, default=2)
    ap.add_argument("--time-scale", type=float, default=0.25, help="scale the server's delays (1: as stated)")
    ap.add_argument("--tiny", action="store_true", help="also compare on CPU with the embedded tiny model")
    args = ap.parse_args()
    print(f"TextCraft, {args.trees} tasks x {args.simulations} simulations, k=4, depth 5")
    print(f"{'model':>22} {'design':>8} {'wall':>8} {'sims/min':>9} {'replays':>8} | gain")
    proc, url = start_server(args.time_scale)
    try:
        gen = OpenAIGenerator(url, "m", max_concurrency=64)
        rows = {d: run(d, gen, args.trees, args.simulations) for d in ("orchard", "agent-r")}
        gen.close()
    finally:
        proc.kill()
    _print(f"delayed server x{args.time_scale}", rows)
    if args.tiny:
        from engine.llm.tiny_checkpoint import tiny_generator

        gen = tiny_generator(log=lambda *a: None)
        _print("tiny (CPU)", {d: run(d, gen, args.trees, args.simulations) for d in ("orchard", "agent-r")})


def _print(model: str, rows: dict) -> None:
    gain = rows["orchard"]["per_min"] / rows["agent-r"]["per_min"]
    for d, r in rows.items():
        print(f"{model:>22} {d:>8} {r['wall']:>7.1f}s {r['per_min']:>9.0f} {r['replays']:>8}"
              + (f" | {gain:.1f}x" if d == "agent-r" else " |"), flush=True)


if __name__ == "__main__":
    main()
