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

With `--drive` it prints instead the driver table (issue 30): trees x concurrency limit x servers x
shards, each run committing to a store as `orchard search` does (one process: runner.new_run; shards:
engine/search/local_shards.py), with per run: wall, the no-barrier bound (total server delay /
(limit x servers), or the longest tree's chain), mean requests in flight (total server delay / wall)
against min(trees, limit x servers), driver CPU per request (this process and its reaped worker
processes, user + system, over the requests sent; the servers are separate processes), and the share
of wall the engine (scheduler) + commits take in the processes that grow trees and the writer's
commit share; then replies handled per pass of the scheduler (a pass: woken by what landed, it steps
those trees and sends their next requests) and the mean gap between passes per process (wall x
processes / passes), which the CPU per request follows (2026-12-07, evening). `--clients threads,auto` runs each cell with the thread-per-request OpenAI client and
then with the default (the event loop on http://), the before / after of 2026-12-05 in one run;
`--clients queued,auto` the loop on its own thread (answers queued to the search's thread) vs driven by
the search's thread (2026-12-07); `--replies generic,typed` every reply read the generic way (safejson +
dicts) vs the typed read (engine/llm/openai_reply.py), one process; `--entries vllm` has the servers write
each token's log-prob entry as vLLM does (token, bytes, top_logprobs beside the log-prob); `--writers
inline,thread` commits on the search's thread vs on a commit thread of its own (one process; the writer commit
column is then the commit thread's time in transactions); `--store-url postgresql://...` commits to a PostgreSQL
server instead of a SQLite file (each run in a schema of its own, left on the server).

    .venv/bin/python bench/scale.py [--simulations 2] [--time-scale 1.0] [--workers 1,2,4] [--no-table]
    .venv/bin/python bench/scale.py --drive [--sizes 256,1024] [--limits 64,256] [--servers 1,2]
        [--shards 1,2] [--clients auto] [--replies typed] [--writers inline] [--entries minimal] [--simulations 2]
        [--k 2] [--depth 3]
        [--time-scale 0.2]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import repeat_env
from delayed_server import request_delay

from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.llm.openai_http import OpenAIGenerator
from engine.search.mcts import MCTS, start_tree
from engine.store.postgres import new_schema_url

repeat_env.register()  # at import: a local shard's worker process re-imports this module (spawn)


class Metered:
    """Wraps an OpenAIGenerator; records each request (an append, no work) and, after the run, adds up each
    request's server delay (total and per tree) in `settle()`: computing a delay (a SHA-256 and a seeded
    Random per request) inline took ~40% of the search thread's interpreter time at 1024 trees (py-spy,
    2026-12-05), slowing the very search it measures."""

    def __init__(self, gen: Any, time_scale: float, drive: bool = True) -> None:
        self.gen, self.scale, self.name, self.drive = gen, time_scale, gen.name, drive
        self.sent: list[tuple[Any, Any]] = []  # (request, affinity); list.append is atomic under the GIL
        self.total = 0.0
        self.chain: dict[object, float] = defaultdict(float)

    def _meter(self, req, affinity=None) -> None:
        self.sent.append((req, affinity))

    def settle(self) -> Metered:
        """Adds up the recorded requests' delays (after the run: outside its wall and its CPU)."""
        for req, affinity in self.sent:
            d = self.scale * request_delay({"seed": req.params.seed, "messages": req.prompt, "n": req.n})
            self.total += d
            self.chain[affinity] += d
        self.sent.clear()
        return self

    def sample(self, requests):
        for r in requests:
            self._meter(r)
        return self.gen.sample(requests)

    def submit(self, request, affinity=None):
        self._meter(request, affinity)
        return self.gen.submit(request, affinity)

    def driven(self):
        """The generator's own driven I/O (`SupportsDriven`), unless `drive` is off (client "queued")."""
        driven = getattr(self.gen, "driven", None)
        return driven() if callable(driven) and self.drive else contextlib.nullcontext()

    def logprobs(self, prompts, completions):
        return self.gen.logprobs(prompts, completions)


def start_server(time_scale: float, entries: str = "minimal") -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "delayed_server.py"), "--port", "0",
                             "--time-scale", str(time_scale), "--entries", entries], stdout=subprocess.PIPE, text=True)
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
    gen.settle()
    return {"wall": wall, "share": gen.total / (wall * limit), "total": gen.total,
            "chain": max(gen.chain.values()), "requests": stats.requests, "sims": stats.simulations}


