"""Where each run stands in Algorithm 1 (docs/algorithms.md §3): searched -> data (pairs, revisions)
-> trained -> evaluated, read from the store, for the Runs page and the Evaluation page's Loop view;
and, for the Loop view, what an iteration's promotion gate decided (`gate_cell`) and where a running
loop job stands (`LiveStage`, from the job's progress: engine.progress.Within).

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
from dashboard.store import JobInfo, Store, StoreError
from engine.progress import progress_line

TRAIN_KINDS = ("dpo", "sft", "rft")
LOOP_STAGES = ("search", "data", "train", "gate", "evaluate")  # an iteration's stages, in the order it runs them


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


def human_counts(store: Store, run_ids: list[str]) -> dict[str, int]:
    """The human-authored nodes (added from the Tree explorer or `orchard tree add-action`) of each
    run's trees, by run id: the Loop view's "human nodes" per iteration (its search run, `run_id`)."""
    return {run_id: store.human_node_count(run_id) for run_id in dict.fromkeys(run_ids)}


def _find(store: Store, key: str) -> str | None:
    try:
        return store.find_run(key)
    except StoreError:
        return None


def newest_model(path: str) -> str:
    """The model the next iteration starts from: the newest trained one, else `tiny`."""
    with Store(path, readonly=True) as store:
        models = store.models()
    return models[-1].path if models else "tiny"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def gate_cell(record: dict[str, Any]) -> str:
    """What the iteration's promotion gate decided (engine.train.gate): its candidate promoted to the
    next policy or the current one kept, with the gate's scores; "—" where nothing was trained."""
    gate = record.get("gate")
    if not isinstance(gate, dict) or not isinstance(gate.get("promoted"), bool):
        return "— (nothing trained)" if record.get("skipped") else "—"
    verdict = "✓ promoted" if gate["promoted"] else "✗ kept the current policy"
    cand, cur, tasks = _num(gate.get("candidate")), _num(gate.get("current")), _num(gate.get("tasks"))
    diff: dict[str, Any] = found if isinstance(found := gate.get("diff"), dict) else {}
    low, mean, high = (_num(diff.get(k)) for k in ("low", "mean", "high"))
    if cand is None or cur is None or tasks is None:
        return f"{verdict} (no gate)" if gate["promoted"] else verdict
    where = f"{int(tasks)} {gate['split']} tasks" if isinstance(gate.get("split"), str) and gate["split"] else (
        f"{int(tasks)} gate tasks")
    paired = f", paired {mean:+.3f} [{low:+.3f}, {high:+.3f}]" if None not in (low, mean, high) else ""
    return f"{verdict}: {cand:.3f} vs {cur:.3f} on {where}{paired}"


@dataclass
class LiveStage:
    """Where a queued or running iterate job stands: its loop, the iteration and stage under way (0:
    the base's evaluation; None before the first stage reports) and that stage's own progress."""

    job: JobInfo
    loop_id: str
    iteration: int | None
    stage: str | None

    @classmethod
    def of(cls, job: JobInfo | None) -> LiveStage | None:
        """The live stage of `job` (the newest iterate job), None when it has ended or names no loop."""
        if job is None or job.final:
            return None
        p = job.progress
        cfg: dict[str, Any] = found if isinstance(found := job.config.get("iterate"), dict) else {}
        loop_id = p.get("loop_id") or cfg.get("name")
        if not isinstance(loop_id, str) or not loop_id:
            return None
        iteration = p.get("iteration") if isinstance(p.get("iteration"), int) else None
        stage = p.get("stage") if p.get("stage") in (*LOOP_STAGES, "done") else None
        return cls(job, loop_id, iteration, stage)

    @property
    def method(self) -> str:
        cfg = self.job.config.get("iterate")
        return str(cfg.get("method", "")) if isinstance(cfg, dict) else ""

    def headline(self) -> str:
        """'iteration 2 of 3 · search: 57/128 simulations, ETA 30 s' (plain text)."""
        p = dict(self.job.progress)
        last = p.get("last_iteration")
        if self.iteration and isinstance(last, int) and isinstance(p.get("phase"), str):
            p["phase"] = p["phase"].replace(f"iteration {self.iteration}", f"iteration {self.iteration} of {last}", 1)
        if self.job.state == "queued":
            return "waiting in the queue"
        return progress_line(p) or "starting"

    def cell(self) -> str:
        """The running stage's cell: its own units ('▶ 57/128 simulations · 3 solved'), the part of it
        under way where it has several (the gate's two policies, exit-mcts's greedy pass then play)."""
        p = self.job.progress
        phase = str(p.get("phase") or "")
        part = phase.split(" · ", 1)[1] if " · " in phase else ""
        counts = progress_line({**p, "phase": ""})
        extra = [f"{p[k]} {k}" for k in ("solved", "rows") if isinstance(p.get(k), int) and self.stage != "train"]
        words = " · ".join([w for w in (part if part != self.stage else "", counts or "starting") if w] + extra)
        return f"▶ {words}"

    def row_cells(self) -> dict[str, str]:
        """The running iteration's stage columns: done ✓, under way ▶ with its progress, to come …."""
        if self.stage not in LOOP_STAGES:
            return {}
        at = LOOP_STAGES.index(self.stage)
        return {name: "✓" if k < at else self.cell() if k == at else "…" for k, name in enumerate(LOOP_STAGES)}
