"""One job on a page: state, units done / total with ETA, failure reason, log tail and a Cancel button,
refreshed every LIVE_EVERY_S seconds while the job is live (an st.fragment), and the whole page rerun
once when it ends — so everything else the page shows (tables, counts, pickers) is read again from
the store and agrees with the panel.

Every page that launches jobs (Runs, Preference pairs, Trajectories, Training, Evaluation) uses it.
Job names, phases, errors and logs may quote a model or a server: errors and logs go to st.code,
short pieces inside Markdown through `md()`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import streamlit as st

from dashboard import auth
from dashboard.store import JobInfo, Store, StoreError
from dashboard.text import md
from engine.jobs.runner import JobRunner
from engine.progress import progress_line

LIVE_EVERY_S = 2.0
LOG_TAIL_LINES = 40


def poll(db: str) -> str | None:
    """Start queued jobs whose device is free and mark dead ones failed (the dashboard is one of the
    queue's pollers, see engine.jobs.runner); returns a message when the queue could not be updated."""
    try:
        with Store(db) as store:
            JobRunner(store).poll()
    except (StoreError, OSError) as e:
        return f"Could not update the job queue: {md(e)}"
    return None


def log_tail(db: str, log_path: str | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a job's log ('' when it has none yet); undecodable bytes replaced. A stored
    path outside the database's job-log folder is not read (engine.paths.job_log): one line says so."""
    from engine.paths import job_log, jobs_dir

    if not log_path:
        return ""
    path = job_log(db, log_path)
    if path is None:
        return f"(not shown: the stored log path {log_path} is outside the job-log folder {jobs_dir(db)})"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return ""


def latest_job(db: str, kinds: Sequence[str], run_id: str | None = None) -> JobInfo | None:
    """The newest job of `kinds` (for `run_id`: one whose config names that run, or whose output is it)."""
    with Store(db, readonly=True) as store:
        jobs = store.jobs()
    for job in reversed(jobs):
        if job.kind not in kinds:
            continue
        if run_id is None or run_id in (job.config.get("run"), job.config.get("resume"), job.output_path,
                                        job.progress.get("run_id")):
            return job
    return None


def cancel(db: str, job_id: str) -> str:
    if auth.acting_as(db, "launch_jobs") is None:
        return md(st.session_state.pop(auth.NOTICE, "Not cancelled."))
    try:
        with Store(db) as store:
            job = JobRunner(store).cancel(job_id, grace_s=15.0)
    except (StoreError, OSError) as e:
        return f"Could not cancel job {job_id}: {md(e)}"
    return f"Job {job_id} is {job.state}."


def _cancel(db: str, job_id: str, key: str) -> None:
    st.session_state[f"{key}_flash"] = cancel(db, job_id)


def progress_text(job: JobInfo) -> str:
    """'phase step/total, ETA N s' or, from a stage inside a loop, 'iteration 2 · search: 57/128
    simulations, ETA N s' (engine.progress.progress_line; Markdown-safe)."""
    p = dict(job.progress)
    p["phase"] = p.get("phase") or ("waiting in the queue" if job.state == "queued" else "")
    return md(progress_line(p, live=not job.final) or job.state)


def show_job(db: str, job_id: str, key: str, extra: Callable[[JobInfo], None] | None = None,
             follow: bool = False) -> None:
    """The panel's body (see the module docstring); `extra(job)` draws page-specific figures below.
    `follow`: rerun the whole page whenever the job has done another unit (a data page's queue
    fills as the rows land)."""
    with Store(db, readonly=True) as store:
        job = store.job(job_id)
    if job.state == "queued" and poll(db) is None:
        # A job queued just as the previous one of its device was finishing can miss that worker's
        # last poll; the live panel is a poller too, so a queued job never waits for a page reload.
        with Store(db, readonly=True) as store:
            job = store.job(job_id)
    live_key, step_key = f"{key}_live", f"{key}_step"
    if job.final and st.session_state.get(live_key) == job_id:
        del st.session_state[live_key]
        st.rerun(scope="app")  # it just ended: the whole page reads the store again
    seen = (job_id, job.progress.get("step"))
    if follow and not job.final and st.session_state.get(step_key) not in (None, seen):
        st.session_state[step_key] = seen
        st.rerun(scope="app")
    st.session_state[step_key] = seen
    p = job.progress
    st.markdown(f"Job **{md(job.name)}** · {md(job.kind)} on {md(job.device)} · state **{md(job.state)}**")
    step, total = p.get("step") or 0, p.get("total") or 0
    st.progress(min(1.0, step / total) if total else (1.0 if job.state == "succeeded" else 0.0),
                text=progress_text(job))
    if job.error:  # may quote a remote server: shown as text
        (st.warning if job.state == "cancelled" else st.error)(f"Job {md(job.state)}:")
        st.code(job.error, language=None, wrap_lines=True)
    if job.output_path:
        st.caption("Output:")
        st.code(job.output_path, language=None)
    if extra is not None:
        extra(job)
    with st.expander(f"Log (last {LOG_TAIL_LINES} lines)", expanded=job.state == "failed"):
        st.code(log_tail(db, job.log_path) or "(empty)", language=None)
    if not job.final:
        st.button("Cancel job", key=f"{key}_cancel_{job_id}", on_click=_cancel, args=(db, job_id, key),
                  disabled=not auth.may("launch_jobs"))
    flash = st.session_state.pop(f"{key}_flash", None)
    if flash:
        st.info(flash)  # built from fixed words, ids and states, or md()-escaped text


def job_panel(db: str, job: JobInfo, key: str, extra: Callable[[JobInfo], None] | None = None,
              follow: bool = False) -> None:
    """Show `job`, live while it runs (see the module docstring and `show_job`)."""
    live_key = f"{key}_live"
    if job.final:
        st.session_state.pop(live_key, None)
    else:
        st.session_state[live_key] = job.id
    st.fragment(run_every=None if job.final else LIVE_EVERY_S)(show_job)(db, job.id, key, extra, follow)
