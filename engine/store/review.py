"""Work shared out among curators: leases, reviews, settlements and the final-label rule.

A queue hands a curator items (pairs or samples) that nobody else holds right now: a lease row per
item, taken with one conditional upsert, so two curators racing for an item cannot both get it on
either backend. A review is saved only under its curator's live lease and only on the version the
curator saw. Each item needs `required_reviews` independent reviews (a setting).

The final label (docs/decisions.md, "Final label rule"):
1. a maintainer's settlement, if any (the latest);
2. else, once the item has its required reviews, their label if they are unanimous
   (rule "majority": the label of a strict majority of its reviews);
3. else, for an item nobody reviewed while one review is all an item needs (the default: a single
   curator), its curation status (approved / edited / rejected; pending has none);
4. else unsettled: training leaves it out.
Training with `include_pending` (the one rule for DPO, SFT, RFT, `orchard iterate` and the demo:
`engine.train.selection.keep_labelled`) adds only UNDECIDED items: pending, with no decision at all
(`FinalLabel.undecided`). An item whose reviewers disagree, that has fewer reviews than required,
or whose reviews went stale is unsettled, and is never trained on until it is settled.
Reaching 1 or 2 also sets the item's curation status, so every page and count shows the label.

Decisions are about the content a curator saw: each records the item's version, and one recorded
before the item's content last changed (a swap, an edit, a rebuild: CONTENT_ACTIONS in its history)
no longer counts anywhere here (label, queue, progress, agreement); it stays in `decisions` for the
record. A swapped pair with two approvals is therefore back in the queue and unsettled, and says why.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from engine.store import columns
from engine.store.columns import named, select
from engine.store.connection import Connection
from engine.store.records import Decision, FinalLabel, LeaseError, StoreError
from engine.store.versioning import _current, _write

ITEM_KINDS = {"pair": ("pairs", "pair_history", "pair_id"), "sample": ("samples", "sample_history", "sample_id")}
REVIEW_LABELS = ("approved", "rejected")
LABEL_RULES = ("settled", "majority")
DEFAULT_LEASE_S = 600.0
_ACTIONS = {"approved": "approve", "rejected": "reject"}
_DECISION_COLUMNS = select(columns.DECISIONS)
# History actions that change what an item says (not only its status): decisions made on an earlier
# version are about other content.
CONTENT_ACTIONS = ("create", "rebuild", "edit", "swap")
_CONTENT_SQL = "(" + ", ".join(f"'{a}'" for a in CONTENT_ACTIONS) + ")"


def _decision(row: Sequence[Any]) -> Decision:
    """A decision from a row of `columns.DECISIONS`."""
    return Decision(**named(columns.DECISIONS, row))


def _tables(kind: str) -> tuple[str, str, str]:
    if kind not in ITEM_KINDS:
        raise StoreError(f"unknown item kind {kind!r} (expected pair or sample)")
    return ITEM_KINDS[kind]


def _label(label: str) -> str:
    if label not in REVIEW_LABELS:
        raise StoreError(f"label {label!r}: expected approved or rejected")
    return label


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _chunks(ids: Sequence[str], size: int = 500) -> Iterable[Sequence[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def _live_sql(kind: str) -> str:
    """SQL true for a decision row `d` made on the item's current content."""
    _, history, key = _tables(kind)
    return (f"d.item_version >= COALESCE((SELECT MAX(h.version) FROM {history} h WHERE h.{key} = d.item_id "
            f"AND h.action IN {_CONTENT_SQL}), 0)")


def _content_versions(con: Any, kind: str, ids: Sequence[str]) -> dict[str, int]:
    """item id -> the version at which its content last changed."""
    _, history, key = _tables(kind)
    out: dict[str, int] = {}
    for part in _chunks(list(ids)):
        out.update(con.execute(f"SELECT {key}, MAX(version) FROM {history} WHERE action IN {_CONTENT_SQL} AND "
                               f"{key} IN ({','.join('?' * len(part))}) GROUP BY {key}", tuple(part)).fetchall())
    return out


