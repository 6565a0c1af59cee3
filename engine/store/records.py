"""The store's records and errors: plain data, no SQL (shared by every backend)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class StoreError(RuntimeError):
    """The database cannot be used (not Orchard's, corrupt, too new, unknown run)."""


class DriverError(StoreError):
    """The database driver failed (locked past the busy timeout, disk I/O, a read-only file): raised
    by the store's connection in place of the driver's own error (engine/store/sqlite.py)."""


class MissingStoreError(StoreError):
    """No Orchard database there yet (a reader found nothing to read; a writer would create it)."""


@dataclass(frozen=True)
class RunInfo:
    id: str
    name: str
    env: str
    model: str
    config: dict[str, Any]
    task_ids: list[str]
    status: str
    created_at: float
    updated_at: float
    stats: dict[str, Any]
    trees: int = 0
    simulations: int = 0
    nodes: int = 0
    solved: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SaveReport:
    """What a save did: created, refreshed (updated), identical (unchanged), curated rows left
    as they were (kept), untouched leftovers deleted (pruned), curated leftovers kept (stale_curated);
    for pairs also those saved as one more source of another run's same pair (merged) and leftovers
    kept because other runs still make them (kept_for_other_runs)."""

    created: int = 0
    updated: int = 0
    unchanged: int = 0
    kept: int = 0
    pruned: int = 0
    stale_curated: int = 0
    merged: int = 0
    kept_for_other_runs: int = 0

    def __str__(self) -> str:
        return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.__dict__.items() if v) or "nothing changed"


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    at: float
    who: str
    action: str
    before: Any
    after: Any


JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
FINAL_JOB_STATES = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class JobInfo:
    """A training (or evaluation / iteration) job as stored. `progress`: step, total, eta_s, phase."""

    id: str
    kind: str
    name: str
    config: dict[str, Any]
    state: str
    device: str
    pid: int | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    progress: dict[str, Any]
    log_path: str | None
    output_path: str | None
    error: str | None
    cancel_requested: bool

    @property
    def final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ModelRecord:
    """A trained model folder: where it came from (parent model, job, data ids) and its metrics.
    One record per job; a folder's current record is the one with no `replaced_at`."""

    path: str
    name: str
    kind: str
    parent: str | None = None
    job_id: str | None = None
    data_ids: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: float | None = None
    replaced_at: float | None = None  # set when a later job saved another model into `path`
    replaced_by: str | None = None  # that job's id

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class LeaseError(StoreError):
    """A review saved without a live lease on its item (expired, or handed to someone else)."""


@dataclass(frozen=True)
class UserInfo:
    """A dashboard user (the password hash stays in the store)."""

    name: str
    role: str
    created_at: float


@dataclass(frozen=True)
class Decision:
    """One curator's review of an item, or a maintainer's settlement (`role`: review | settle)."""

    id: str
    item_kind: str
    item_id: str
    run_id: str | None
    who: str
    role: str
    label: str
    item_version: int
    at: float


@dataclass(frozen=True)
class FinalLabel:
    """An item's label under the final-label rule (label None: unsettled), with the decisions it rests on.
    `undecided`: nobody decided anything about it (pending, no review or settlement, even a stale
    one): the only unlabelled items `include_pending` may train on (engine/store/review.py)."""

    label: str | None
    decision_ids: tuple[str, ...]
    reason: str
    undecided: bool = False


@dataclass(frozen=True)
class TreeSummary:
    """One tree of a run in a few numbers (`RunsStore.tree_summaries`): what a run overview and a task
    picker show without reading any tree's nodes one by one."""

    tree_id: int
    task_id: str
    goal: str
    simulations: int
    solved: bool
    nodes: int
    successes: int  # success leaves
    max_depth: int
