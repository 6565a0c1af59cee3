"""Curation of preference pairs and SFT samples: saving (upserting) builds, queries with filters,
and the version-checked curation writes (engine.store.versioning)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from engine.actions import FormatError, parse
from engine.datasets.pairs import PAIR_KINDS, Pair
from engine.datasets.samples import Sample
from engine.store import columns
from engine.store.columns import named, select
from engine.store.connection import Connection, _in, _valid_text
from engine.store.records import HistoryEntry, SaveReport, StoreError
from engine.store.versioning import _current, _history, _write

# --- datasets: module-level helpers of the Store's datasets section ---------------------------

CURATION_STATUSES = ("pending", "approved", "rejected", "edited")
_STATUS_ACTIONS = {"approved": "approve", "rejected": "reject", "pending": "reset"}
# A row is curated once its history has anything but its creation and automatic rebuilds.
_CURATED = "EXISTS (SELECT 1 FROM {table} h WHERE h.{key} = {row} AND h.action NOT IN ('create', 'rebuild'))"
_CHUNK = 500  # ids per IN (...) list
_PAIR_ORDERS = {
    # Within a run, the content (not the run-salted id) orders the pairs: two runs with the same trees
    # give the same training order, so the same DPO job.
    "tree": "run_id, task_id, node_id, chosen_node, rejected_node, id",
    "gap": "q_chosen - q_rejected DESC, id",
    "updated": "updated_at DESC, id",
}
# What a rebuild reads of a stored row: its version, whether a person curated it, and its content.
_OLD = ("id", "version", "curated")


class EditError(StoreError):
    """A curation edit that is refused (unparseable action, unknown turn, wrong kind of row)."""


def _status_action(status: str) -> str:
    if status not in _STATUS_ACTIONS:
        raise EditError(f"status {status!r} cannot be set directly (use one of {', '.join(_STATUS_ACTIONS)}; "
                        "'edited' comes from editing)")
    return _STATUS_ACTIONS[status]


def _pair_where(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    """SQL for pair filters: run_id, task_id, kind, status (str or list), depth_min, depth_max,
    min_gap (Q(chosen) - Q(rejected) at least this), node_id."""
    known = {"run_id", "task_id", "kind", "status", "depth_min", "depth_max", "min_gap", "node_id"}
    unknown = set(filters) - known
    if unknown:
        raise StoreError(f"unknown pair filter(s): {', '.join(sorted(unknown))}")
    where, args = ["1=1"], []
    if filters.get("run_id") is not None:  # a run's pairs: those it built first, and those it is a source of
        where.append("(run_id=? OR id IN (SELECT pair_id FROM pair_sources WHERE run_id=?))")
        args += [filters["run_id"], filters["run_id"]]
    for key in ("task_id", "node_id"):
        if filters.get(key) is not None:
            where.append(f"{key}=?")
            args.append(filters[key])
    for key in ("kind", "status"):
        if filters.get(key) is not None:
            _in(key, filters[key], where, args)
    for key, sql in (("depth_min", "depth >= ?"), ("depth_max", "depth <= ?"), ("min_gap", "q_chosen - q_rejected >= ?")):
        if filters.get(key) is not None:
            where.append(sql)
            args.append(filters[key])
    return " AND ".join(where), args


def _sample_where(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    unknown = set(filters) - {"run_id", "task_id", "kind", "status"}
    if unknown:
        raise StoreError(f"unknown sample filter(s): {', '.join(sorted(unknown))}")
    where, args = ["1=1"], []
    for key in ("run_id", "task_id"):
        if filters.get(key) is not None:
            where.append(f"{key}=?")
            args.append(filters[key])
    for key in ("kind", "status"):
        if filters.get(key) is not None:
            _in(key, filters[key], where, args)
    return " AND ".join(where), args


def _pair_from_row(row: tuple) -> Pair:
    """A pair from a row of `columns.PAIRS` (its sources are read apart: `_with_sources`)."""
    r = named(columns.PAIRS, row)
    return Pair(**{**r, "prompt": json.loads(r["prompt"]), "merge_key": r["merge_key"] or ""})


def _with_sources(con: Any, pairs: list[Pair]) -> list[Pair]:
    """`pairs` with their sources (pair_sources), each pair's own build first, then by run."""
    found: dict[str, list[dict[str, Any]]] = {}
    ids = [p.id for p in pairs]
    for start in range(0, len(ids), _CHUNK):
        part = ids[start:start + _CHUNK]
        rows = con.execute(
            f"""SELECT pair_id, data FROM pair_sources WHERE pair_id IN ({','.join('?' * len(part))})
                ORDER BY pair_id, CASE WHEN source_id = pair_id THEN 0 ELSE 1 END, run_id, source_id""", part)
        for pair_id, data in rows:
            found.setdefault(pair_id, []).append(json.loads(data))
    return [replace(p, sources=tuple(found[p.id])) if p.id in found else p for p in pairs]