def split_live(con: Any, kind: str, by_item: dict[str, list[Decision]],
               ) -> tuple[dict[str, list[Decision]], dict[str, list[Decision]]]:
    """(live, stale) decisions per item: stale ones were made before the item's content last changed."""
    versions = _content_versions(con, kind, list(by_item))
    live: dict[str, list[Decision]] = {}
    stale: dict[str, list[Decision]] = {}
    for item_id, ds in by_item.items():
        for d in ds:
            (live if d.item_version >= versions.get(item_id, 0) else stale).setdefault(item_id, []).append(d)
    return live, stale


def rule_label(reviews: Sequence[Decision], settles: Sequence[Decision], required: int,
               rule: str = "settled") -> FinalLabel | None:
    """Steps 1, 2 and 4 of the rule for one item (None: it has no decisions, step 3 applies)."""
    if rule not in LABEL_RULES:
        raise StoreError(f"unknown label rule {rule!r} (expected one of {', '.join(LABEL_RULES)})")
    if settles:
        last = max(settles, key=lambda d: (d.at, d.id))
        return FinalLabel(last.label, (last.id,), f"settled by {last.who}")
    if not reviews:
        return None
    if len(reviews) < required:
        return FinalLabel(None, (), f"{len(reviews)} of {required} reviews")
    counts = Counter(d.label for d in reviews)
    top, n = counts.most_common(1)[0]
    ids = tuple(sorted(d.id for d in reviews if d.label == top))
    if n == len(reviews):
        return FinalLabel(top, ids, f"unanimous ({n} reviews)")
    if rule == "majority" and 2 * n > len(reviews):
        return FinalLabel(top, ids, f"majority ({n} of {len(reviews)})")
    return FinalLabel(None, (), f"reviewers disagree ({dict(counts)})")


