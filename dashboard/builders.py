"""The Data pages build their own data: a pairs build (alpha, theta) on Preference pairs and a revisions
build (judge model, alpha_good, beta_gap, ...) on Trajectories, for the run chosen in the sidebar, and a
refinement build (model, including `offline`, count, personas, seed) on Refinement data, which needs no
run; each queued as a job (engine/datasets/builds.py) and followed live — the page reruns as the job's
units land, so the queue below fills while it runs.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import auth
from dashboard import forms as fm
from dashboard import jobs_panel as jp
from dashboard.store import JobInfo, RunInfo, Store
from dashboard.text import md

PAIR_HELP = {"alpha": "eq. 10 weight of the MCTS value Q~ against the critic's Q^ (default: the run's)",
             "theta": "minimum Q gap between chosen and rejected, strict",
             "trajectory_pairs": "success-vs-failure trajectory pairs per task at most",
             "min_visits": "compare a child only when this many simulations went through it (its Q~ a mean of "
                           "that many rollouts)"}
REVISION_HELP = {"alpha_good": "a good leaf has a final reward above this",
                 "beta_gap": "pair a bad leaf when the good one's reward is higher by more than this",
                 "max_per_task": "revision trajectories per task at most",
                 "noop_command": "the revision turn's command",
                 "judge_max_tokens": "tokens per judgement",
                 "seed": "judge request seeds"}


def _submit(db: str, form: str, kind: str, config: dict[str, Any], model: str | None) -> None:
    """Check the permission, then the model (at its field), then queue; a refusal is told under the form."""
    from engine.jobs.submit import submit_stage
    from engine.llm.registry import check_model

    if (refused := fm.refused(db)) is not None:  # before the model is probed (forms.refused)
        fm.set_errors(form, {})
        st.session_state[f"{form}_flash_error"] = f"Not queued: {refused}"
        return
    errors: dict[str, str] = {}
    if model is not None:
        try:
            check_model(model)
        except fm.submit_errors() as e:
            errors["model"] = fm.refusal(e)
    fm.set_errors(form, errors)
    if errors:
        return
    try:
        auth.require(db, "launch_jobs")  # a login (and a maintainer) where one is needed
        with Store(db) as store:
            job_id = submit_stage(store, kind, config)
        target = f" for run {md(config['run'])}" if config.get("run") else ""
        st.session_state[f"{form}_flash"] = f"Queued job {job_id}: {kind} build{target}."
    except fm.submit_errors() as e:
        st.session_state[f"{form}_flash_error"] = f"Not queued: {fm.refusal(e)}"


def _count(db: str, what: str, run_id: str) -> int:
    """The run's pairs, or its revision / good / recovery samples (open the form while there are none)."""
    with Store(db, readonly=True) as store:
        if what == "pairs":
            return store.pair_counts(run_id=run_id)["total"]
        return store.sample_counts(run_id=run_id, kind=["revision", "good", "recovery"])["total"]


def _poll(db: str) -> None:
    problem = jp.poll(db)
    if problem:
        st.error(problem)  # md()-escaped


def _outcome(form: str) -> None:
    if f"{form}_flash_error" in st.session_state:
        st.error(st.session_state.pop(f"{form}_flash_error"))  # md()-escaped when set
    if f"{form}_flash" in st.session_state:
        st.success(st.session_state.pop(f"{form}_flash"))


def pairs_builder(db: str, run: RunInfo | None) -> None:
    """The 'Build pairs' form for `run` and its newest pairs job, live."""
    from engine.datasets.pairs import PairsConfig

    form = "pb_build"
    _poll(db)
    empty = run is not None and _count(db, "pairs", run.id) == 0
    with st.expander("Build pairs for this run", expanded=bool(fm.form_errors(form)) or empty):
        if run is None:
            st.caption("Choose a run in the sidebar to build its pairs.")
        else:
            with st.form(form, border=False):
                st.markdown(f"Run **{md(run.name)}** · {md(run.id)}: step pairs, trajectory pairs and RFT rows "
                            "(docs/algorithms.md §3). Curation decisions on pairs that remain are kept.")
                values = fm.settings_inputs(PairsConfig, form, "pb_", columns=3,
                                            defaults={"alpha": float(run.config.get("alpha", 0.5))}, helps=PAIR_HELP)
                go = st.form_submit_button("Build pairs", type="primary")
            if go:
                errors = fm.check_settings(PairsConfig, values)
                fm.set_errors(form, errors)
                if not errors:
                    _submit(db, form, "pairs", {"run": run.id, **values}, None)
                st.rerun()
        _outcome(form)
    if run is not None and (job := jp.latest_job(db, ("pairs",), run.id)) is not None:
        jp.job_panel(db, job, "pb_job", extra=build_outcome, follow=True)


