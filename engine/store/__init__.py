"""Persistence: the one package that knows SQL (SQLite in WAL mode, or PostgreSQL through the
dialect shim in `postgres`), split by concern.

- records: the rows callers get back (RunInfo, JobInfo, ...) and the errors: plain data, no SQL;
- schema: the migrations and the check that a file is an Orchard database;
- connection: opening a file or a server (migrating it for writers) and transactions;
- postgres: the PostgreSQL connection (SQL spelled for it, errors as one line, reconnects);
- copy: `orchard db copy`, a whole store from one backend to the other;
- runs: runs, trees, nodes (observations deduplicated by content hash) and simulations;
- curation: preference pairs and samples, with curation through versioning (optimistic
  concurrency: a write names the version it read, a stale one is refused);
- training: jobs, models, evaluations and iteration-loop records (and the decisions a job used);
- users: dashboard users and login sessions;
- review: work shared out among curators (leases, reviews, settlements, the final-label rule).

`Store` combines the concerns into the one API every caller uses; SQL stays in the concern modules,
so another backend can stand behind the same API. Each finished simulation is committed in ONE
transaction, so a killed process loses at most the simulation in progress. A file that is not an
Orchard database is refused before anything is written to it.
"""

from __future__ import annotations

from engine.store.connection import Connection, data_version, default_db_path
from engine.store.curation import CURATION_STATUSES, CurationStore, EditError
from engine.store.records import (
    FINAL_JOB_STATES,
    JOB_STATES,
    Decision,
    DriverError,
    FinalLabel,
    HistoryEntry,
    JobInfo,
    LeaseError,
    MissingStoreError,
    ModelRecord,
    RunInfo,
    SaveReport,
    StoreError,
    TreeSummary,
    UserInfo,
)
from engine.store.review import LABEL_RULES, ReviewStore
from engine.store.runs import RunsStore
from engine.store.schema import APP_ID, MIGRATIONS, SCHEMA_VERSION
from engine.store.training import TrainingStore
from engine.store.users import UsersStore
from engine.store.versioning import ConflictError

__all__ = [
    "APP_ID", "CURATION_STATUSES", "FINAL_JOB_STATES", "JOB_STATES", "LABEL_RULES", "MIGRATIONS", "SCHEMA_VERSION",
    "ConflictError", "Connection", "Decision", "DriverError", "EditError", "FinalLabel", "HistoryEntry", "JobInfo",
    "LeaseError", "MissingStoreError", "ModelRecord", "RunInfo", "SaveReport", "Store", "StoreError",
    "TreeSummary", "UserInfo", "data_version",
    "default_db_path",
]


class Store(RunsStore, CurationStore, TrainingStore, UsersStore, ReviewStore):
    """A connection to one Orchard database. Not shared across threads; one writer process.

    `readonly=True` (the dashboard's reads) never writes, locks or migrates: it needs an existing
    database at the current schema version and reads beside a running search (WAL)."""
