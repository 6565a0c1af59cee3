"""Curation under load: N curator processes share pairs through the review queue and also make
direct (version-checked) status saves on overlapping pairs. Loopback / local files only; bounded
in count (--decisions) and time (--seconds). Prints decisions/s, p95 latency per save, and two
checks that must be 0: lost updates (an accepted save missing from the history, or a refusal that
was not a conflict / lease refusal) and items handed to two curators at once.

    .venv/bin/python bench/curation_load.py [--db PATH] [--curators 8] [--decisions 2000]
        [--pairs 300] [--reviews 3] [--seconds 120]

--db takes whatever the store opens ($ORCHARD_DB's forms, loopback servers only); default: a
throwaway PostgreSQL server started here on 127.0.0.1 (Debian's postgresql, as the tests start
it), or, where PostgreSQL is not installed, a new SQLite file in a temp folder (said so).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))

from engine.datasets.pairs import Pair
from engine.envs.base import TaskSpec
from engine.store import ConflictError, LeaseError, Store

STEP = "THOUGHT: t{i}.\nACTION: {a}\nEXPLANATION: e.\nSTATUS: CONTINUE"


def seed_store(db: str, n: int, reviews: int) -> None:
    with Store(db) as store:
        run_id = store.create_run("load", "line", "scripted", {}, [TaskSpec(id="goal-3", goal="reach 3")])
        tree_id = store.tree_ids(run_id)[0][0]
        store.save_pairs(run_id, [
            Pair(id=f"p{i:04d}", kind="step", run_id=run_id, tree_id=tree_id, task_id="goal-3", node_id=i,
                 chosen_node=100000 + i, rejected_node=200000 + i, prompt=[{"role": "user", "content": "go"}],
                 chosen=STEP.format(i=i, a="right"), rejected=STEP.format(i=i, a="left"), q_chosen=0.9,
                 q_rejected=0.1, logprob_chosen=None, logprob_rejected=None, depth=1) for i in range(n)])
        store.set_required_reviews(reviews)


def curator(db: str, name: str, n_pairs: int, budget, deadline: float, out) -> None:
    rng = random.Random(name)
    log = {"accepted": [], "refused": [], "other": [], "latency": [], "held": []}
    with Store(db) as store:
        while time.time() < deadline:
            with budget.get_lock():
                if budget.value <= 0:
                    break
                budget.value -= 1
            t0 = time.perf_counter()
            if rng.random() < 0.5:  # a review through the queue
                items = store.claim("pair", name, n=1)
                if not items:
                    log["other"].append("queue empty")
                    continue
                item, got = items[0], time.time()
                version = store.pair(item).version
                end = time.time()
                try:
                    d = store.review("pair", item, name, rng.choice(("approved", "rejected")), version)
                    log["accepted"].append(("review", item, d.id))
                except (LeaseError, ConflictError) as e:
                    log["refused"].append(("review", item, type(e).__name__))
                except Exception as e:  # noqa: BLE001 - counted, not hidden
                    log["other"].append(f"{type(e).__name__}: {e}")
                log["held"].append((item, got, end))
            else:  # a direct save on a pair someone may be changing at the same time
                item = f"p{rng.randrange(n_pairs):04d}"
                version = store.pair(item).version
                time.sleep(rng.random() * 0.002)
                try:
                    p = store.set_pair_status(item, rng.choice(("approved", "rejected", "pending")), name, version)
                    log["accepted"].append(("status", item, p.version))
                except ConflictError:
                    log["refused"].append(("status", item, "ConflictError"))
                except Exception as e:  # noqa: BLE001
                    log["other"].append(f"{type(e).__name__}: {e}")
            log["latency"].append(time.perf_counter() - t0)
    out.put((name, log))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db")
    ap.add_argument("--curators", type=int, default=8)
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--reviews", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()
    server = None
    db = args.db
    if db is None:
        try:
            from pg_fixture import start_server

            db, data, bindir = start_server()
            server = (data, bindir)
        except Exception as e:  # noqa: BLE001 - no PostgreSQL here: measure SQLite, and say so
            print(f"no throwaway PostgreSQL server ({type(e).__name__}: {e}); using SQLite")
            db = str(Path(tempfile.mkdtemp(prefix="curation-load-")) / "orchard.db")
    try:
        return _run(args, db)
    finally:
        if server is not None:
            from pg_fixture import stop_server

            stop_server(*server)


def _run(args: argparse.Namespace, db: str) -> int:
    seed_store(db, args.pairs, args.reviews)
    ctx = mp.get_context("spawn")
    budget, out = ctx.Value("i", args.decisions), ctx.Queue()
    start = time.time()
    deadline = start + args.seconds
    procs = [ctx.Process(target=curator, args=(db, f"c{i}", args.pairs, budget, deadline, out))
             for i in range(args.curators)]
    for p in procs:
        p.start()
    logs = dict(out.get(timeout=args.seconds + 60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    elapsed = time.time() - start

    with Store(db) as store:
        decisions = {d.id for d in store.decisions("pair")}
        history = {(pid, h.version, h.who) for pid in {f"p{i:04d}" for i in range(args.pairs)}
                   for h in store.pair_history(pid)}
    lost = 0
    for name, log in logs.items():
        for kind, item, ref in log["accepted"]:
            lost += (ref not in decisions) if kind == "review" else ((item, ref, name) not in history)
        lost += len(log["other"]) - log["other"].count("queue empty")
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for name, log in logs.items():
        for item, a, b in log["held"]:
            spans.setdefault(item, []).append((a, b, name))
    double = 0
    for ss in spans.values():
        ss.sort()
        for i, (start_b, _, who_b) in enumerate(ss):  # any earlier span of another curator still open
            double += any(end_a > start_b and who_a != who_b for _, end_a, who_a in ss[:i])
    lat = sorted(t for log in logs.values() for t in log["latency"])
    made = sum(len(log["accepted"]) + len(log["refused"]) for log in logs.values())
    accepted = sum(len(log["accepted"]) for log in logs.values())
    print(f"store: {db}")
    print(f"{args.curators} curators, {args.pairs} pairs, {args.reviews} reviews each: {made} saves in {elapsed:.1f} s "
          f"({made / elapsed:.0f}/s), {accepted} accepted, {made - accepted} refused (conflict or lease)")
    if lat:
        print(f"latency per save: p50 {lat[len(lat) // 2] * 1000:.1f} ms, p95 {lat[int(len(lat) * 0.95)] * 1000:.1f} ms")
    print(f"lost updates: {lost}")
    print(f"items handed to two curators at once: {double}")
    return 0 if lost == 0 and double == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
