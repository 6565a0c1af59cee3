"""Engine overhead of MCTS: microseconds per simulation spent outside generation and env steps.

Runs real MCTS on TextCraft train tasks with an instant generator (canned composite actions, no
model), for 1, 16 and 256 trees in flight, committing every simulation to a real SQLite store.
Prints engine time per simulation and per batched call, and that per-call time as a share of a
realistic 50 ms batched LLM call (goal: below 1%), for the round-barrier scheduler (a batched
backend) and, at 256 trees, the no-barrier one (a backend with `submit`; here done futures): the
two alternate run by run, each row is the median run, and the last line is their ratio.

    .venv/bin/python bench/search_overhead.py [--simulations 8] [--repeat 3] [--cpu]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.llm.base import Completion
from engine.search.runner import new_run
from engine.store import Store

LLM_CALL_S = 0.050
COMMANDS = ["inventory", "get 1 oak log", "get 2 cobblestone", "craft 4 oak planks using 1 oak log",
            "craft 4 stick using 2 oak planks", "get 1 iron ingot"]


class InstantGenerator:
    """Canned but valid composite actions; critic answers name candidate 1. Costs ~nothing."""

    name = "instant"

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def sample(self, requests):
        out = []
        for req in requests:
            if "CANDIDATES:" in req.prompt[-1]["content"]:
                out.append([Completion("REASON: closest to the goal.\nBEST: 1", -1.0, n_tokens=10)] * req.n)
                continue
            out.append([
                Completion(
                    f"THOUGHT: next.\nACTION: {self.rng.choice(COMMANDS)}\nEXPLANATION: progress.\nSTATUS: CONTINUE",
                    -5.0, n_tokens=20)
                for _ in range(req.n)
            ])
        return out

    def logprobs(self, prompts, completions):
        return [None] * len(completions)


class InstantSubmitGenerator(InstantGenerator):
    """The same answers through `submit` (no round barrier), each future done at once."""

    def submit(self, request, affinity=None) -> Future:
        fut: Future = Future()
        fut.set_result(self.sample([request])[0])
        return fut


def measure(trees: int, simulations: int, db: Path, generator=None) -> dict:
    make_env = env_factory("textcraft")
    uniq = make_env().tasks("train")[:trees]  # a run holds each task once
    cfg = SearchConfig(simulations=simulations, k=4, depth_limit=10, trees_in_flight=trees)
    with Store(db) as store:
        _, stats = new_run(store, "textcraft", uniq, generator or InstantGenerator(), cfg, f"bench-{trees}", make_env=make_env)
    per_sim_us = 1e6 * stats.engine_s / stats.simulations
    per_call_s = stats.engine_s / stats.rounds
    return {
        "trees": len(uniq), "simulations": stats.simulations, "rounds": stats.rounds,
        "mean_batch": stats.to_dict()["mean_batch"], "engine_us_per_sim": per_sim_us,
        "commit_us_per_sim": 1e6 * stats.commit_s / stats.simulations,
        "env_us_per_sim": 1e6 * stats.env_s / stats.simulations,
        "engine_ms_per_call": 1e3 * per_call_s, "share_of_llm_call": per_call_s / LLM_CALL_S,
        "outside_share": (stats.engine_s + stats.commit_s) / max(stats.wall_s, 1e-9),
    }


def _row(kind: str, r: dict, spread: str = "") -> str:
    return (f"{kind:>10} {r['trees']:>5} {r['simulations']:>6} {r['mean_batch']:>6.1f} {r['engine_us_per_sim']:>14.0f} "
            f"{r['commit_us_per_sim']:>14.0f} {r['env_us_per_sim']:>11.0f} {r['engine_ms_per_call']:>15.2f} "
            f"{100 * r['share_of_llm_call']:>12.2f}%{spread}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--simulations", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per row (1 and 16 trees: the fastest is shown); at 256 trees, pairs of runs")
    ap.add_argument("--cpu", action="store_true",
                    help="time with the main thread's CPU clock, not the wall clock (steady on a busy machine)")
    args = ap.parse_args()
    if args.cpu:
        import types

        from engine.search import mcts

        mcts.time = types.SimpleNamespace(perf_counter=time.thread_time)  # type: ignore[assignment]
    print(f"{'scheduler':>10} {'trees':>5} {'sims':>6} {'batch':>6} {'engine us/sim':>14} {'commit us/sim':>14} "
          f"{'env us/sim':>11} {'engine ms/call':>15} {'vs 50ms call':>13}")
    with tempfile.TemporaryDirectory() as d:
        for trees in (1, 16):
            r = min((measure(trees, args.simulations, Path(d) / f"r{trees}-{j}.db") for j in range(args.repeat)),
                    key=lambda r: r["engine_us_per_sim"])
            print(_row("rounds", r))
        # At 256 trees the two schedulers alternate run by run, so a machine whose speed drifts (a
        # shared host) slows both alike; each row is the median run, the ratio the median of the pairs'.
        pairs = [(measure(256, args.simulations, Path(d) / f"p{j}-r.db", InstantGenerator()),
                  measure(256, args.simulations, Path(d) / f"p{j}-n.db", InstantSubmitGenerator()))
                 for j in range(args.repeat)]
        for kind, runs in (("rounds", [p[0] for p in pairs]), ("no-barrier", [p[1] for p in pairs])):
            us = sorted(r["engine_us_per_sim"] for r in runs)
            median = min(runs, key=lambda r: abs(r["engine_us_per_sim"] - statistics.median(us)))
            print(_row(kind, median, f"  (median of {len(us)}: {us[0]:.0f}-{us[-1]:.0f})"))
        ratio = statistics.median(n["engine_us_per_sim"] / r["engine_us_per_sim"] for r, n in pairs)
        print(f"no-barrier / rounds engine time per simulation at 256 trees: {ratio:.2f} (median of {len(pairs)} pairs)")


if __name__ == "__main__":
    main()
