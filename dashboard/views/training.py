"""Training: pick data and a preset, launch a job with one click, watch it live, cancel it; past jobs
and the models they produced.

Why it is safe to launch from here: a job runs in its own process (engine.jobs.runner), its state
lives in the store, and the page only reads it back. Closing or restarting the dashboard loses
nothing; a crashed job is marked failed by the next poll (this page polls on every run). The
presets and their settings are the engine's (engine.train.presets), so a job launched here is the
one `orchard train ...` would run. Log lines and job errors (which can quote a remote server) are
shown with `st.code`, names inside Markdown elements through `dashboard.text.md` (text, never markup).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import auth, data, figures
from dashboard import jobs_panel as jp
from dashboard.store import JobInfo, ModelRecord, Store, StoreError
from dashboard.text import md
from engine.config import ConfigError
from engine.jobs.runner import JobRunner, job_summary
from engine.train.presets import (
    DATA_CHOICES,
    MIN_ROWS,
    PRESETS,
    TrainPlan,
    device_of,
    job_config,
    train_plan,
)

ERROR = "tr_error"
FLASH = "tr_flash"
JOB = "job"  # query parameter: the job on screen

path = data.db_path()
db = str(path)
state = st.session_state
qp = st.query_params

st.title("Training")


def _poll() -> None:
    """Start queued jobs whose device is free and mark dead ones failed (see dashboard.jobs_panel)."""
    problem = jp.poll(db)
    if problem:
        state[ERROR] = problem


def _launch(data_key: str, preset: str, model: str, runs: list[str], include_pending: bool,
            output: str = "") -> None:
    state.pop(ERROR, None)
    if auth.acting_as(db, "launch_jobs") is None:
        state[ERROR] = md(state.pop(auth.NOTICE, "Not launched."))
        return
    try:
        kind, config = job_config(data_key, preset, model, runs, include_pending, output=output.strip() or None)
        with Store(db) as store:
            if train_plan(store, kind, config).items == 0:
                statuses = "approved, edited" + (" or undecided pending" if include_pending else "")
                state[ERROR] = (f"Nothing to train on: no {statuses} rows for "
                                f"“{DATA_CHOICES[data_key].label}” in {'the chosen runs' if runs else 'any run'}. "
                                "Curate some on the Data pages, or include pending rows.")
                return
            job = JobRunner(store).submit(kind, config, device=device_of(config),
                                          name=f"{kind}-{preset}")
    except (ConfigError, StoreError, OSError) as e:
        state[ERROR] = f"The job was not launched: {md(e)}"
        return
    state[FLASH] = f"Launched job {job.id} ({job.kind}, {job.state} on {job.device})."
    qp[JOB] = job.id


def _plan(data_key: str, preset: str, model: str, runs: list[str],
          include_pending: bool) -> tuple[TrainPlan | None, str]:
    """The launch's plan (rows, epochs, steps) on the data now, or why there is none."""
    try:
        kind, config = job_config(data_key, preset, model, runs, include_pending)
        with Store(db, readonly=True) as store:
            return train_plan(store, kind, config), ""
    except (ConfigError, StoreError, OSError) as e:
        return None, f"No plan: {e}"


def read_jobs() -> tuple[list[JobInfo], list[ModelRecord]]:
    """Jobs and every job's model record (those replaced in their folder by a later job too)."""
    with Store(db, readonly=True) as store:
        return store.jobs(), store.models(include_replaced=True)


# --- launch ----------------------------------------------------------------------------------------------

_poll()
jobs, models = read_jobs()
runs = list(reversed(data.list_runs(db, data.db_version(path))))

st.subheader("Launch a training job")
left, right = st.columns(2)
data_key = left.selectbox("Data", list(DATA_CHOICES), format_func=lambda k: DATA_CHOICES[k].label,
                          key="tr_data", help="\n\n".join(f"**{c.label}**: {c.help}" for c in DATA_CHOICES.values()))
preset = right.selectbox("Preset", list(PRESETS), format_func=lambda k: PRESETS[k].label, key="tr_preset",
                         help="\n\n".join(f"**{p.label}**: {p.help}" for p in PRESETS.values()))
model_choices = ["tiny"] + [m.path for m in reversed(models) if m.replaced_at is None]
model = left.selectbox("Start from model", model_choices, key="tr_model",
                       format_func=lambda p: "tiny (the embedded default)" if p == "tiny" else
                       f"{Path(p).name} ({p})")
run_ids = right.multiselect("Runs (none: all runs)", [r.id for r in runs], key="tr_runs",
                            format_func=lambda i: next(f"{r.name} · {i}" for r in runs if r.id == i))
include_pending = st.checkbox("Include pending (uncurated) rows", key="tr_pending",
                              help="By default only approved and edited rows are trained on. This adds rows "
                                   "nobody has reviewed; rows whose reviewers disagree stay out until settled.")
output = st.text_input("Output folder (empty: a new folder named after the job)", key="tr_out",
                       help="A new or empty folder, or an earlier model's folder (its model is replaced; "
                            "its record is kept). A folder holding other files is refused.")
