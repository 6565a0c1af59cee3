"""Committing a search's simulations: one transaction per simulation vs one per batch, the store's
write path before and after its writes were merged, and the sharded driver's work per simulation.

The search commits every simulation a batch of replies finished in one transaction
(`Store.save_simulations`). This replays the same writes on a fresh SQLite file per arm: T synthetic
TextCraft-like trees (bench/dashboard.py's generator) of S simulations, simulation j of a tree inserting
its share of the tree's nodes (and their observations) and updating the visit counts and value sums of
the root and the older nodes on its path down to its newest node, in batches of K simulations of every
tree (K = 1: the round-barrier scheduler's rounds; K > 1: a writer that lags behind its shards and finds
several simulations of a tree waiting). Four arms, rotated within each repeat:
- per simulation / per batch: one transaction per simulation, or per batch;
- before / after: `save_before` below (the store's code before the writes were merged, kept here to be
  measured against) with SQLite's checkpoint every 1,000 WAL pages (the store's setting before), or
  `Store.save_simulations` with the store's own setting (`WAL_CHECKPOINT_PAGES`);
- per batch, merged only: `Store.save_simulations` with checkpoints every 1,000 pages (what the merged
  writes alone gain).
Prints ms per committed simulation (min / median / max over the repeats) and the ratios, then checks
that every arm stored the same thing: every table's rows (rowids, values and their types) and every tree
read back with `Store.load_tree`, compared with the first arm's.

`--driver`: instead, the store writer's whole work per simulation in a sharded search
(engine/search/ray_search.py's driver loop) with the engine this file imports: a worker's pickled
message is unpickled, checked, applied to the mirror, turned into rows and committed per batch; prints
ms per simulation of each stage. Run it from another checkout's root (a copy of this file) for a before.

    .venv/bin/python bench/commit_batch.py [--trees 64] [--simulations 24] [--nodes 96] [--per-tree 1]
                                           [--repeat 5] [--driver]
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.dashboard import synthetic_tree
from engine.store import Store, columns
from engine.store.runs import NODE_COLUMNS, SimulationRows, simulation_rows
from engine.tree_nodes import SearchTree, Simulation

SQLITE_PAGES = 1000  # SQLite's own wal_autocheckpoint, the store's before WAL_CHECKPOINT_PAGES
TABLES = ("observations", "nodes", "simulations", "trees", "node_media")  # what save_simulations writes


def save_before(store: Store, batch: list[SimulationRows]) -> None:
    """`Store.save_simulations` before its writes were merged (every row of the batch written as
    taken, one statement list per table, inserts before updates): the bench's baseline."""
    if not batch:
        return
    with store.transaction() as con:
        con.executemany(columns.insert("observations", columns.OBSERVATION_ROW, "INSERT OR IGNORE"),
                        [r for b in batch for r in b.observations])
        con.executemany(f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES ({','.join('?' * 21)})",
                        [r for b in batch for r in b.nodes])
        con.executemany("UPDATE nodes SET n=?, value_sum=? WHERE tree_id=? AND node_id=?",
                        [r for b in batch for r in b.values])
        con.executemany(
            "UPDATE nodes SET q_critic=?, critic_rank=?, critic_reason=? WHERE tree_id=? AND node_id=?",
            [r for b in batch for r in b.ranks])
        con.executemany(columns.insert("simulations", columns.SIMULATION_ROW), [b.simulation for b in batch])
        con.executemany("UPDATE trees SET simulations=?, solved=? WHERE id=?", [b.tree for b in batch])
        con.executemany(
            columns.insert("node_media", columns.NODE_MEDIA_ROW, "INSERT OR REPLACE", "?,?,'screenshot',?"),
            [r for b in batch for r in b.media])


def grow(trees: int, nodes: int) -> list[SearchTree]:
    grown = [synthetic_tree(nodes, seed=t) for t in range(trees)]
    for t, tree in enumerate(grown):  # one task each (a run holds a task once)
        tree.task = dataclasses.replace(tree.task, id=f"{tree.task.id}-{t}")
    return grown


def share(tree: SearchTree, r: int, sims: int) -> tuple[int, int, tuple[int, ...]]:
    """(first, last, path) of simulation r of `tree`: it creates nodes[first:last] and its path runs
    from the root's child down to node last - 1."""
    n = len(tree.nodes)
    first, last = r * n // sims, (r + 1) * n // sims
    path: list[int] = []
    i = last - 1
    while i > 0:
        path.append(i)
        i = tree.nodes[i].parent  # type: ignore[assignment]
    return first, last, tuple(reversed(path))


