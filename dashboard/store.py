"""The dashboard's one door to the engine's store (engine/store): the `Store` the pages open, the rows it
hands back, the errors it raises and the helpers that show a database location.

WHY one module: the dashboard depends on the store through this list only, so what it uses of the
store's API is read in one place, and a change to that API touches this module (and the pages that use
the changed names), not an import line in every page (tests/test_architecture.py keeps it so).

How the pages open it: `Store(db, readonly=True)` for an uncached read (it never writes, locks or
migrates, and refuses a missing database with MissingStoreError); `Store(db)` for a write (a person's
curation, a submitted job, a login session); the cached reads, keyed by the database version, are
dashboard/data.py's.
"""

from __future__ import annotations

from engine.store import (
    CURATION_STATUSES,
    ConflictError,
    DriverError,
    EditError,
    HistoryEntry,
    JobInfo,
    LeaseError,
    MissingStoreError,
    ModelRecord,
    RunInfo,
    Store,
    StoreError,
    TreeSummary,
    data_version,
)
from engine.store.credentials import redact, scrub

__all__ = [
    "CURATION_STATUSES", "ConflictError", "DriverError", "EditError", "HistoryEntry", "JobInfo", "LeaseError",
    "MissingStoreError", "ModelRecord", "RunInfo", "Store", "StoreError", "TreeSummary", "data_version", "redact",
    "scrub",
]
