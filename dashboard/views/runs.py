"""Runs: every search run with its key settings and where it stands in the loop (searched / pairs /
revisions / trained / evaluated), links to the pages that show each stage; a "New search" form and
"Resume" for an interrupted run, both queued as search jobs (engine/search/stage.py) and followed live;
a new search and a resume can run on Ray (the job config `orchard search --ray ADDRESS` runs; a
HOST:PORT nothing answers is told at its field).

Why the form checks each field itself: a bad env, task range, model or setting is told at its field
and nothing is queued or written; the job's own checks (the same ones, in engine.search.stage) run again
on submission. The settings are read from SearchConfig's fields, so a new setting appears here
with its default and its help without touching this page.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import auth, data, loop
from dashboard import forms as fm
from dashboard import jobs_panel as jp
from dashboard.store import Store
from dashboard.text import md, short_path
from engine.config import SearchConfig
from engine.envs.registry import known_envs
from engine.llm.base import GeneratorError
from engine.llm.registry import parse_model_spec
from engine.search.stage import DEFAULT_TASKS

TREE_PAGE = "views/tree_explorer.py"
FORM = "rs_new"
STAGE_PAGES = (("views/tree_explorer.py", "Tree explorer", ":material/account_tree:"),
               ("views/pairs.py", "Preference pairs", ":material/compare_arrows:"),
               ("views/trajectories.py", "Trajectories", ":material/alt_route:"),
               ("views/training.py", "Training", ":material/model_training:"),
               ("views/evaluation.py", "Evaluation", ":material/leaderboard:"))


def ray_inputs(form: str, prefix: str) -> tuple[bool, str]:
    """The "Run on Ray" box and its address, with the address's message from `form`'s last submission
    (drawn where called; the New search and Resume forms both use it)."""
    on_ray = st.checkbox("Run on Ray", key=f"{prefix}ray",
                         help="Grow the trees on Ray workers, as `orchard search --ray ADDRESS` does; this "
                              "job commits every simulation. Needs orchard[ray].")
    address = st.text_input("Ray address", key=f"{prefix}ray_address", placeholder="(empty: start a local Ray)",
                            help="HOST:PORT of the cluster's head, auto (the cluster this machine has "
                                 "joined), or empty to start a local Ray. Used with Run on Ray.")
    fm.field_error(form, "ray")
    return on_ray, address


def shards_input(form: str, prefix: str) -> int:
    """Worker processes that grow the trees (`orchard search --shards N`); 0: the automatic count."""
    n = st.number_input("Worker processes (shards)", min_value=0, max_value=1024, value=0, step=1,
                        key=f"{prefix}shards",
                        help="Grow the trees in N worker processes feeding this job, the one store writer "
                             "(with Run on Ray: N Ray tasks). 0: automatic, min(cores, requests in flight / "
                             "256) for an openai: model, else 1.")
    fm.field_error(form, "shards")
    return int(n)


def check_ray_inputs(problems: dict[str, str], config: dict[str, Any], on_ray: bool, address: str) -> None:
    """With Run on Ray: the address into `config["ray"]` (the job config `orchard search --ray` runs),
    and at the "ray" field what is wrong: its form, Ray not installed, a HOST:PORT nothing answers
    (probed for a few seconds: a job would otherwise wait over a minute in `ray.init` to fail)."""
    if not on_ray:
        return
    from engine.search.ray_search import probe_address
    from engine.search.stage import check_ray

    config["ray"] = address.strip()
    try:
        check_ray(config["ray"])
        probe_address(config["ray"])
    except fm.submit_errors() as e:
        problems["ray"] = fm.refusal(e)


def on_ray_words(config: dict[str, Any]) -> str:
    """" on Ray (ADDRESS)" for a job config on Ray, else "" (Markdown-safe)."""
    return "" if config.get("ray") is None else f" on Ray ({md(config['ray'] or 'local')})"


st.title("Runs")

path = data.db_path()
db = str(path)
state = st.session_state
problem = jp.poll(db) if data.has_data(path) else None
if problem:
    st.error(problem)
runs = list(reversed(data.list_runs(db, data.db_version(path)))) if data.has_data(path) else []
stages = loop.run_stages(db, data.db_version(path)) if runs else {}

rows = []
for r in runs:
    cfg = r.config
    rows.append({
        "id": r.id,
        "name": r.name,
        "env": r.env,
        "model": short_path(r.model),
        "status": r.status,
        **{k: v for k, v in stages[r.id].row().items() if k != "searched"},
        "trees": r.trees,
        "solved": r.solved,
        "success rate": r.solved / r.trees if r.trees else None,
        "simulations": r.simulations,
        "nodes": r.nodes,
        "created": pd.Timestamp(r.created_at, unit="s").floor("s"),
        "k": cfg.get("k"),
        "sims/task": cfg.get("simulations"),
        "depth": cfg.get("depth_limit"),
        "alpha": cfg.get("alpha"),
        "model (full)": r.model,
    })
table = pd.DataFrame(rows)
KEY_COLUMNS = ["name", "status", "solved", "trees", "success rate", "model"]  # first, always in view

if runs:
    st.caption("Select a row to open the run in the Tree explorer.")
    event = st.dataframe(
        table,
        hide_index=True,
        key="runs_table",
        on_select="rerun",
        selection_mode="single-row",
        column_order=[*KEY_COLUMNS, *(c for c in table.columns if c not in KEY_COLUMNS)],
        column_config={
            "name": st.column_config.TextColumn("name", pinned=True),
            "model": st.column_config.TextColumn("model", width="medium",
                                                 help="the search's model, shortened to its end; in full in "
                                                      "'model (full)', the last column"),
            "status": st.column_config.TextColumn("status", help="searched: running, interrupted or finished"),
            "pairs": st.column_config.NumberColumn("pairs", help="preference pairs built from the run"),
            "revisions": st.column_config.NumberColumn("revisions", help="revision, good and recovery samples"),
            "trained": st.column_config.NumberColumn("trained", help="models trained on the run's data"),
            "evaluated": st.column_config.NumberColumn("evaluated", help="evaluations of those models"),
            "success rate": st.column_config.ProgressColumn(
                "success rate", help="solved / trees", min_value=0.0, max_value=1.0, format="percent"
            ),
            "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm:ss"),
            "sims/task": st.column_config.NumberColumn("sims/task", help="MCTS simulations per task (T)"),
            "depth": st.column_config.NumberColumn("depth", help="depth limit D"),
            "k": st.column_config.NumberColumn("k", help="candidates sampled per expansion (K)"),
            "alpha": st.column_config.NumberColumn("alpha", help="eq. 10 weight of Q~ against Q^"),
        },
    )
    if event.selection.rows:
        st.switch_page(TREE_PAGE, query_params={"run": table.iloc[event.selection.rows[0]]["id"]})

    # The same choice without the table (keyboard users, and scripted tests).
    by_id = {r.id: r for r in runs}
    left, right = st.columns([3, 1], vertical_alignment="bottom")
    chosen = left.selectbox(
        "Run", list(by_id), format_func=lambda i: f"{by_id[i].name} · {i} · {by_id[i].env}", key="runs_pick"
    )
    if right.button("Open in Tree explorer", key="runs_open", type="primary", disabled=chosen is None):
        st.switch_page(TREE_PAGE, query_params={"run": chosen})
    run, run_stage = by_id[chosen], stages[chosen]
    marks = {"searched": run.status, "pairs": f"{run_stage.pairs} pairs", "revisions": f"{run_stage.revisions} rows",
             "trained": f"{len(run_stage.models)} models", "evaluated": f"{run_stage.evaluations} evaluations"}
    st.markdown(" → ".join(f"**{name}** {md(value)}" for name, value in marks.items()))
    for col, (page, label, icon) in zip(st.columns(len(STAGE_PAGES)), STAGE_PAGES, strict=True):
        params = {"run": chosen} if page.endswith(("tree_explorer.py", "pairs.py", "trajectories.py")) else None
        col.page_link(page, label=label, icon=icon, query_params=params)
    if run.status == "interrupted":
        stored = run.model
        # As the loader reads the spec (engine.llm.registry): a stored one may start with a space.
        try:
            stored_kind = parse_model_spec(stored).kind
        except GeneratorError:  # a spec this version no longer reads (resuming with it is refused in one line)
            stored_kind = ""
        needs_retype = stored_kind == "openai" and bool(os.environ.get("OPENAI_API_KEY"))
        with st.form("rs_resume", border=True):
            st.markdown(f"Run **{md(run.name)}** is interrupted at {run.simulations} simulations: resume it.")
            st.caption("Stored model:")
            st.code(stored, language=None)
            typed = st.text_input("Model for the resume", key="rs_resume_model",
                                  placeholder="(empty: the stored model)",
                                  help="Its API key ($OPENAI_API_KEY) goes to a stored server URL only when you "
                                       "type that spec again here.")
            fm.field_error("rs_resume", "model")
            resume_on_ray, resume_address = ray_inputs("rs_resume", "rs_resume_")
            resume_shards = shards_input("rs_resume", "rs_resume_")
            resume = st.form_submit_button("Resume", type="primary")
        if resume and (refused := fm.refused(db)) is not None:  # before any probe (forms.refused)
            fm.set_errors("rs_resume", {})
            state["rs_error"] = f"Not resumed: {refused}"
            st.rerun()
        if resume:
            errors: dict[str, str] = {}
            resume_config: dict[str, Any] = {}
            check_ray_inputs(errors, resume_config, resume_on_ray, resume_address)
            resume_model = typed.strip() or None
            if resume_model is None and needs_retype:
                errors["model"] = ("The stored model's URL comes from the database: type the spec again to send "
                                   "$OPENAI\\_API\\_KEY there.")
            elif resume_model is not None:
                try:
                    from engine.llm.registry import check_model

                    check_model(resume_model)
                except fm.submit_errors() as e:
                    errors["model"] = fm.refusal(e)
            fm.set_errors("rs_resume", errors)
            if not errors:
                try:
                    from engine.jobs.submit import submit_search

                    auth.require(db, "launch_jobs")  # a login (and a maintainer) where one is needed
                    with Store(db) as store:
                        job_id = submit_search(store, resume=chosen, model=resume_model,
                                               ray=resume_config.get("ray"), shards=resume_shards or None)
                    state["rs_flash"] = f"Queued job {job_id}: resume run {chosen}{on_ray_words(resume_config)}."
                except fm.submit_errors() as e:
                    state["rs_error"] = f"Not resumed: {fm.refusal(e)}"
            st.rerun()
else:
    st.info("No runs yet: start a search below (or `make run`).")

# --- a new search ----------------------------------------------------------------------------------------

errors = fm.form_errors(FORM)
with st.expander("New search", expanded=not runs or bool(errors)), st.form(FORM, border=False):
    left, mid, right = st.columns(3)
    envs = known_envs()
    env = left.selectbox("Environment", envs, index=envs.index("textcraft") if "textcraft" in envs else 0,
                         key="rs_env", help="Built-in envs and the plugins of the `orchard.envs` entry points.")
    env_arg = left.text_input("Env argument", key="rs_env_arg", placeholder="(none)",
                              help="NAME:ARG is passed to the env, e.g. babyai:GoToLocal.")
    with left:
        fm.field_error(FORM, "env")
    split = mid.selectbox("Split", ["train", "test"], key="rs_split")
    tasks = mid.text_input("Tasks", key="rs_tasks", placeholder=f"(empty: the first {DEFAULT_TASKS})",
                           help="Index range START:STOP[:STEP] into the split, or ids a,b,c.")
    with mid:
        fm.field_error(FORM, "tasks")
    model = right.text_input("Model", value="tiny", key="rs_model",
                             help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH")
    with right:
        fm.field_error(FORM, "model")
    name = right.text_input("Name", key="rs_name", placeholder="(empty: ENV-DATE-TIME)")
    with right:
        on_ray, ray_address = ray_inputs(FORM, "rs_")
        shards = shards_input(FORM, "rs_")
    st.markdown("**Search settings** (docs/algorithms.md §2)")
    values = fm.settings_inputs(SearchConfig, FORM, "rs_set_")
    submitted = st.form_submit_button("Queue the search", type="primary")


def check_new_search() -> tuple[dict[str, str], dict[str, Any]]:
    """Field messages for the form's values (empty: good), and the search job's config."""
    from engine.search.stage import SearchJob, search_tasks

    problems: dict[str, str] = {}
    spec = f"{env}:{env_arg.strip()}" if env_arg.strip() else env
    settings = fm.changed(SearchConfig, values)
    config: dict[str, Any] = {"env": spec, "tasks": tasks.strip(), "split": split, "model": model.strip() or "tiny",
              "name": name.strip() or f"{env}-{time.strftime('%Y%m%d-%H%M%S')}", "search": settings}
    check_ray_inputs(problems, config, on_ray, ray_address)
    if shards:
        config["shards"] = shards
    fm.check_target(problems, spec, lambda: search_tasks(SearchJob(env=spec, tasks=config["tasks"], split=split)),
                    config["model"])
    problems.update(fm.check_settings(SearchConfig, values))
    return problems, config


if submitted and (refused := fm.refused(db)) is not None:  # before any probe (forms.refused)
    fm.set_errors(FORM, {})
    state["rs_error"] = f"The search was not queued: {refused}"
    st.rerun()
if submitted:
    problems, config = check_new_search()
    fm.set_errors(FORM, problems)
    if not problems:
        from engine.jobs.submit import submit_stage

        try:
            auth.require(db, "launch_jobs")  # a login (and a maintainer) where one is needed
            with Store(db) as store:
                job_id = submit_stage(store, "search", config)
            state["rs_flash"] = f"Queued job {job_id}: search {md(config['name'])}{on_ray_words(config)}."
        except fm.submit_errors() as e:
            state["rs_error"] = f"The search was not queued: {fm.refusal(e)}"
    st.rerun()

if "rs_error" in state:
    st.error(state.pop("rs_error"))  # md()-escaped when it was set
if "rs_flash" in state:
    st.success(state.pop("rs_flash"))

# --- the newest search job, live ------------------------------------------------------------------------

if data.has_data(path):
    job = jp.latest_job(db, ("search",))
    if job is not None:
        st.subheader("Search job")
        jp.job_panel(db, job, "rs_job")
