"""Where each run stands in Algorithm 1 (docs/algorithms.md §3): searched -> data (pairs, revisions)
-> trained -> evaluated, read from the store, for the Runs page and the Evaluation page's Loop view.

WHY derived, not recorded: every stage already leaves its mark in the store (a run's status, its
pairs and samples, the jobs that trained on it, the models they made, the evaluations of those
models, the loop iterations), whether it ran from the CLI, a job or `orchard iterate`; reading the
marks keeps one source of truth. A training job with no runs named trained on every run there was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from dashboard import data
from engine.store import Store

TRAIN_KINDS = ("dpo", "sft", "rft")


@dataclass
class RunStages:
    run_id: str
    searched: str  # the run's status: running | interrupted | finished
    pairs: int = 0
    revisions: int = 0
    models: list[str] = field(default_factory=list)  # trained on this run
    evaluations: int = 0  # of those models

    def row(self) -> dict[str, Any]:
        return {"searched": self.searched, "pairs": self.pairs, "revisions": self.revisions,
                "trained": len(self.models), "evaluated": self.evaluations}


@st.cache_data(show_spinner=False, max_entries=8)
def run_stages(path: str, version: data.Version) -> dict[str, RunStages]:
    """Every run's stages (`version` is only the cache key)."""
    with Store(path, readonly=True) as store:
        runs = store.runs()
        out = {r.id: RunStages(r.id, r.status) for r in runs}
        for run_id, stages in out.items():
            stages.pairs = store.pair_counts(run_id=run_id)["total"]
            stages.revisions = store.sample_counts(run_id=run_id, kind=["revision", "good", "recovery"])["total"]
        created = {r.id: r.created_at for r in runs}
        for job in store.jobs(state="succeeded"):
            if job.kind not in TRAIN_KINDS or not job.output_path:
                continue
            named = job.config.get("runs") or [r for r, t in created.items() if t <= job.created_at]
            for key in named:
                found = key if key in out else _find(store, key)
                if found in out:
                    out[found].models.append(job.output_path)
        for it in store.iterations():
            if it.get("run_id") in out and it.get("train"):
                out[it["run_id"]].models.append(str(it.get("model")))
        evaluated: dict[str, int] = {}
        for e in store.evaluations():
            evaluated[e["model"]] = evaluated.get(e["model"], 0) + 1
        for stages in out.values():
            stages.evaluations = sum(evaluated.get(m, 0) for m in set(stages.models))
    return out


def _find(store: Store, key: str) -> str | None:
    from engine.store import StoreError

    try:
        return store.find_run(key)
    except StoreError:
        return None


def newest_model(path: str) -> str:
    """The model the next iteration starts from: the newest trained one, else `tiny`."""
    with Store(path, readonly=True) as store:
        models = store.models()
    return models[-1].path if models else "tiny"
