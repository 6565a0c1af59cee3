"""Curation under load: 8 curator processes make 2,000 decisions on 300 overlapping pairs.

Each curator repeatedly picks a pair, reads it (its version), thinks a moment and saves a decision
(approve / reject / reset) naming the version it read, as the dashboard does. Pairs overlap on
purpose, so curators meet on the same pair and some saves are refused (ConflictError). Afterwards
the history is checked for lost updates: every accepted save is in the pair's history under its
curator and version, every refused one got a conflict, versions per pair run 1..N without gaps, and
no version was accepted twice. Prints decisions/s and the p50/p95 latency of a save.

Loopback only and bounded (count and --time-limit). The store is PostgreSQL: --db URL, else
$ORCHARD_TEST_PG, else a throwaway server started here (Debian's postgresql, as in the tests); a
SQLite path works too, for comparison. Runs in a fresh schema (PostgreSQL) or file, removed after.

Leases (handing each pair to one curator at a time) belong to the work-sharing queue: `pick` is the
hook. With a queue API in the store, pass --leases: each curator then takes its pair from the queue
and the run also checks that no pair was held by two curators at once (the intervals in `held`).

    .venv/bin/python bench/curation_load.py [--db postgresql://orchard@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import itertools

from engine.datasets.pairs import Pair
from engine.envs.base import TaskSpec
from engine.store import ConflictError, Store, StoreError

STATUSES = ("approved", "rejected", "pending")
LOOPBACK = {"127.0.0.1", "localhost", "::1", ""}


def pick(store: Store, rng: random.Random, pair_ids: list[str], who: str, leases: bool) -> str:
    """The next pair for curator `who`. Without leases: any pair (they overlap on purpose). With
    leases: the work-sharing queue's next pair for `who` (the queue API of issue 18 items 2-4)."""
    if leases:
        claim = getattr(store, "claim_pairs", None)
        if claim is None:
            raise SystemExit("--leases: this store has no work-sharing queue (claim_pairs) yet")
        return claim(who, 1)[0].id
    return rng.choice(pair_ids)


def curator(args: tuple[str, int, int, list[str], float, float, bool, Any]) -> list[tuple]:
    """One curator process: `n` decisions; returns (pair, read version, outcome, new version, who,
    save seconds, held from, held to) per decision."""
    db, index, n, pair_ids, think_s, deadline, leases, start = args
    who = f"curator{index}"
    rng = random.Random(index)
    out = []
    with Store(db) as store:
        start.wait()
        for _ in range(n):
            if time.time() > deadline:
                break
            held_from = time.time()
            pid = pick(store, rng, pair_ids, who, leases)
            seen = store.pair(pid).version
            time.sleep(rng.uniform(0, think_s))
            status = rng.choice(STATUSES)
            t0 = time.perf_counter()
            try:
                new = store.set_pair_status(pid, status, who, seen).version
                outcome = "saved"
            except ConflictError:
                new, outcome = None, "conflict"
            except StoreError as e:  # an unexpected refusal: counted, reported
                new, outcome = None, f"error: {e}"
            out.append((pid, seen, outcome, new, who, time.perf_counter() - t0, held_from, time.time()))
    return out


def seed(db: str, n_pairs: int) -> list[str]:
    with Store(db) as store:
        run_id = store.create_run("load", "line", "none", {}, [TaskSpec(id="t", goal="g")])
        ((tree_id, _),) = store.tree_ids(run_id)
        pairs = [Pair(id=f"p{i:04d}", kind="step", run_id=run_id, tree_id=tree_id, task_id="t", node_id=i,
                      chosen_node=i + 1, rejected_node=i + 2, prompt=[{"role": "user", "content": "go"}],
                      chosen=f"ACTION: a{i}", rejected=f"ACTION: b{i}", q_chosen=1.0, q_rejected=0.0,
                      logprob_chosen=None, logprob_rejected=None, depth=1) for i in range(n_pairs)]
        store.save_pairs(run_id, pairs)
        return [p.id for p in pairs]