def _sample_from_row(row: tuple) -> Sample:
    """A sample from a row of `columns.SAMPLES`."""
    r = named(columns.SAMPLES, row)
    return Sample.from_data(r["id"], r["kind"], json.loads(r["data"]), run_id=r["run_id"],
                            source=json.loads(r["source"]), status=r["status"], version=r["version"],
                            updated_at=r["updated_at"], updated_by=r["updated_by"])


class CurationStore(Connection):
    """Preference pairs and samples with curation."""

    # --- datasets ----------------------------------------------------------------------------
    # Preference pairs and SFT samples with curation (status, version, history). Rebuilding
    # upserts: new ids are created, untouched rows are refreshed, rows a person has curated are
    # kept exactly as they are, and untouched rows the new build no longer produces are pruned.
    # Every curation write names the version it was based on; a stale one is refused.

    def save_pairs(
        self, run_id: str, pairs: Sequence[Pair], kinds: Sequence[str] = PAIR_KINDS, who: str = "orchard"
    ) -> SaveReport:
        """Upsert a run's pairs of `kinds` in one transaction (see the section comment)."""
        prompts: dict[int, str] = {}

        def content(p: Pair) -> tuple:
            if id(p.prompt) not in prompts:
                prompts[id(p.prompt)] = json.dumps(p.prompt)
            return (p.tree_id, p.task_id, p.node_id, p.chosen_node, p.rejected_node, p.kind, prompts[id(p.prompt)],
                    p.chosen, p.rejected, p.q_chosen, p.q_rejected, p.logprob_chosen, p.logprob_rejected, p.depth)

        for p in pairs:
            if p.run_id != run_id or p.kind not in kinds:
                raise StoreError(f"pair {p.id} (run {p.run_id}, kind {p.kind}) does not belong to this save")
        with self.transaction() as con:
            marks = ",".join("?" * len(kinds))
            old_row = (*_OLD, "status", "merge_key", *columns.PAIR_CONTENT)
            existing = {
                r["id"]: r
                for r in (named(old_row, row) for row in con.execute(
                    f"""SELECT p.id, p.version, {_CURATED.format(table="pair_history", key="pair_id", row="p.id")},
                               p.status, p.merge_key, {select(columns.PAIR_CONTENT, "p")}
                        FROM pairs p WHERE p.run_id=? AND p.kind IN ({marks})""",
                    (run_id, *kinds),
                ))
            }
            # Another run's pair with the same content key takes this build's pair as one more source.
            keys = sorted({p.merge_key for p in pairs if p.merge_key and p.id not in existing})
            elsewhere: dict[str, str] = {}
            for start in range(0, len(keys), _CHUNK):
                part = keys[start:start + _CHUNK]
                for key, pid in con.execute(
                        f"""SELECT merge_key, id FROM pairs WHERE merge_key IN ({','.join('?' * len(part))})
                            AND run_id != ? ORDER BY updated_at, id""", (*part, run_id)):
                    elsewhere.setdefault(key, pid)
            built = {p.id for p in pairs}
            for pid, mine in existing.items():  # then this run's own rows the build makes again
                if mine["merge_key"] and pid in built:
                    elsewhere.setdefault(mine["merge_key"], pid)
            report, now = SaveReport(), time.time()
            inserts: list[tuple[Any, ...]] = []
            updates: list[tuple[Any, ...]] = []
            history: list[tuple[Any, ...]] = []
            keyed: list[tuple[str, str]] = []
            sources: dict[str, tuple[str, str, str, str]] = {}
            for p in pairs:
                row = content(p)
                old = existing.pop(p.id, None)
                target = p.id
                if old is None:
                    if p.merge_key and p.merge_key in elsewhere:
                        target = elsewhere[p.merge_key]
                        report.merged += 1
                    else:
                        inserts.append((p.id, run_id, *row, "pending", 1, now, who, p.merge_key or None))
                        history.append((p.id, 1, now, who, "create", None, json.dumps({"status": "pending"})))
                        report.created += 1
                        if p.merge_key:
                            elsewhere[p.merge_key] = p.id  # a later duplicate in this save joins it
                else:
                    # A rebuild keys its rows (those stored before keys existed too), except a row a person
                    # edited or swapped: its content is theirs now, and no build's duplicate of it.
                    if p.merge_key and old["status"] != "edited" and old["merge_key"] != p.merge_key:
                        keyed.append((p.merge_key, p.id))
                    if old["curated"]:
                        report.kept += 1
                    elif tuple(old[c] for c in columns.PAIR_CONTENT) == row:
                        report.unchanged += 1
                    else:
                        version = old["version"] + 1
                        updates.append((*row, version, now, who, p.id))
                        history.append((p.id, version, now, who, "rebuild", None, None))
                        report.updated += 1
                for src in p.sources:
                    sid = str(src.get("pair_id") or p.id)
                    sources[sid] = (sid, target, run_id, json.dumps(src))
            con.executemany(
                """INSERT INTO pairs (id, run_id, tree_id, task_id, node_id, chosen_node, rejected_node, kind, prompt,
                   chosen, rejected, q_chosen, q_rejected, logprob_chosen, logprob_rejected, depth, status, version,
                   updated_at, updated_by, merge_key) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                inserts,
            )
            con.executemany("UPDATE pairs SET merge_key=? WHERE id=?", keyed)
            # Other runs' pairs this run was a source of (and is no longer): pruned below once nothing makes them.
            # This run's sources: those the build no longer makes, or makes otherwise, are replaced
            # (a rebuild that changes nothing writes none).
            stored = {r["source_id"]: r for r in (named(("source_id", "pair_id", "data", "owner"), row) for row in con.execute(
                f"""SELECT s.source_id, s.pair_id, s.data, p.run_id FROM pair_sources s JOIN pairs p ON p.id = s.pair_id
                    WHERE s.run_id=? AND p.kind IN ({marks})""", (run_id, *kinds)))}
            # Other runs' pairs this run was a source of (and is no longer): pruned below once nothing makes them.
            was = {r["pair_id"] for r in stored.values() if r["owner"] != run_id}
            was -= {target for _, target, _, _ in sources.values()}
            changed = {sid for sid, (_, target, _, data) in sources.items()
                       if sid not in stored or (stored[sid]["pair_id"], stored[sid]["data"]) != (target, data)}
            con.executemany("DELETE FROM pair_sources WHERE source_id=?",
                            [(sid,) for sid in stored if sid not in sources or sid in changed])
            con.executemany("INSERT INTO pair_sources (source_id, pair_id, run_id, data) VALUES (?,?,?,?)",
                            [sources[sid] for sid in changed])
            con.executemany(
                """UPDATE pairs SET tree_id=?, task_id=?, node_id=?, chosen_node=?, rejected_node=?, kind=?, prompt=?,
                   chosen=?, rejected=?, q_chosen=?, q_rejected=?, logprob_chosen=?, logprob_rejected=?, depth=?,
                   version=?, updated_at=?, updated_by=? WHERE id=?""",
                updates,
            )
            con.executemany(columns.insert("pair_history", ("pair_id", *columns.HISTORY_ROW)), history)
            stale = [pid for pid, old in existing.items() if not old["curated"]]
            report.stale_curated = len(existing) - len(stale)
            curated = _CURATED.format(table="pair_history", key="pair_id", row="p.id")
            for pid in sorted(was):  # no source left and uncurated: no build makes it any more
                row = con.execute(f"""SELECT {curated}, EXISTS (SELECT 1 FROM pair_sources s WHERE s.pair_id = p.id)
                                      FROM pairs p WHERE p.id=?""", (pid,)).fetchone()
                if row is not None and not any(named(("curated", "has_sources"), row).values()):
                    stale.append(pid)
            shared: set[str] = set()  # leftovers other runs' builds are still a source of: kept
            for start in range(0, len(stale), _CHUNK):
                part = stale[start:start + _CHUNK]
                shared.update(pid for pid, in con.execute(
                    f"SELECT DISTINCT pair_id FROM pair_sources WHERE pair_id IN ({','.join('?' * len(part))})", part))
            gone = [(pid,) for pid in stale if pid not in shared]
            con.executemany("DELETE FROM pairs WHERE id=?", gone)
            con.executemany("DELETE FROM pair_history WHERE pair_id=?", gone)
            report.pruned, report.kept_for_other_runs = len(gone), len(shared)
        return report

    def pairs(self, limit: int | None = None, offset: int = 0, order: str = "tree", **filters: Any) -> list[Pair]:
        """Pairs matching `filters` (see `_pair_where`), in `order`: "tree" (run, task, node),
        "gap" (largest Q gap first) or "updated" (most recently changed first)."""
        if order not in _PAIR_ORDERS:
            raise StoreError(f"unknown pair order {order!r} (expected one of {', '.join(_PAIR_ORDERS)})")
        where, args = _pair_where(filters)
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        rows = self.con.execute(
            f"SELECT {select(columns.PAIRS)} FROM pairs WHERE {where} ORDER BY {_PAIR_ORDERS[order]}{page}", args
        ).fetchall()
        return _with_sources(self.con, [_pair_from_row(r) for r in rows])

    def pair(self, pair_id: str) -> Pair:
        row = self.con.execute(f"SELECT {select(columns.PAIRS)} FROM pairs WHERE id=?", (pair_id,)).fetchone()
        if row is None:
            raise StoreError(f"no pair {pair_id!r}")
        return _with_sources(self.con, [_pair_from_row(row)])[0]

    def pair_counts(self, **filters: Any) -> dict[str, int]:
        """How many pairs match `filters`, per status, plus "total"."""
        where, args = _pair_where(filters)
        counts = dict.fromkeys(CURATION_STATUSES, 0)
        counts.update(self.con.execute(f"SELECT status, COUNT(*) FROM pairs WHERE {where} GROUP BY status", args))
        counts["total"] = sum(counts.values())
        return counts

    def pair_history(self, pair_id: str) -> list[HistoryEntry]:
        return _history(self.con, "pair_history", "pair_id", pair_id)

    def set_pair_status(self, pair_id: str, status: str, who: str, expected_version: int) -> Pair:
        """Approve, reject or reset (`pending`) one pair, if nobody changed it since `expected_version`."""
        action = _status_action(status)
        with self.transaction() as con:
            old = _current(con, "pairs", "pair", pair_id, expected_version)
            _write(con, "pairs", "pair_history", "pair_id", pair_id, old, who, action,
                   {"status": old["status"]}, {"status": status}, {"status": status})
            return self.pair(pair_id)  # read in the transaction: this save's version, not a later one

    def edit_pair(self, pair_id: str, chosen: str, rejected: str, who: str, expected_version: int) -> Pair:
        """Replace a step pair's texts; each changed text must parse as a composite action."""
        with self.transaction() as con:
            old = _current(con, "pairs", "pair", pair_id, expected_version)
            if old["kind"] != "step":
                raise EditError(f"pair {pair_id} is a {old['kind']} pair: only step pairs can be edited as text")
            for name, text in (("chosen", chosen), ("rejected", rejected)):
                if text != old[name]:
                    parsed = parse(text)
                    if isinstance(parsed, FormatError):
                        raise EditError(f"pair {pair_id}: edited {name} is not a composite action: {parsed.reason}")
            if chosen == rejected:
                raise EditError(f"pair {pair_id}: chosen and rejected would be the same text")
            before = {"chosen": old["chosen"], "rejected": old["rejected"]}
            after = {"chosen": chosen, "rejected": rejected}
            _write(con, "pairs", "pair_history", "pair_id", pair_id, old, who, "edit", before, after,
                   {**after, "status": "edited", "merge_key": None})  # a person's content: no build's duplicate
            return self.pair(pair_id)  # read in the transaction: this save's version, not a later one

    def swap_pair(self, pair_id: str, who: str, expected_version: int) -> Pair:
        """Exchange chosen and rejected (texts, nodes, values, log-probs): the preference was wrong."""
        with self.transaction() as con:
            old = _current(con, "pairs", "pair", pair_id, expected_version)
            names = ("chosen", "chosen_node", "q_chosen", "logprob_chosen")
            swapped = {}
            for a in names:
                b = a.replace("chosen", "rejected")
                swapped[a], swapped[b] = old[b], old[a]
            before = {"chosen_node": old["chosen_node"], "rejected_node": old["rejected_node"]}
            after = {"chosen_node": old["rejected_node"], "rejected_node": old["chosen_node"]}
            _write(con, "pairs", "pair_history", "pair_id", pair_id, old, who, "swap", before, after,
                   {**swapped, "status": "edited", "merge_key": None})  # the reverse of what builds make
            return self.pair(pair_id)  # read in the transaction: this save's version, not a later one

    def bulk_set_pair_status(self, status: str, who: str, **filters: Any) -> int:
        """Set `status` on every pair matching `filters` (one transaction); returns how many changed."""
        action = _status_action(status)
        where, args = _pair_where(filters)
        now = time.time()
        with self.transaction() as con:
            rows = con.execute(f"SELECT id, version, status FROM pairs WHERE {where} AND status != ?",
                               (*args, status)).fetchall()
            con.executemany("UPDATE pairs SET status=?, version=?, updated_at=?, updated_by=? WHERE id=?",
                            [(status, v + 1, now, who, pid) for pid, v, _ in rows])
            con.executemany(
                columns.insert("pair_history", ("pair_id", *columns.HISTORY_ROW)),
                [(pid, v + 1, now, who, action, json.dumps({"status": s}), json.dumps({"status": status}))
                 for pid, v, s in rows],
            )
        return len(rows)

    def save_samples(
        self, samples: Sequence[Sample], prune_run: str | None = None, prune_kinds: Sequence[str] = (),
        who: str = "orchard",
    ) -> SaveReport:
        """Upsert samples in one transaction; with `prune_run`, untouched samples of that run and
        `prune_kinds` that are not in `samples` are deleted (a rebuild's leftovers)."""
        with self.transaction() as con:
            ids = [s.id for s in samples]
            existing: dict[str, dict[str, Any]] = {}
            curated = _CURATED.format(table="sample_history", key="sample_id", row="s.id")
            old_row = (*_OLD, *columns.SAMPLE_CONTENT)
            query = f"SELECT s.id, s.version, {curated}, {select(columns.SAMPLE_CONTENT, 's')} FROM samples s"
            for chunk in range(0, len(ids), 500):
                part = ids[chunk : chunk + 500]
                for row in con.execute(f"{query} WHERE s.id IN ({','.join('?' * len(part))})", part):
                    r = named(old_row, row)
                    existing[r["id"]] = r
            if prune_run is not None and prune_kinds:
                marks = ",".join("?" * len(prune_kinds))
                for row in con.execute(f"{query} WHERE s.run_id=? AND s.kind IN ({marks})", (prune_run, *prune_kinds)):
                    r = named(old_row, row)
                    existing.setdefault(r["id"], r)
            report, now = SaveReport(), time.time()
            inserts: list[tuple[Any, ...]] = []
            updates: list[tuple[Any, ...]] = []
            history: list[tuple[Any, ...]] = []
            for s in samples:
                row = (s.kind, s.run_id, _valid_text(s.task.id, f"sample {s.id}: task id"), json.dumps(s.source),
                       json.dumps(s.data()))
                old = existing.pop(s.id, None)
                if old is None:
                    inserts.append((s.id, *row, "pending", 1, now, who))
                    history.append((s.id, 1, now, who, "create", None, json.dumps({"status": "pending"})))
                    report.created += 1
                elif old["curated"]:
                    report.kept += 1
                elif tuple(old[c] for c in columns.SAMPLE_CONTENT) == row:
                    report.unchanged += 1
                else:
                    updates.append((*row, old["version"] + 1, now, who, s.id))
                    history.append((s.id, old["version"] + 1, now, who, "rebuild", None, None))
                    report.updated += 1
            con.executemany(columns.insert("samples", columns.SAMPLE_ROW), inserts)
            con.executemany(
                "UPDATE samples SET kind=?, run_id=?, task_id=?, source=?, data=?, version=?, updated_at=?, "
                "updated_by=? WHERE id=?",
                updates,
            )
            con.executemany(columns.insert("sample_history", ("sample_id", *columns.HISTORY_ROW)), history)
            stale = [(sid,) for sid, old in existing.items() if not old["curated"]]
            report.stale_curated = len(existing) - len(stale)
            con.executemany("DELETE FROM samples WHERE id=?", stale)
            con.executemany("DELETE FROM sample_history WHERE sample_id=?", stale)
            report.pruned = len(stale)
        return report

    def samples(self, limit: int | None = None, offset: int = 0, **filters: Any) -> list[Sample]:
        """Samples matching `filters` (run_id, task_id, kind, status; kind/status may be lists)."""
        where, args = _sample_where(filters)
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        rows = self.con.execute(
            f"SELECT {select(columns.SAMPLES)} FROM samples WHERE {where} ORDER BY kind, run_id, task_id, id{page}", args
        ).fetchall()
        return [_sample_from_row(r) for r in rows]

    def sample(self, sample_id: str) -> Sample:
        row = self.con.execute(f"SELECT {select(columns.SAMPLES)} FROM samples WHERE id=?", (sample_id,)).fetchone()
        if row is None:
            raise StoreError(f"no sample {sample_id!r}")
        return _sample_from_row(row)

    def sample_counts(self, **filters: Any) -> dict[str, int]:
        where, args = _sample_where(filters)
        counts = dict.fromkeys(CURATION_STATUSES, 0)
        counts.update(self.con.execute(f"SELECT status, COUNT(*) FROM samples WHERE {where} GROUP BY status", args))
        counts["total"] = sum(counts.values())
        return counts

    def sample_history(self, sample_id: str) -> list[HistoryEntry]:
        return _history(self.con, "sample_history", "sample_id", sample_id)

    def set_sample_status(self, sample_id: str, status: str, who: str, expected_version: int) -> Sample:
        action = _status_action(status)
        with self.transaction() as con:
            old = _current(con, "samples", "sample", sample_id, expected_version)
            _write(con, "samples", "sample_history", "sample_id", sample_id, old, who, action,
                   {"status": old["status"]}, {"status": status}, {"status": status})
            return self.sample(sample_id)  # read in the transaction: this save's version, not a later one

    def set_turn_loss(self, sample_id: str, turn: int, loss: bool | None, who: str, expected_version: int) -> Sample:
        """Set one turn's loss flag (True / False / None = unspecified)."""
        if loss not in (True, False, None):
            raise EditError(f"sample {sample_id}: loss must be true, false or null, got {loss!r}")
        with self.transaction() as con:
            old = _current(con, "samples", "sample", sample_id, expected_version)
            data = json.loads(old["data"])
            if not 0 <= turn < len(data["turns"]):
                raise EditError(f"sample {sample_id} has no turn {turn} (it has {len(data['turns'])})")
            before = {"turn": turn, "loss": data["turns"][turn]["loss"]}
            data["turns"][turn]["loss"] = loss
            _write(con, "samples", "sample_history", "sample_id", sample_id, old, who, "edit", before,
                   {"turn": turn, "loss": loss}, {"data": json.dumps(data), "status": "edited"})
            return self.sample(sample_id)  # read in the transaction: this save's version, not a later one