class ReviewStore(Connection):
    # --- settings ---------------------------------------------------------------------------------

    def required_reviews(self) -> int:
        row = self.con.execute("SELECT value FROM curation_settings WHERE key='required_reviews'").fetchone()
        try:
            n = int(row[0]) if row else 1
        except (TypeError, ValueError):
            n = 0
        if not 1 <= n <= 20:
            raise StoreError(f"required reviews: the stored setting {str(row[0])[:20]!r} is not a whole number "
                             "from 1 to 20 (set it again on the Review queue page)") from None
        return n

    def set_required_reviews(self, n: int) -> None:
        if not isinstance(n, int) or not 1 <= n <= 20:
            raise StoreError(f"required reviews: expected a whole number from 1 to 20, got {n!r}")
        with self.transaction() as con:
            if con.execute("UPDATE curation_settings SET value=? WHERE key='required_reviews'", (str(n),)).rowcount == 0:
                con.execute("INSERT INTO curation_settings (key, value) VALUES ('required_reviews', ?)", (str(n),))

    # --- the queue: leases ------------------------------------------------------------------------

    def claim(self, kind: str, who: str, n: int = 10, run_id: str | None = None, lease_s: float = DEFAULT_LEASE_S,
              now: float | None = None) -> list[str]:
        """Up to `n` items for `who`: those they hold already (renewed), then items that still need a
        review, that `who` has not reviewed, not settled and held by nobody. Each lease lasts `lease_s`."""
        table, _, _ = _tables(kind)
        now = time.time() if now is None else now
        required = self.required_reviews()
        with self.transaction() as con:
            con.execute("UPDATE leases SET expires_at=? WHERE item_kind=? AND holder=? AND expires_at > ?",
                        (now + lease_s, kind, who, now))
            held = [item_id for item_id, in con.execute(
                "SELECT item_id FROM leases WHERE item_kind=? AND holder=? AND expires_at > ? ORDER BY taken_at, item_id",
                (kind, who, now))]
            want = n - len(held)
            if want <= 0:
                return held[:n]
            run_sql, run_args = ("AND t.run_id=?", [run_id]) if run_id is not None else ("", [])
            live = _live_sql(kind)
            candidates = [item_id for item_id, in con.execute(
                f"""SELECT t.id FROM {table} t WHERE 1=1 {run_sql}
                    AND NOT EXISTS (SELECT 1 FROM decisions d WHERE d.item_kind=? AND d.item_id=t.id
                                    AND (d.role='settle' OR d.who=?) AND {live})
                    AND (SELECT COUNT(*) FROM decisions d WHERE d.item_kind=? AND d.item_id=t.id
                         AND d.role='review' AND {live}) < ?
                    AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.item_kind=? AND l.item_id=t.id
                                    AND l.expires_at > ?)
                    ORDER BY t.id LIMIT ?""",
                (*run_args, kind, who, kind, required, kind, now, want * 4 + 8))]
            got: list[str] = []
            for item_id in candidates:
                if len(got) == want:
                    break
                # Taken only if free or expired: the database decides, so a racing claim gets 0 rows.
                cur = con.execute(
                    """INSERT INTO leases (item_kind, item_id, holder, taken_at, expires_at) VALUES (?,?,?,?,?)
                       ON CONFLICT (item_kind, item_id) DO UPDATE SET holder=excluded.holder,
                       taken_at=excluded.taken_at, expires_at=excluded.expires_at WHERE leases.expires_at <= ?""",
                    (kind, item_id, who, now, now + lease_s, now))
                if cur.rowcount != 1:
                    continue
                # A review committed since the candidates were read (another backend's isolation) may
                # have completed the item: give it back rather than ask for a review too many.
                done = con.execute(f"SELECT COUNT(*) FROM decisions d WHERE d.item_kind=? AND d.item_id=? "
                                   f"AND d.role='review' AND {live}", (kind, item_id)).fetchone()[0]
                if done >= required:
                    con.execute("DELETE FROM leases WHERE item_kind=? AND item_id=? AND holder=?", (kind, item_id, who))
                else:
                    got.append(item_id)
        return held + got

    def held(self, kind: str, who: str, now: float | None = None) -> list[tuple[str, float]]:
        """(item id, lease expiry) of the items `who` holds now."""
        now = time.time() if now is None else now
        return [(item_id, expires_at) for item_id, expires_at in self.con.execute(
            "SELECT item_id, expires_at FROM leases WHERE item_kind=? AND holder=? AND expires_at > ? "
            "ORDER BY taken_at, item_id", (kind, who, now))]

    def lease_holders(self, kind: str, now: float | None = None) -> dict[str, str]:
        """item id -> who holds it now (for checks and the progress view)."""
        now = time.time() if now is None else now
        return dict(self.con.execute("SELECT item_id, holder FROM leases WHERE item_kind=? AND expires_at > ?",
                                     (kind, now)).fetchall())

    def release(self, kind: str, who: str, item_ids: Sequence[str] | None = None) -> int:
        """Give items back to the queue (all of `who`'s of `kind` when `item_ids` is None)."""
        with self.transaction() as con:
            if item_ids is None:
                return con.execute("DELETE FROM leases WHERE item_kind=? AND holder=?", (kind, who)).rowcount
            return sum(con.execute("DELETE FROM leases WHERE item_kind=? AND item_id=? AND holder=?",
                                   (kind, i, who)).rowcount for i in item_ids)

    # --- decisions -----------------------------------------------------------------------------------

    def review(self, kind: str, item_id: str, who: str, label: str, expected_version: int,
               now: float | None = None) -> Decision:
        """Save `who`'s review of an item they hold. Refused (LeaseError) without a live lease, and
        (ConflictError) when the item changed since `expected_version`."""
        table, _, _ = _tables(kind)
        _label(label)
        now = time.time() if now is None else now
        with self.transaction() as con:
            row = con.execute(f"SELECT {select(columns.LEASES)} FROM leases WHERE item_kind=? AND item_id=?",
                              (kind, item_id)).fetchone()
            lease = named(columns.LEASES, row) if row is not None else None
            if lease is None or lease["holder"] != who:
                other = f" (it is held by {lease['holder']} now)" if lease is not None and lease["expires_at"] > now else ""
                raise LeaseError(f"{kind} {item_id} is not handed to you{other}: not saved; take it from your queue")
            if lease["expires_at"] <= now:
                minutes = (lease["expires_at"] - lease["taken_at"]) / 60
                raise LeaseError(f"your lease on {kind} {item_id} expired at {_clock(lease['expires_at'])} ({minutes:.0f} min "
                                 "after it was handed to you): not saved; take it from your queue again")
            old = _current(con, table, kind, item_id, expected_version)
            if con.execute(f"SELECT 1 FROM decisions d WHERE d.item_kind=? AND d.item_id=? AND d.who=? "
                           f"AND d.role='review' AND {_live_sql(kind)}", (kind, item_id, who)).fetchone():
                raise StoreError(f"{kind} {item_id}: you reviewed it already")
            decision = Decision(secrets.token_hex(8), kind, item_id, old["run_id"], who, "review", label,
                                old["version"], now)
            self._insert_decision(con, decision)
            con.execute("DELETE FROM leases WHERE item_kind=? AND item_id=?", (kind, item_id))
            self._mirror(con, kind, item_id, who)
        return decision

    def settle(self, kind: str, item_id: str, who: str, label: str, now: float | None = None) -> Decision:
        """A maintainer's final word on an item (the caller checks the role): step 1 of the rule."""
        table, _, _ = _tables(kind)
        _label(label)
        now = time.time() if now is None else now
        with self.transaction() as con:
            row = con.execute(f"SELECT run_id, version FROM {table} WHERE id=?", (item_id,)).fetchone()
            if row is None:
                raise StoreError(f"no {kind} {item_id!r}")
            run_id, version = row
            decision = Decision(secrets.token_hex(8), kind, item_id, run_id, who, "settle", label, version, now)
            self._insert_decision(con, decision)
            con.execute("DELETE FROM leases WHERE item_kind=? AND item_id=?", (kind, item_id))
            self._mirror(con, kind, item_id, who)
        return decision

    @staticmethod
    def _insert_decision(con: Any, d: Decision) -> None:
        con.execute(f"INSERT INTO decisions ({_DECISION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
                    (d.id, d.item_kind, d.item_id, d.run_id, d.who, d.role, d.label, d.item_version, d.at))

    def _mirror(self, con: Any, kind: str, item_id: str, who: str) -> None:
        """Once the rule gives the item a label, its curation status says so too (one history entry)."""
        table, history, key = _tables(kind)
        decisions = split_live(con, kind, self._decisions_of(con, kind, [item_id]))[0].get(item_id, [])
        final = rule_label([d for d in decisions if d.role == "review"], [d for d in decisions if d.role == "settle"],
                           self.required_reviews())
        if final is None or final.label is None:
            return
        old = _current(con, table, kind, item_id, con.execute(f"SELECT version FROM {table} WHERE id=?",
                                                              (item_id,)).fetchone()[0])
        # An edited pair that is approved stays "edited": that status tells training its texts changed.
        if old["status"] != final.label and not (final.label == "approved" and old["status"] == "edited"):
            _write(con, table, history, key, item_id, old, who, _ACTIONS[final.label], {"status": old["status"]},
                   {"status": final.label, "decisions": list(final.decision_ids)}, {"status": final.label})

    @staticmethod
    def _decisions_of(con: Any, kind: str, ids: Sequence[str]) -> dict[str, list[Decision]]:
        out: dict[str, list[Decision]] = {}
        for part in _chunks(list(ids)):
            rows = con.execute(f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE item_kind=? AND item_id IN "
                               f"({','.join('?' * len(part))}) ORDER BY at, id", (kind, *part))
            for r in rows:
                d = _decision(r)
                out.setdefault(d.item_id, []).append(d)
        return out

    def decisions(self, kind: str, run_id: str | None = None, item_ids: Sequence[str] | None = None) -> list[Decision]:
        """Decisions on items of `kind` (of one run, or of `item_ids`), oldest first."""
        _tables(kind)
        if item_ids is not None:
            return [d for ds in self._decisions_of(self.con, kind, item_ids).values() for d in ds]
        run_sql, args = ("AND run_id=?", (run_id,)) if run_id is not None else ("", ())
        rows = self.con.execute(f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE item_kind=? {run_sql} "
                                "ORDER BY at, id", (kind, *args))
        return [_decision(r) for r in rows]

    # --- the final label ----------------------------------------------------------------------------

    def final_labels(self, kind: str, item_ids: Sequence[str], rule: str = "settled") -> dict[str, FinalLabel]:
        """The rule's label for each item (module docstring), with the decision ids it rests on.
        Step 3's decision id names the history entry that set the status: `pair:ID@vN`."""
        table, _, _ = _tables(kind)
        required = self.required_reviews()
        decisions, stale = split_live(self.con, kind, self._decisions_of(self.con, kind, item_ids))
        out: dict[str, FinalLabel] = {}
        unreviewed = []
        for item_id in item_ids:
            ds = decisions.get(item_id, [])
            final = rule_label([d for d in ds if d.role == "review"], [d for d in ds if d.role == "settle"],
                               required, rule)
            if final is None:
                unreviewed.append(item_id)
            else:
                out[item_id] = final
        for part in _chunks(unreviewed):
            rows = self.con.execute(f"SELECT id, status, version FROM {table} WHERE id IN ({','.join('?' * len(part))})",
                                    tuple(part))
            for item_id, status, version in rows:
                if stale.get(item_id) and required > 1:
                    out[item_id] = FinalLabel(None, (), f"changed after its {len(stale[item_id])} decision(s): "
                                                        "to be reviewed again")
                elif status == "pending" or required > 1:  # several reviews wanted: one status is not enough
                    out[item_id] = FinalLabel(None, (), "not reviewed",
                                              undecided=status == "pending" and item_id not in stale)
                else:
                    out[item_id] = FinalLabel(status, (f"{kind}:{item_id}@v{version}",), f"{status} by one curator")
        return out

    def _live_decisions(self, kind: str, run_id: str | None) -> list[Decision]:
        """`decisions` less those made before their item's content last changed."""
        by_item: dict[str, list[Decision]] = {}
        for d in self.decisions(kind, run_id):
            by_item.setdefault(d.item_id, []).append(d)
        live = split_live(self.con, kind, by_item)[0]
        return sorted((d for ds in live.values() for d in ds), key=lambda d: (d.at, d.id))

    def disagreements(self, kind: str, run_id: str | None = None) -> list[tuple[str, dict[str, str]]]:
        """Unsettled items whose reviews differ: (item id, {reviewer: label}), for a maintainer to settle."""
        by_item: dict[str, list[Decision]] = {}
        for d in self._live_decisions(kind, run_id):
            by_item.setdefault(d.item_id, []).append(d)
        out = []
        for item_id, ds in sorted(by_item.items()):
            if any(d.role == "settle" for d in ds):
                continue
            labels = {d.who: d.label for d in ds if d.role == "review"}
            if len(set(labels.values())) > 1:
                out.append((item_id, labels))
        return out

    def review_progress(self, kind: str, run_id: str | None = None, now: float | None = None) -> dict[str, Any]:
        """Per curator: reviews made and items held now; and per item count how many are complete."""
        table, _, _ = _tables(kind)
        now = time.time() if now is None else now
        run_sql, args = ("AND run_id=?", (run_id,)) if run_id is not None else ("", ())
        reviews = dict(self.con.execute(
            f"SELECT who, COUNT(*) FROM decisions d WHERE item_kind=? AND role='review' {run_sql} "
            f"AND {_live_sql(kind)} GROUP BY who", (kind, *args)).fetchall())
        held = dict(self.con.execute("SELECT holder, COUNT(*) FROM leases WHERE item_kind=? AND expires_at > ? "
                                     "GROUP BY holder", (kind, now)).fetchall())
        total = self.con.execute(f"SELECT COUNT(*) FROM {table} WHERE 1=1 {run_sql}", args).fetchone()[0]
        required = self.required_reviews()
        per_item: Counter[str] = Counter()
        settled = set()
        for d in self._live_decisions(kind, run_id):
            if d.role == "review":
                per_item[d.item_id] += 1
            else:
                settled.add(d.item_id)
        complete = sum(1 for i, c in per_item.items() if c >= required and i not in settled) + len(settled)
        curators = sorted(set(reviews) | set(held))
        return {"required": required, "items": total, "complete": complete,
                "curators": {c: {"reviews": reviews.get(c, 0), "holding": held.get(c, 0)} for c in curators}}

    def agreement(self, kind: str, run_id: str | None = None) -> dict[str, Any]:
        """Raw agreement and Cohen's / Fleiss' kappa over the reviews (engine.datasets.agreement)."""
        from engine.datasets.agreement import agreement_report

        labels: dict[str, dict[str, str]] = {}
        for d in self._live_decisions(kind, run_id):
            if d.role == "review":
                labels.setdefault(d.item_id, {})[d.who] = d.label
        return agreement_report(labels)