def check(db: str, rows: list[tuple], leases: bool) -> dict[str, Any]:
    """Lost updates and (with leases) double hand-outs."""
    saved = [r for r in rows if r[2] == "saved"]
    conflicts = [r for r in rows if r[2] == "conflict"]
    errors = [r for r in rows if r[2].startswith("error")]
    lost, gaps = 0, 0
    accepted = {(r[0], r[3]): r[4] for r in saved}
    dup = len(saved) - len(accepted)
    with Store(db, readonly=True) as store:
        for pid in {r[0] for r in rows}:
            history = store.pair_history(pid)
            by_version = {h.version: h.who for h in history}
            versions = [h.version for h in history]
            gaps += versions != list(range(1, len(versions) + 1))
            gaps += store.pair(pid).version != versions[-1]
            lost += sum(1 for (p, v), who in accepted.items() if p == pid and by_version.get(v) != who)
            lost += sum(1 for v, who in by_version.items() if v > 1 and accepted.get((pid, v)) != who)
    double = None
    if leases:
        double = 0
        spans: dict[str, list[tuple[float, float, str]]] = {}
        for r in rows:
            spans.setdefault(r[0], []).append((r[6], r[7], r[4]))
        for held in spans.values():
            held.sort()
            double += sum(1 for a, b in itertools.pairwise(held) if b[0] < a[1] and a[2] != b[2])
    return {"saved": len(saved), "conflicts": len(conflicts), "errors": len(errors), "lost_updates": lost,
            "version_gaps": gaps, "duplicate_versions": dup, "double_handouts": double,
            "first_error": errors[0][2] if errors else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", help="postgresql:// URL on loopback (or a SQLite path); default: $ORCHARD_TEST_PG, "
                                "else a throwaway server")
    p.add_argument("--curators", type=int, default=8)
    p.add_argument("--decisions", type=int, default=2000)
    p.add_argument("--pairs", type=int, default=300)
    p.add_argument("--think-ms", type=float, default=5.0, help="at most this long between read and save")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds; curators stop after it")
    p.add_argument("--leases", action="store_true", help="take pairs from the work-sharing queue (see pick)")
    args = p.parse_args()

    from pg_fixture import start_server, stop_server, with_schema

    base = args.db or os.environ.get("ORCHARD_TEST_PG")
    server = None
    if base is None:
        base, data, bindir = start_server()
        server = (data, bindir)
    tmp = schema = None
    try:
        if base.startswith(("postgresql://", "postgres://")):
            host = urllib.parse.urlsplit(base).hostname or ""
            if host not in LOOPBACK and not host.startswith("/"):
                raise SystemExit(f"--db: {host} is not a loopback address (this benchmark stays on 127.0.0.1)")
            import psycopg

            schema = "bench_" + uuid.uuid4().hex[:8]
            with psycopg.connect(base, autocommit=True) as con:
                con.execute(f"CREATE SCHEMA {schema}")
            db = with_schema(base, schema)
        else:
            tmp = tempfile.mkdtemp(prefix="orchard-load-")
            db = str(Path(tmp) / Path(base).name)
        pair_ids = seed(db, args.pairs)
        per = [args.decisions // args.curators + (i < args.decisions % args.curators) for i in range(args.curators)]
        ctx = mp.get_context("fork")
        start = ctx.Manager().Event()
        deadline = time.time() + args.time_limit
        with ctx.Pool(args.curators) as pool:
            job = pool.map_async(curator, [(db, i, n, pair_ids, args.think_ms / 1000, deadline, args.leases, start)
                                           for i, n in enumerate(per)])
            time.sleep(1.0)  # every curator connected
            t0 = time.perf_counter()
            start.set()
            rows = [r for part in job.get(timeout=args.time_limit + 60) for r in part]
            wall = time.perf_counter() - t0
        result = check(db, rows, args.leases)
        lat = sorted(r[5] * 1000 for r in rows)
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        kind = "PostgreSQL" if schema else "SQLite"
        print(f"{kind}: {args.curators} curators, {len(rows)} decisions on {args.pairs} pairs in {wall:.1f}s: "
              f"{len(rows) / wall:.0f} decisions/s; save latency p50 {statistics.median(lat):.1f} ms, "
              f"p95 {p95:.1f} ms")
        print(f"saved {result['saved']}, refused with a conflict {result['conflicts']}, other errors "
              f"{result['errors']}; lost updates {result['lost_updates']}, version gaps {result['version_gaps']}, "
              f"versions accepted twice {result['duplicate_versions']}; items handed to two curators at once: "
              + ("n/a (no leases: pass --leases once the work-sharing queue is in the store)"
                 if result["double_handouts"] is None else str(result["double_handouts"])))
        if result["first_error"]:
            print(f"first error: {result['first_error']}")
        bad = result["lost_updates"] or result["version_gaps"] or result["duplicate_versions"] or result["errors"] \
            or result["double_handouts"] or len(rows) < args.decisions
        return 1 if bad else 0
    finally:
        if schema and not server:  # a server of yours keeps nothing of this run
            import psycopg

            with psycopg.connect(base, autocommit=True) as con:
                con.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if server:
            stop_server(*server)


if __name__ == "__main__":
    sys.exit(main())
