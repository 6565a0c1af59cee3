"""Training jobs, the models they produce, evaluations and iteration-loop records."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine import paths
from engine.store import columns
from engine.store.columns import named, select
from engine.store.connection import Connection, _in, _valid_text
from engine.store.records import JobInfo, ModelRecord, StoreError

# --- training: module-level helpers of the Store's training section ---------------------------

_JOB_COLUMNS = select(columns.JOBS)
_MODEL_COLUMNS = select(columns.MODELS)


def _stored_object(text: Any, where: str) -> dict[str, Any] | str:
    """A stored JSON object, or a line saying why the text is not one."""
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return f"{where} is not JSON"
    return value if isinstance(value, dict) else f"{where} is a JSON {type(value).__name__}, not an object"


def _job_from_row(row: tuple) -> JobInfo:
    """A job from a row of `columns.JOBS`. A config that is not a JSON object (a row edited outside Orchard)
    becomes {"unreadable": why}, which every job kind refuses as an unknown field: the job fails in one line
    and the queue goes on (a traceback here would stop every poll); unreadable progress is shown as none."""
    r = named(columns.JOBS, row)
    config = _stored_object(r["config"], f"job {r['id']}: its stored config")
    progress = _stored_object(r["progress"], "progress")
    return JobInfo(**{**r, "config": config if isinstance(config, dict) else {"unreadable": config},
                      "progress": progress if isinstance(progress, dict) else {},
                      "cancel_requested": bool(r["cancel_requested"])})


def _model_from_row(row: tuple) -> ModelRecord:
    """A model record from a row of `columns.MODELS`."""
    r = named(columns.MODELS, row)
    return ModelRecord(**{**r, "data_ids": json.loads(r["data_ids"]), "config": json.loads(r["config"]),
                          "metrics": json.loads(r["metrics"])})


class TrainingStore(Connection):
    """Jobs, models, evaluations and iterations."""

    # --- training ----------------------------------------------------------------------------
    # Training jobs (state machine queued -> running -> succeeded | failed | cancelled; queued ->
    # cancelled), their progress and metric stream, the models they produced, evaluations of
    # models, and iteration-loop records. Jobs run in their own processes that write here through
    # their own connections (WAL): the job's state lives in the store, so a dashboard restart loses
    # nothing, and a job whose process died is detected by its runner (engine.jobs.runner).

    def create_job(self, kind: str, config: dict[str, Any], device: str, name: str | None = None,
                   log_dir: str | Path | None = None, guard: Callable[[], None] | None = None) -> JobInfo:
        """A new queued job; its log file goes to `log_dir` (default: `jobs/` beside the database).
        `guard` runs inside the insert's (write-locked) transaction and may raise to refuse the job
        (the job runner refuses a second live job on one output folder with it)."""
        job_id = uuid.uuid4().hex[:10]
        logs = Path(log_dir) if log_dir is not None else paths.jobs_dir(self.path)
        now = time.time()
        with self.transaction() as con:
            if guard is not None:
                guard()
            con.execute(
                "INSERT INTO jobs (id, kind, name, config, state, device, created_at, progress, log_path) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (job_id, kind, name or f"{kind}-{job_id}", json.dumps(config), "queued", device, now, "{}",
                 str(logs / f"{job_id}.log")),
            )
        return self.job(job_id)

    def job(self, job_id: str) -> JobInfo:
        row = self.con.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise StoreError(f"no job {job_id!r} in {self.path}")
        return _job_from_row(row)

    def find_job(self, key: str) -> str:
        """A job id from an id or a unique id prefix, compared as text (`%` and `_` are no wildcards)."""
        if not key:
            raise StoreError("empty job id: name a job (id or id prefix; `orchard jobs` lists them)")
        _valid_text(key, "job")
        ids = [r[0] for r in self.con.execute("SELECT id FROM jobs WHERE substr(id, 1, ?)=? ORDER BY created_at",
                                              (len(key), key.lower()))]  # lower-case hex ids, as LIKE matched
        if key in ids:
            return key
        if not ids:
            raise StoreError(f"no job {key!r} in {self.path}")
        if len(ids) > 1:
            raise StoreError(f"job {key!r} is ambiguous: {', '.join(ids)}")
        return ids[0]

    def jobs(self, state: str | Sequence[str] | None = None, device: str | None = None) -> list[JobInfo]:
        """Jobs, oldest first, optionally only those in `state` (one or several) on `device`."""
        where: list[str] = ["1=1"]
        args: list[Any] = []
        if state is not None:
            _in("state", state, where, args)
        if device is not None:
            where.append("device=?")
            args.append(device)
        rows = self.con.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY created_at, id", args
        ).fetchall()
        return [_job_from_row(r) for r in rows]

    def claim_next_job(self, device: str, shares: Callable[[str], bool] | None = None) -> JobInfo | None:
        """Atomically move the oldest queued job of `device` to running, if none runs there now, nor on a
        device that `shares` says shares hardware with it (a job on cuda:0,1 and one on cuda:1): checked in
        the claim's transaction, so two runners polling at once cannot both start one."""
        with self.transaction() as con:
            running = [r[0] for r in con.execute("SELECT device FROM jobs WHERE state='running'").fetchall()]
            if any(d == device or (shares is not None and shares(d)) for d in running):
                return None
            row = con.execute("SELECT id FROM jobs WHERE device=? AND state='queued' ORDER BY created_at, id LIMIT 1",
                              (device,)).fetchone()
            if row is None:
                return None
            now = time.time()
            con.execute("UPDATE jobs SET state='running', started_at=?, heartbeat_at=? WHERE id=?",
                        (now, now, row[0]))
        return self.job(row[0])

    def set_job_pid(self, job_id: str, pid: int) -> None:
        with self.transaction() as con:
            con.execute("UPDATE jobs SET pid=?, heartbeat_at=? WHERE id=?", (pid, time.time(), job_id))

    def beat_job(self, job_id: str) -> None:
        """Beat a running job's heartbeat (its worker is alive and runs Python)."""
        with self.transaction() as con:
            con.execute("UPDATE jobs SET heartbeat_at=? WHERE id=? AND state='running'", (time.time(), job_id))

    def update_job_progress(self, job_id: str, progress: dict[str, Any]) -> None:
        """Replace the job's progress (step, total, eta_s, phase, ...) and beat its heartbeat."""
        with self.transaction() as con:
            con.execute("UPDATE jobs SET progress=?, heartbeat_at=? WHERE id=?",
                        (json.dumps(progress), time.time(), job_id))

    def add_job_metrics(self, job_id: str, data: dict[str, Any], step: int | None = None) -> None:
        """Append one metrics record (a trainer log line: loss, reward margins, ...)."""
        with self.transaction() as con:
            (seq,) = con.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM job_metrics WHERE job_id=?",
                                 (job_id,)).fetchone()
            con.execute(columns.insert("job_metrics", columns.JOB_METRIC_ROW),
                        (job_id, seq, step, time.time(), json.dumps(data)))

    def job_metrics(self, job_id: str) -> list[dict[str, Any]]:
        """The job's metric records in order, each with `step` and `at` added."""
        return [
            {**json.loads(d), "step": step, "at": at}
            for step, at, d in self.con.execute(
                "SELECT step, at, data FROM job_metrics WHERE job_id=? ORDER BY seq", (job_id,))
        ]

    def finish_job(self, job_id: str, state: str, error: str | None = None, output_path: str | None = None,
                   expect: Sequence[str] = ("running",)) -> bool:
        """Move a job from one of `expect` to a final `state`; False when it was not in `expect`
        (e.g. already marked failed by a runner that found its process dead)."""
        if state not in ("succeeded", "failed", "cancelled"):
            raise StoreError(f"job state {state!r} is not final (succeeded, failed, cancelled)")
        marks = ",".join("?" * len(expect))
        with self.transaction() as con:
            cur = con.execute(
                f"UPDATE jobs SET state=?, finished_at=?, error=COALESCE(?, error), "
                f"output_path=COALESCE(?, output_path) WHERE id=? AND state IN ({marks})",
                (state, time.time(), error, output_path, job_id, *expect),
            )
            return cur.rowcount == 1

    def request_job_cancel(self, job_id: str) -> JobInfo:
        """Flag a job for cancellation; a queued job is cancelled at once, a running one by its runner."""
        with self.transaction() as con:
            con.execute("UPDATE jobs SET cancel_requested=1 WHERE id=?", (job_id,))
            con.execute("UPDATE jobs SET state='cancelled', finished_at=? WHERE id=? AND state='queued'",
                        (time.time(), job_id))
        return self.job(job_id)

    def save_model(self, record: ModelRecord) -> None:
        """Record a trained model folder's lineage, data ids and metrics as the folder's current
        model. The record of a model it replaces (another job's, saved to the same folder) is kept,
        marked replaced by this record's job; the same job saving again replaces its own record."""
        now = time.time()
        with self.transaction() as con:
            if record.job_id is not None:
                con.execute("DELETE FROM models WHERE path=? AND job_id=? AND replaced_at IS NULL",
                            (record.path, record.job_id))
            con.execute("UPDATE models SET replaced_at=?, replaced_by=? WHERE path=? AND replaced_at IS NULL",
                        (now, record.job_id, record.path))
            con.execute(
                "INSERT INTO models (path, name, kind, parent, job_id, data_ids, config, metrics, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (record.path, record.name, record.kind, record.parent, record.job_id, json.dumps(record.data_ids),
                 json.dumps(record.config), json.dumps(record.metrics), record.created_at or now),
            )

    def models(self, include_replaced: bool = False) -> list[ModelRecord]:
        """The models in their folders now, oldest first; with `include_replaced`, every job's
        record, those of models later replaced in their folder too (`replaced_at` set)."""
        where = "" if include_replaced else "WHERE replaced_at IS NULL"
        rows = self.con.execute(f"SELECT {_MODEL_COLUMNS} FROM models {where} ORDER BY created_at, id").fetchall()
        return [_model_from_row(r) for r in rows]

    def model_record(self, path: str) -> ModelRecord:
        """The record of the model now in folder `path`."""
        row = self.con.execute(f"SELECT {_MODEL_COLUMNS} FROM models WHERE path=? AND replaced_at IS NULL",
                               (path,)).fetchone()
        if row is None:
            raise StoreError(f"no model {path!r} in {self.path}")
        return _model_from_row(row)

    def record_job_decisions(self, job_id: str, item_kind: str, labels: dict[str, Any]) -> int:
        """Record the curation decisions a training job used: `labels` maps item id -> FinalLabel
        (engine.store.review). Recorded once per job; returns how many decision ids were stored."""
        rows = [(job_id, item_kind, item_id, did, final.label) for item_id, final in sorted(labels.items())
                for did in final.decision_ids]
        with self.transaction() as con:
            con.execute("DELETE FROM job_decisions WHERE job_id=? AND item_kind=?", (job_id, item_kind))
            con.executemany("INSERT INTO job_decisions (job_id, item_kind, item_id, decision_id, label) "
                            "VALUES (?,?,?,?,?)", rows)
        return len(rows)

    def job_decisions(self, job_id: str) -> list[tuple[str, str, str, str]]:
        """(item kind, item id, decision id, label) of the decisions a job trained on."""
        return [tuple(r) for r in self.con.execute(
            "SELECT item_kind, item_id, decision_id, label FROM job_decisions WHERE job_id=? "
            "ORDER BY item_kind, item_id, decision_id", (job_id,))]

    def save_evaluation(self, model: str, env: str, split: str, task_ids: Sequence[str], mode: str,
                        config: dict[str, Any], metrics: dict[str, Any], episodes: Sequence[dict[str, Any]],
                        job_id: str | None = None) -> str:
        eval_id = uuid.uuid4().hex[:10]
        with self.transaction() as con:
            con.execute(
                columns.insert("evaluations", columns.EVALUATION_ROW),
                (eval_id, model, env, split, json.dumps(list(task_ids)), mode, json.dumps(config),
                 json.dumps(metrics), json.dumps(list(episodes)), job_id, time.time()),
            )
        return eval_id

    def evaluations(self, model: str | None = None, with_episodes: bool = False) -> list[dict[str, Any]]:
        """Evaluations, oldest first (optionally of one model); per-episode rows on request."""
        cols = (*columns.EVALUATIONS, "episodes") if with_episodes else columns.EVALUATIONS
        where, args = ("WHERE model=?", (model,)) if model is not None else ("", ())
        out = []
        for row in self.con.execute(f"SELECT {select(cols)} FROM evaluations {where} ORDER BY created_at", args):
            r = named(cols, row)
            for k in ("task_ids", "config", "metrics", "episodes"):
                if k in r:
                    r[k] = json.loads(r[k])
            out.append(r)
        return out

    def node_token_counts(self, keys: Sequence[tuple[int | None, int]]) -> dict[tuple[int | None, int], int]:
        """{(tree id, node id): generated token count} for the given nodes (the DPO trainer checks
        that a stored log-prob covers exactly the tokens it will score)."""
        out: dict[tuple[int | None, int], int] = {}
        by_tree: dict[int, list[int]] = {}
        for tree_id, node_id in keys:
            if tree_id is not None:
                by_tree.setdefault(tree_id, []).append(node_id)
        for tree_id, nodes in by_tree.items():
            for chunk in range(0, len(nodes), 500):
                part = nodes[chunk : chunk + 500]
                rows = self.con.execute(
                    f"SELECT node_id, n_tokens FROM nodes WHERE tree_id=? AND node_id IN ({','.join('?' * len(part))})",
                    (tree_id, *part),
                )
                out.update({(tree_id, node_id): n for node_id, n in rows if n is not None})
        return out

    def save_iteration(self, loop_id: str, idx: int, method: str, data: dict[str, Any]) -> None:
        """One iteration of a training loop (its run, data counts, model, scores), replaced if present."""
        with self.transaction() as con:
            con.execute(columns.insert("iterations", columns.ITERATION_ROW, "INSERT OR REPLACE"),
                        (loop_id, idx, method, json.dumps(data), time.time()))

    def iterations(self, loop_id: str | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE loop_id=?", (loop_id,)) if loop_id is not None else ("", ())
        out = []
        for row in self.con.execute(f"SELECT {select(columns.ITERATIONS)} FROM iterations {where} "
                                    "ORDER BY created_at, idx", args):
            r = named(columns.ITERATIONS, row)
            out.append({"loop_id": r["loop_id"], "idx": r["idx"], "method": r["method"], **json.loads(r["data"]),
                        "created_at": r["created_at"]})
        return out
