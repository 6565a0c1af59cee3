"""One run read by id: `Store.run(id)` against the scan it replaced (every run with its counts, then the
one wanted), on a store of --runs runs x 4 trees x --nodes nodes per tree, SQLite and (with --postgres, as the
tests start it) a throwaway PostgreSQL server on 127.0.0.1. The tables are ANALYZEd after the fill, as a
long-lived store's are (without statistics PostgreSQL plans the scan's per-run node count badly: ~10 s for
500 runs). Prints ms per read of each; checks both agree.

    .venv/bin/python bench/store_reads.py [--runs 500] [--nodes 50] [--reads 20] [--postgres]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))

from engine.envs.base import TaskSpec
from engine.store import Store

TASKS = [TaskSpec(id=f"goal-{i}", goal=f"reach {i}") for i in range(4)]


# The columns the rows below fill, by name (later migrations add columns with defaults).
NODE_COLUMNS = ("tree_id, node_id, parent_id, depth, action, raw, format_error, obs_hash, n, value_sum, q_critic, "
                "critic_rank, critic_reason, logprob, reward, progress, terminal, gen_ms, env_ms, n_tokens")


def fill(store: Store, runs: int, nodes: int) -> list[str]:
    with store.transaction() as con:
        con.execute("INSERT INTO observations VALUES (?, ?)", ("h", "obs"))
    ids = []
    for i in range(runs):
        run_id = store.create_run(f"r{i}", "line", "scripted", {}, TASKS)
        rows = [(tree_id, n, n - 1 if n else None, n, None, None, None, "h", 1, 0.0, *[None] * 9, 0)
                for tree_id, _ in store.tree_ids(run_id) for n in range(nodes)]
        with store.transaction() as con:
            con.executemany(f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES ({', '.join('?' * len(rows[0]))})", rows)
        ids.append(run_id)
    return ids


def bench(db: str, args: argparse.Namespace) -> None:
    with Store(db) as store:
        picks = random.Random(0).sample(fill(store, args.runs, args.nodes), args.reads)
        store.con.execute("ANALYZE")
        began = time.perf_counter()
        scanned = [next(info for info in store.runs() if info.id == run_id) for run_id in picks]
        scan = (time.perf_counter() - began) / len(picks)
        began = time.perf_counter()
        read = [store.run(run_id) for run_id in picks]
        one = (time.perf_counter() - began) / len(picks)
        assert scanned == read, "Store.run and the scan disagree"
        print(f"{store.dialect}: {args.runs} runs, {args.runs * len(TASKS) * args.nodes} nodes: scan "
              f"{scan * 1e3:.2f} ms, Store.run {one * 1e3:.3f} ms per read ({scan / one:.0f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--nodes", type=int, default=50, help="nodes per tree (4 trees per run)")
    ap.add_argument("--reads", type=int, default=20, help="runs read, each both ways")
    ap.add_argument("--postgres", action="store_true", help="also on a throwaway PostgreSQL server")
    args = ap.parse_args()
    bench(str(Path(tempfile.mkdtemp(prefix="orchard-bench-")) / "store.db"), args)
    if args.postgres:
        from pg_fixture import PgSchemas, start_server, stop_server

        base, data, bindir = start_server()
        try:
            bench(PgSchemas(base).new(), args)  # a throwaway schema on a throwaway server
        finally:
            stop_server(data, bindir)


if __name__ == "__main__":
    main()