def workers(url: str, counts: list[int], trees: int, simulations: int) -> None:
    """Ray shards against the delayed server: simulations/s per worker count (each run its own store)."""
    import tempfile

    import ray

    from engine.search.ray_search import prepare_run_on_ray
    from engine.store import Store

    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
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


def _busy(urls: list[str]) -> float:
    """Seconds of answer delay the servers have served so far (their /stats), summed."""
    import httpx

    return sum(httpx.get(u.removesuffix("/v1") + "/stats", timeout=10).json()["busy_s"] for u in urls)


def _cpu() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def drive_run(urls: list[str], trees: int, limit: int, shards: str, cfg: SearchConfig, time_scale: float,
              db: Path | str, client: str = "auto", commit_every: float = 0.0, replies: str = "typed",
              writer: str = "inline") -> dict:
    """One run of the driver table (see the module docstring); `shards`: a count or "auto"; `client`: the
    OpenAI client (`?client=`: auto is the event loop, run by the search's own thread in one process;
    queued the same loop on its own thread, the answers queued to the search's (one process only); threads
    the thread per request before both); `replies`: typed (the default read) or generic (one process only)."""
    from engine.llm import openai_http
    from engine.llm.registry import load_generator
    from engine.search.local_shards import auto_shards, prepare_run
    from engine.search.runner import new_run
    from engine.store import Store

    spec = f"openai:{','.join(urls)}#m?concurrency={limit}" + ("" if client in ("auto", "queued") else f"&client={client}")
    tasks = env_factory(repeat_env.NAME)().tasks("train")[:trees]  # 1024 trees: TextCraft's tasks repeated
    n = auto_shards(trees, cfg.trees_in_flight, spec) if shards == "auto" else int(shards)
    busy, cpu, metered = _busy(urls), _cpu(), None
    first: list[float] = []

    def progress(job: Any, sim: Any) -> None:
        if not first:
            first.append(time.perf_counter())

    if replies == "generic" and n != 1:
        raise SystemExit("--replies generic: one process only (--shards 1)")
    if writer != "inline" and n != 1:
        raise SystemExit(f"--writers {writer}: one process only (--shards 1; shards commit in the parent process)")
    openai_http.TYPED_REPLIES = replies == "typed"
    with Store(db) as store:
        t = time.perf_counter()
        if n == 1:
            metered = Metered(load_generator(spec), time_scale, drive=client != "queued")
            _, stats = new_run(store, repeat_env.NAME, tasks, metered, cfg, "drive", progress=progress,
                                  commit_every=commit_every, writer=writer)
            metered.gen.close()
            share = (stats.engine_s + stats.commit_s) / stats.wall_s
        else:
            search = prepare_run(store, repeat_env.NAME, tasks, spec, cfg, "drive", shards=n, progress=progress)
            stats = search.run()
            share = sum((s.engine_s + s.commit_s) / s.wall_s for s in search.shard_stats.values()) / n
        wall = time.perf_counter() - t
    cpu = _cpu() - cpu
    openai_http.TYPED_REPLIES = True
    if metered:
        metered.settle()
    total = _busy(urls) - busy
    return {"shards": n, "auto": auto_shards(trees, cfg.trees_in_flight, spec), "wall": wall, "total": total,
            "in_flight": total / wall, "requests": stats.requests,
            "cpu_ms": 1e3 * cpu / max(stats.requests, 1), "share": share,
            "commit": (stats.writer_s or stats.commit_s) / wall,
            "chain": max(metered.chain.values()) if metered else None, "sims": stats.simulations,
            "passes": len(stats.batch_sizes),
            "first": first[0] - t if first else float("nan")}


