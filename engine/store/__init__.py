"""Persistence: the one package that knows SQL (SQLite in WAL mode), split by concern.

- records: the rows callers get back (RunInfo, JobInfo, ...) and the errors: plain data, no SQL;
- schema: the migrations and the check that a file is an Orchard database;
- connection: opening a file (migrating it for writers) and transactions;
- runs: runs, trees, nodes (observations deduplicated by content hash) and simulations;
- curation: preference pairs and samples, with curation through versioning (optimistic
  concurrency: a write names the version it read, a stale one is refused);
- training: jobs, models, evaluations and iteration-loop records.

`Store` combines the concerns into the one API every caller uses; SQL stays in the concern modules,
so another backend can stand behind the same API. Each finished simulation is committed in ONE
transaction, so a killed process loses at most the simulation in progress. A file that is not an
Orchard database is refused before anything is written to it.
"""

from __future__ import annotations

from engine.store.connection import Connection, default_db_path
from engine.store.curation import CURATION_STATUSES, CurationStore, EditError
from engine.store.records import (
    FINAL_JOB_STATES,
    JOB_STATES,
    HistoryEntry,
    JobInfo,
    ModelRecord,
    RunInfo,
    SaveReport,
    StoreError,
    TreeSkeleton,
)
from engine.store.runs import RunsStore
from engine.store.schema import APP_ID, MIGRATIONS, SCHEMA_VERSION
from engine.store.training import TrainingStore
from engine.store.versioning import ConflictError

__all__ = [
    "APP_ID", "CURATION_STATUSES", "FINAL_JOB_STATES", "JOB_STATES", "MIGRATIONS", "SCHEMA_VERSION", "ConflictError",
    "Connection", "EditError", "HistoryEntry", "JobInfo", "ModelRecord", "RunInfo", "SaveReport", "Store",
    "StoreError", "TreeSkeleton", "default_db_path",
]


class Store(RunsStore, CurationStore, TrainingStore):
    """A connection to one Orchard database. Not shared across threads; one writer process.

    `readonly=True` (the dashboard's reads) never writes, locks or migrates: it needs an existing
    database at the current schema version and reads beside a running search (WAL)."""