cannot = auth.why_not("launch_jobs")
# The plan checks the model folder: only for a user who may launch (no file probe before the permission check).
plan, why = _plan(data_key, preset, model, run_ids, include_pending) if cannot is None else (None, "")
confirmed = True
if plan is not None:
    noun = "pairs" if DATA_CHOICES[data_key].kind == "dpo" else "samples"
    st.caption(f"Would train on {plan.items} {noun} → {plan.rows} rows × {plan.epochs:g} epochs "
               f"(batch {plan.batch}) → {plan.steps} optimizer steps.")
    if plan.too_small and plan.rows > 0:
        st.warning(f"Only {plan.rows} rows (fewer than {MIN_ROWS}): a step on so little data barely moves a model "
                   "and can make it worse. Curate more rows, or confirm below.")
        confirmed = st.checkbox(f"Train on {plan.rows} rows anyway", key="tr_small_ok")
elif why:
    st.caption(md(why))
if cannot:
    st.caption(md(cannot))
submitted = st.button("Launch", type="primary", key="tr_launch", disabled=cannot is not None or not confirmed)
if submitted:
    _launch(data_key, preset, model, run_ids, include_pending, output)
    jobs, models = read_jobs()

if ERROR in state:
    st.error(state.pop(ERROR))  # Markdown: what it quotes went through md() when it was set
if FLASH in state:
    st.success(state.pop(FLASH))  # built from fixed words, ids and states only

# --- jobs ------------------------------------------------------------------------------------------------

st.subheader("Jobs")
if not jobs:
    st.info("No jobs yet: launch one above, or with `orchard train dpo|sft|rft`.")
    st.stop()

by_id = {j.id: j for j in jobs}
ids = [j.id for j in reversed(jobs)]  # newest first
wanted = qp.get(JOB)
current = wanted if wanted in by_id else ids[0]
chosen = st.selectbox("Job", ids, index=ids.index(current), key=f"tr_job_{current}",
                      format_func=lambda i: f"{by_id[i].name} · {i} · {by_id[i].kind}")
if chosen != current:
    qp[JOB] = chosen
    st.rerun()
qp[JOB] = chosen



def jobs_table() -> None:
    """Every job as the store has it now (a fragment: refreshed with the live panel while jobs run)."""
    fresh, _ = read_jobs()
    st.dataframe(pd.DataFrame([{
        "id": j.id, "name": j.name, "kind": j.kind, "state": j.state, "device": j.device,
        "step": j.progress.get("step"), "total": j.progress.get("total"),
        "created": pd.Timestamp(j.created_at, unit="s").floor("s"), "output": j.output_path or "",
        "error": j.error or "",
    } for j in reversed(fresh)]), hide_index=True, key="tr_jobs_table")


# The picker's labels never carry a job's state: Streamlit's frontend keeps showing the label an option had
# when the selectbox was first drawn (streamlit/streamlit#13788), so a state in it would go stale.
st.fragment(run_every=jp.LIVE_EVERY_S if any(not j.final for j in jobs) else None)(data.store_errors_shown(jobs_table))()


def last_values(metrics: list[dict], keys: tuple[str, ...]) -> dict[str, float]:
    """Each key's latest value in the metric stream. Not simply the last record's: a trainer ends with
    a summary record (train_runtime, train_loss, ...) that has none of the per-step keys."""
    out: dict[str, float] = {}
    for record in reversed(metrics):
        for key in keys:
            if key not in out and isinstance(record.get(key), int | float):
                out[key] = record[key]
        if len(out) == len(keys):
            break
    return out


TILES = (("loss", "loss"), ("rewards/margins", "reward margin"), ("rewards/accuracies", "reward accuracy"))


def curves(job: JobInfo) -> None:
    """Below the job's progress: the latest value of each training metric, and the curves they come from
    (one read of the metric stream for both, so the tiles and the curves always agree)."""
    with Store(db, readonly=True) as store:
        metrics = store.job_metrics(job.id)
    if not metrics and job.kind not in ("dpo", "sft", "rft"):
        return  # a search, data build or evaluation job: no training curves
    last = last_values(metrics, tuple(k for k, _ in TILES))
    for col, (key, label) in zip(st.columns(len(TILES)), TILES, strict=True):
        col.metric(label, f"{last[key]:.4g}" if key in last else "—")
    fig = figures.metric_curves(metrics)
    if fig is not None:
        st.plotly_chart(fig, key=f"tr_curves_{job.id}", config={"displayModeBar": False})


jp.job_panel(db, by_id[chosen], "tr", extra=curves)

# --- models ----------------------------------------------------------------------------------------------

st.subheader("Models")
if models:
    st.dataframe(pd.DataFrame([{
        "name": m.name, "kind": m.kind, "path": m.path, "parent": m.parent or "", "job": m.job_id or "",
        "rows": len(m.data_ids), "train loss": m.metrics.get("train_loss"), "steps": m.metrics.get("steps"),
        "created": pd.Timestamp(m.created_at, unit="s").floor("s") if m.created_at else None,
        "replaced by job": m.replaced_by or ("(no job)" if m.replaced_at else ""),
    } for m in reversed(models)]), hide_index=True, key="tr_models_table")
else:
    st.caption("No trained models yet.")
with st.expander("All jobs as `orchard jobs` prints them"):
    st.code("\n".join(job_summary(j) for j in jobs), language=None)