def drive(args: argparse.Namespace) -> None:
    import os
    import tempfile

    cfg = SearchConfig(simulations=args.simulations, k=args.k, depth_limit=args.depth, seed=1,
                       trees_in_flight=max(int(x) for x in args.sizes.split(",")))
    print(f"delays x{args.time_scale}; {cfg.simulations} simulation(s) per tree, k={cfg.k}, depth {cfg.depth_limit} "
          f"(TextCraft), every tree in flight; load average {os.getloadavg()[0]:.1f} at the start")
    print(f"{'replies':>7} {'client':>7} {'every':>5} {'writer':>6} {'trees':>5} {'limit':>5} {'servers':>7} {'shards':>6} {'auto':>4} {'requests':>8} | {'wall':>7} "
          f"{'bound':>7} "
          f"{'over':>6} | {'in flight':>9} {'target':>6} {'ratio':>5} | {'CPU/req':>8} | {'eng+commit':>10} "
          f"{'writer commit':>13} {'1st sim':>7} | {'per pass':>8} {'gap':>7}")
    chains: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as d:
        for n_servers in (int(x) for x in args.servers.split(",")):
            procs, urls = [], []
            try:
                for _ in range(n_servers):
                    proc, url = start_server(args.time_scale, args.entries)
                    procs.append(proc)
                    urls.append(url)
                for trees in (int(x) for x in args.sizes.split(",")):
                    for limit in (int(x) for x in args.limits.split(",")):
                        for shards, client, every, replies, writer in (
                                (s, c, float(e), r, w) for s in args.shards.split(",") for c in args.clients.split(",")
                                for e in args.commit_every.split(",") for r in args.replies.split(",")
                                for w in args.writers.split(",")):
                            db = (new_schema_url(args.store_url, "scale") if args.store_url else
                                  Path(d) / f"{trees}-{limit}-{n_servers}-{shards}-{client}-{every}-{replies}-{writer}.db")
                            r = drive_run(urls, trees, limit, shards, replace(cfg, trees_in_flight=trees),
                                          args.time_scale, db, client, every, replies, writer)
                            if r["chain"] is not None:
                                chains[trees] = r["chain"]
                            cap = limit * n_servers
                            bound = max(r["total"] / cap, chains.get(trees, 0.0))
                            target = min(trees, cap)
                            print(f"{replies:>7} {client:>7} {every:>5.2f} {writer:>6} {trees:>5} {limit:>5} {n_servers:>7} {r['shards']:>6} {r['auto']:>4} "
                                  f"{r['requests']:>8} | "
                                  f"{r['wall']:>6.1f}s {bound:>6.1f}s {100 * (r['wall'] / bound - 1):>5.0f}% | "
                                  f"{r['in_flight']:>9.1f} {target:>6} {r['in_flight'] / target:>5.2f} | "
                                  f"{r['cpu_ms']:>5.2f} ms | {100 * r['share']:>9.1f}% {100 * r['commit']:>12.1f}% {r['first']:>6.1f}s | "
                                  f"{r['requests'] / max(r['passes'], 1):>8.2f} "
                                  f"{1e3 * r['wall'] * r['shards'] / max(r['passes'], 1):>5.1f}ms",
                                  flush=True)
            finally:
                for proc in procs:
                    proc.kill()
                    proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulations", type=int, default=2)
    ap.add_argument("--time-scale", type=float, default=1.0, help="scale every server delay (below 1: quicker)")
    ap.add_argument("--workers", help="also search on a local Ray cluster with these worker counts, e.g. 1,2,4")
    ap.add_argument("--trees", type=int, default=64, help="trees for --workers (default 64)")
    ap.add_argument("--no-table", action="store_true", help="skip the barrier / no-barrier table")
    ap.add_argument("--drive", action="store_true", help="the driver table instead (issue 30): see the docstring")
    ap.add_argument("--sizes", default="256,1024", help="--drive: tree counts")
    ap.add_argument("--limits", default="64,256", help="--drive: concurrency limits (per server)")
    ap.add_argument("--servers", default="1,2", help="--drive: delayed server processes")
    ap.add_argument("--shards", default="1,2", help="--drive: shard counts (1: one process; auto: the rule's)")
    ap.add_argument("--clients", default="auto", help="--drive: OpenAI clients (?client=): auto (the event loop on "
                    "http://, driven by the search's thread in one process), queued (the same loop on its own thread, "
                    "the answers queued to the search's), threads (a thread per request), loop")
    ap.add_argument("--store-url", help="--drive: commit to this PostgreSQL server (a postgresql:// URL; each run in a "
                    "new schema) instead of a SQLite file")
    ap.add_argument("--writers", default="inline", help="--drive, one process: where the commits run (comma-separated "
                    "arms): inline (the search's thread) or thread (a commit thread with its own connection)")
    ap.add_argument("--commit-every", default="0", help="--drive, one process: seconds between the inline commits "
                    "(comma-separated arms; 0: after every batch of replies)")
    ap.add_argument("--replies", default="typed", help="--drive, one process: how replies are read, comma-separated "
                    "arms: typed (engine/llm/openai_reply.py), generic (safejson + parse_choices, the before)")
    ap.add_argument("--entries", choices=("minimal", "vllm"), default="minimal",
                    help="--drive: each token's log-prob entry in the servers' answers (vllm: as vLLM writes them)")
    ap.add_argument("--k", type=int, default=2, help="--drive: candidates per expansion")
    ap.add_argument("--depth", type=int, default=3, help="--drive: depth limit")
    args = ap.parse_args()
    if args.drive:
        drive(args)
        return
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