def batches(grown: list[SearchTree], sims: int, per_tree: int) -> list[list[tuple[int, SimulationRows]]]:
    """Batch b holds simulations b*K .. b*K+K-1 of every tree, interleaved, as (tree index, rows);
    simulation r's visit counts are the tree's final ones plus r (each simulation's newer than the last)."""
    out: list[list[tuple[int, SimulationRows]]] = [[] for _ in range(0, sims, per_tree)]
    for r in range(sims):
        for t, tree in enumerate(grown):
            first, last, path = share(tree, r, sims)
            if last == first:
                continue
            sim = Simulation(path, 0.0, ("get 1 oak log",))
            rows = simulation_rows(0, SearchTree(tree.task, tree.nodes[:last], [sim] * (r + 1)), sim, first)
            rows = dataclasses.replace(rows, values=[(n + r, v + 0.25 * r, tid, i) for n, v, tid, i in rows.values])
            out[r // per_tree].append((t, rows))
    return out


def bind(ids: list[int], t: int, rows: SimulationRows) -> SimulationRows:
    """`rows` of tree index t written for tree id ids[t]."""
    tid = ids[t]
    return dataclasses.replace(
        rows, nodes=[(tid, *r[1:]) for r in rows.nodes], values=[(*r[:2], tid, r[3]) for r in rows.values],
        simulation=(tid, *rows.simulation[1:]), tree=(*rows.tree[:2], tid), ranks=[], media=[])


def replay(path: Path, grown: list[SearchTree], plan: list[list[tuple[int, SimulationRows]]], batched: bool,
           before: bool, pages: int | None = None) -> tuple[float, dict[str, list[tuple[Any, ...]]], list[SearchTree | None]]:
    """(seconds to write every batch's simulations, each table's rows, every tree read back); `pages`:
    WAL pages between checkpoints (None: the store's setting)."""
    with Store(path) as store:
        if pages is not None:
            store.con.execute(f"PRAGMA wal_autocheckpoint={pages}")
        save = (lambda b: save_before(store, b)) if before else store.save_simulations
        run_id = store.create_run("bench", "synthetic", "none", {"alpha": 0.5, "k": 4}, [t.task for t in grown])
        ids = [tree_id for tree_id, _ in store.tree_ids(run_id)]
        bound = [[bind(ids, t, rows) for t, rows in batch] for batch in plan]
        t0 = time.perf_counter()
        for batch in bound:
            if batched:
                save(batch)
            else:
                for rows in batch:
                    save([rows])
        seconds = time.perf_counter() - t0
        return seconds, dump(store), [store.load_tree(i) for i in ids]


def dump(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row save_simulations writes, with its rowid and each value's type (1 and 1.0 differ);
    the run's id (random) left out."""
    out = {}
    for table in TABLES:
        cols = [r[1] for r in store.con.execute(f"PRAGMA table_info({table})").fetchall() if r[1] != "run_id"]
        rows = store.con.execute(f"SELECT rowid, {', '.join(cols)} FROM {table} ORDER BY rowid").fetchall()
        out[table] = [tuple((v, type(v).__name__) for v in row) for row in rows]
    return out


def commits(args: argparse.Namespace) -> dict[str, list[float]]:
    grown = grow(args.trees, args.nodes)
    plan = batches(grown, args.simulations, args.per_tree)
    total = sum(len(b) for b in plan)
    arms = [("per simulation, before", False, True, SQLITE_PAGES), ("per simulation, after", False, False, None),
            ("per batch, before", True, True, SQLITE_PAGES), ("per batch, merged only", True, False, SQLITE_PAGES),
            ("per batch, after", True, False, None)]
    ms: dict[str, list[float]] = defaultdict(list)
    reference: tuple[dict[str, list[tuple[Any, ...]]], list[SearchTree | None]] | None = None
    same: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for j in range(len(arms)):
                name, batched, before, pages = arms[(i + j) % len(arms)]  # rotated: no arm always first
                s, rows, trees = replay(Path(tmp) / f"{i}-{j}.db", grown, plan, batched, before, pages)
                ms[name].append(1000 * s / total)
                if reference is None:
                    reference, ref_name = (rows, trees), name
                else:
                    same.append(name if (rows, trees) == reference else f"DIFFERENT: {name}")
    print(f"{args.trees} trees x {args.simulations} simulations ({total}), ~{args.nodes} nodes a tree, "
          f"{args.per_tree} simulation(s) of each tree per batch, SQLite file, {args.repeat} repeats; "
          "ms per committed simulation:")
    print(f"  {'arm':<24} {'min':>7} {'median':>7} {'max':>7}")
    for name, *_ in arms:
        v = ms[name]
        print(f"  {name:<24} {min(v):7.4f} {statistics.median(v):7.4f} {max(v):7.4f}")
    med = {name: statistics.median(v) for name, v in ms.items()}
    print(f"before / after (medians): per simulation {med['per simulation, before'] / med['per simulation, after']:.2f}x, "
          f"per batch {med['per batch, before'] / med['per batch, after']:.2f}x (merged writes alone "
          f"{med['per batch, before'] / med['per batch, merged only']:.2f}x); per simulation / per batch "
          f"(after): {med['per simulation, after'] / med['per batch, after']:.1f}x")
    differ = [s for s in same if s.startswith("DIFFERENT")]
    print(f"stored data: {len(same) - len(differ)} of {len(same)} stores identical to {ref_name}'s "
          f"(rows with rowids and types of {', '.join(TABLES)}; every tree read back)"
          + (f"; {', '.join(sorted(set(differ)))}" if differ else ""))
    if differ:
        raise SystemExit(1)
    return dict(ms)


def messages(grown: list[SearchTree], sims: int, ids: list[int]) -> list[list[bytes]]:
    """Each round's worker messages as the driver receives them (engine/search/ray_search.py's
    `shard_messages`): (tree id, first new node, new nodes, touched (id, N, value sum), simulation, pid)."""
    out = []
    for r in range(sims):
        batch = []
        for t, tree in enumerate(grown):
            first, last, path = share(tree, r, sims)
            if last == first:
                continue
            new = [dataclasses.replace(n, children=[c for c in n.children if c < last]) for n in tree.nodes[first:last]]
            values = [(i, tree.nodes[i].N + r, tree.nodes[i].value_sum + 0.25 * r) for i in sorted({0, *path})]
            sim = Simulation(path, 0.0, ("get 1 oak log",))
            batch.append(pickle.dumps((ids[t], first, new, values, sim, (1, ""))))
        out.append(batch)
    return out


def driver(args: argparse.Namespace) -> dict[str, list[float]]:
    from engine.search import ray_search as rs

    grown = grow(args.trees, args.nodes)
    stages = ("unpickle", "check", "mirror", "rows", "commit")
    ms: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            with Store(Path(tmp) / f"driver-{i}.db") as store:
                run_id = store.create_run("bench", "synthetic", "none", {}, [t.task for t in grown])
                ids = [tree_id for tree_id, _ in store.tree_ids(run_id)]
                plan = messages(grown, args.simulations, ids)
                mirrors = {tree_id: rs._Mirror(tree_id, tree.task) for tree_id, tree in zip(ids, grown, strict=True)}
                spent = dict.fromkeys(stages, 0.0)
                clock = time.perf_counter
                t_all = clock()
                for batch in plan:
                    rows = []
                    for payload in batch:
                        t0 = clock()
                        message = rs.loads_message(payload)
                        t1 = clock()
                        tree_id, first, new, values, sim, _ = rs.check_sim_message(message, mirrors)
                        t2 = clock()
                        mirror = mirrors[tree_id]
                        mirror.apply(first, new, values, sim)
                        t3 = clock()
                        assert mirror.job is not None
                        rows.append(simulation_rows(tree_id, mirror.job.tree, sim, first))
                        t4 = clock()
                        for stage, a, b in (("unpickle", t0, t1), ("check", t1, t2), ("mirror", t2, t3), ("rows", t3, t4)):
                            spent[stage] += b - a
                    t0 = clock()
                    store.save_simulations(rows)
                    spent["commit"] += clock() - t0
                total_s = clock() - t_all
                n = sum(len(b) for b in plan)
                for stage in stages:
                    ms[stage].append(1000 * spent[stage] / n)
                ms["all"].append(1000 * total_s / n)
    print(f"driver: {args.trees} trees x {args.simulations} simulations ({n}), ~{args.nodes} nodes a tree, "
          f"one batch per round, SQLite file, {args.repeat} repeats; ms per committed simulation:")
    print(f"  {'stage':<10} {'min':>7} {'median':>7} {'max':>7}")
    for stage in (*stages, "all"):
        v = ms[stage]
        print(f"  {stage:<10} {min(v):7.4f} {statistics.median(v):7.4f} {max(v):7.4f}")
    return dict(ms)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", type=int, default=64)
    ap.add_argument("--simulations", type=int, default=24)
    ap.add_argument("--nodes", type=int, default=96, help="nodes per synthetic tree")
    ap.add_argument("--per-tree", type=int, default=1, help="simulations of each tree in one batch")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--driver", action="store_true", help="the sharded driver's work per simulation, stage by stage")
    args = ap.parse_args(argv)
    return driver(args) if args.driver else commits(args)


if __name__ == "__main__":
    main()