def build_outcome(job: JobInfo) -> None:
    """Under a finished revisions job: why it made no revision trajectory with a judged first error, with
    the counts (engine.datasets.revisions.why_little, recorded in the job's progress); under a pairs job,
    its counts, refused same-command pairs and merged duplicates among them."""
    counts, note = job.progress.get("counts"), job.progress.get("note")
    if job.state != "succeeded" or not isinstance(counts, dict):
        return
    if note:
        st.warning(md(note))  # quotes the judge's name
    st.caption(md(" · ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items())))


def revisions_builder(db: str, run: RunInfo | None, default_model: str = "tiny") -> None:
    """The 'Build revisions' form for `run` (judge model and RevisionConfig) and its newest job, live.
    The judge defaults to the model the run was searched with (its own judge in Agent-R), else
    `default_model`; choosing another run resets the field to that run's model."""
    from engine.datasets.revisions import RevisionConfig

    form = "rb_build"
    _poll(db)
    if run is not None and st.session_state.get("rb_model_run") != run.id:
        st.session_state.pop("rb_model", None)
        st.session_state["rb_model_run"] = run.id
    judge = run.model if run is not None and run.model else default_model
    empty = run is not None and _count(db, "samples", run.id) == 0
    with st.expander("Build revisions for this run", expanded=bool(fm.form_errors(form)) or empty):
        if run is None:
            st.caption("Choose a run in the sidebar to build its revision trajectories.")
        else:
            with st.form(form, border=False):
                st.markdown(f"Run **{md(run.name)}** · {md(run.id)}: first errors judged by a model, spliced "
                            "revision trajectories, good trajectories and recovery prefixes (docs/algorithms.md §4).")
                model = st.text_input("Judge model", value=judge, key="rb_model",
                                      help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH (default: the model "
                                           "this run was searched with)")
                fm.field_error(form, "model")
                values = fm.settings_inputs(RevisionConfig, form, "rb_", columns=3, helps=REVISION_HELP)
                go = st.form_submit_button("Build revisions", type="primary")
            if go:
                errors = fm.check_settings(RevisionConfig, values)
                fm.set_errors(form, errors)
                if not errors:
                    _submit(db, form, "revisions", {"run": run.id, "model": model.strip() or "tiny",
                                                   **fm.changed(RevisionConfig, values)}, model.strip() or "tiny")
                st.rerun()
        _outcome(form)
    if run is not None and (job := jp.latest_job(db, ("revisions",), run.id)) is not None:
        jp.job_panel(db, job, "rb_job", extra=build_outcome, follow=True)


REFINE_HELP = {"model": "offline (TextCraft's scripted synthesizer: no LLM, seconds on a CPU) | tiny | PATH | "
                        "hf:PATH | openai:URL#MODEL | vllm:PATH — a model must write JSON scripts and logs, "
                        "and its context must hold the prompts",
               "n": "personas sampled, one trajectory attempt each",
               "personas": "a JSONL file of {id, persona} on the server (empty: the shipped data/personas.jsonl)",
               "seed": "persona sampling and request seeds"}


def refine_builder(db: str, empty: bool) -> None:
    """The 'Build refinement data' form (model, count, personas file, seed) and its newest job, live.
    `empty`: no refinement sample yet (the form opens)."""
    from engine.datasets.refine_offline import OFFLINE_MODEL, is_offline

    form = "rfb_build"
    _poll(db)
    with st.expander("Build refinement data", expanded=bool(fm.form_errors(form)) or empty):
        with st.form(form, border=False):
            st.markdown("AgentRefine (docs/algorithms.md §5): persona → script → Dungeon Master / player log, "
                        "verified; the DM-flagged turns are masked. `offline` writes TextCraft scripts and "
                        "expert logs with injected, refused mistakes and their corrections (no language model).")
            cols = st.columns([3, 1, 3, 1])
            model = cols[0].text_input("Model", value=OFFLINE_MODEL, key="rfb_model", help=REFINE_HELP["model"])
            with cols[0]:
                fm.field_error(form, "model")
            n = cols[1].number_input("Count", min_value=1, max_value=10_000, value=8, step=1, key="rfb_n",
                                     help=REFINE_HELP["n"])
            personas = cols[2].text_input("Personas file", value="", key="rfb_personas",
                                          help=REFINE_HELP["personas"])
            seed = cols[3].number_input("Seed", min_value=0, value=0, step=1, key="rfb_seed", help=REFINE_HELP["seed"])
            go = st.form_submit_button("Build refinement data", type="primary")
        if go:
            spec = model.strip() or OFFLINE_MODEL
            config = {"model": spec, "n": int(n), "personas": personas.strip() or None, "seed": int(seed)}
            _submit(db, form, "refine", config, None if is_offline(spec) else spec)
            st.rerun()
        _outcome(form)
    if (job := jp.latest_job(db, ("refine",))) is not None:
        jp.job_panel(db, job, "rfb_job", follow=True)


def refine_builds(db: str) -> list[JobInfo]:
    """The refine jobs, newest first (the Refinement page's Builds table)."""
    with Store(db, readonly=True) as store:
        return [j for j in reversed(store.jobs()) if j.kind == "refine"]
