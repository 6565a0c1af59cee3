"""Search wall time against a delayed OpenAI-compatible server: round barrier vs no barrier.

Starts bench/delayed_server.py as a local process (answers after 50 ms + 2.5 ms per token of the
longest of n completions, no slow-down under concurrency, as a GPU server with continuous
batching), runs MCTS on TextCraft train tasks through OpenAIGenerator with both schedulers, and
prints for trees 16/64 x concurrency limit 8/64: wall time, share (mean requests in flight /
limit) and the no-barrier bound max(total request time / limit, longest tree's chain of requests).
Both schedulers get the same trees (per-request-seeded answers), so they send the same requests.
With `--workers 1,2,4` (needs orchard[ray]) it also searches on a local Ray cluster with W shards, each
with its own client (limit 8), and prints simulations/s and the scaling efficiency
(rate at W / (W x rate at 1)).

    .venv/bin/python bench/scale.py [--simulations 2] [--time-scale 1.0] [--workers 1,2,4] [--no-table]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from delayed_server import request_delay

from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.llm.openai_http import OpenAIGenerator
from engine.search.mcts import MCTS, start_tree


class Metered:
    """Wraps an OpenAIGenerator; adds up each request's server delay (total and per tree)."""

    def __init__(self, gen: OpenAIGenerator, time_scale: float) -> None:
        self.gen, self.scale, self.name = gen, time_scale, gen.name
        self.total = 0.0
        self.chain: dict[object, float] = defaultdict(float)
        self.lock = threading.Lock()

    def _meter(self, req, affinity=None) -> None:
        d = self.scale * request_delay(self.gen._payload(req, req.n, 0))
        with self.lock:
            self.total += d
            self.chain[affinity] += d

    def sample(self, requests):
        for r in requests:
            self._meter(r)
        return self.gen.sample(requests)

    def submit(self, request, affinity=None):
        self._meter(request, affinity)
        return self.gen.submit(request, affinity)

    def logprobs(self, prompts, completions):
        return self.gen.logprobs(prompts, completions)


def start_server(time_scale: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "delayed_server.py"), "--port", "0",
                             "--time-scale", str(time_scale)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"delayed server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


def search(url: str, trees: int, limit: int, simulations: int, time_scale: float, rounds: bool) -> dict:
    make_env = env_factory("textcraft")
    tasks = make_env().tasks("train")[:trees]
    cfg = SearchConfig(simulations=simulations, k=4, depth_limit=5, trees_in_flight=trees, seed=1)
    gen = Metered(OpenAIGenerator(url, "m", max_concurrency=limit), time_scale)
    jobs = [start_tree(t, make_env, cfg.simulations) for t in tasks]
    t = time.perf_counter()
    stats = MCTS(gen, cfg, rounds=rounds).run(jobs)
    wall = time.perf_counter() - t
    gen.gen.close()
    return {"wall": wall, "share": gen.total / (wall * limit), "total": gen.total,
            "chain": max(gen.chain.values()), "requests": stats.requests, "sims": stats.simulations}


def workers(url: str, counts: list[int], trees: int, simulations: int) -> None:
    """Ray shards against the delayed server: simulations/s per worker count (each run its own store)."""
    import tempfile

    import ray

    from engine.search.ray_search import prepare_run_on_ray
    from engine.store import Store

    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"py_modules": [str(HERE.parent / "engine")]})
    tasks = env_factory("textcraft")().tasks("train")[:trees]
    cfg = SearchConfig(simulations=simulations, k=4, depth_limit=5, trees_in_flight=trees, seed=1)

    @ray.remote(num_cpus=1)
    def warm() -> None:  # start and import in every worker process first: Ray reuses them for the shards
        from engine.search import ray_search  # noqa: F401

        env_factory("textcraft")().tasks("train")

    ray.get([warm.remote() for _ in range(max(counts))])
    print(f"\nRay: {trees} trees x {simulations} simulations, a client with limit 8 per worker (workers warm)")
    print(f"{'workers':>7} {'wall':>8} {'sims/s':>7} {'efficiency':>10} {'first sim at':>12}")
    base = None
    with tempfile.TemporaryDirectory() as d:
        for w in counts:
            with Store(Path(d) / f"w{w}.db") as store:
                first: list[float] = []
                search = prepare_run_on_ray(store, "textcraft", tasks, f"openai:{url}#m?concurrency=8", cfg,
                                            f"w{w}", shards=w,
                                            progress=lambda job, sim, first=first: first or first.append(time.perf_counter()))
                t = time.perf_counter()
                stats = search.run()
                wall = time.perf_counter() - t
            rate = stats.simulations / wall
            base = base or rate
            print(f"{w:>7} {wall:>7.1f}s {rate:>7.2f} {rate / (w * base):>10.2f} {first[0] - t:>11.1f}s", flush=True)
    ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulations", type=int, default=2)
    ap.add_argument("--time-scale", type=float, default=1.0, help="scale every server delay (below 1: quicker)")
    ap.add_argument("--workers", help="also search on a local Ray cluster with these worker counts, e.g. 1,2,4")
    ap.add_argument("--trees", type=int, default=64, help="trees for --workers (default 64)")
    ap.add_argument("--no-table", action="store_true", help="skip the barrier / no-barrier table")
    args = ap.parse_args()
    proc, url = start_server(args.time_scale)
    try:
        if args.workers:
            workers(url, [int(w) for w in args.workers.split(",")], args.trees, args.simulations)
        if args.no_table:
            return
        print(f"delays x{args.time_scale}; {args.simulations} simulations per tree, k=4, depth 5 (TextCraft)")
        print(f"{'trees':>5} {'limit':>5} {'requests':>8} | {'barrier wall':>12} {'share':>5} | "
              f"{'no-barrier wall':>15} {'share':>5} | {'bound':>7} {'over':>6}")
        for trees, limit in ((16, 8), (64, 8), (16, 64), (64, 64)):
            b = search(url, trees, limit, args.simulations, args.time_scale, rounds=True)
            f = search(url, trees, limit, args.simulations, args.time_scale, rounds=False)
            bound = max(f["total"] / limit, f["chain"])
            print(f"{trees:>5} {limit:>5} {f['requests']:>8} | {b['wall']:>11.2f}s {b['share']:>5.2f} | "
                  f"{f['wall']:>14.2f}s {f['share']:>5.2f} | {bound:>6.2f}s {100 * (f['wall'] / bound - 1):>5.1f}%",
                  flush=True)
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
