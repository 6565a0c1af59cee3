"""Evaluation: launch an evaluation (model, split, mode greedy / sampled / MCTS with its budget); compare
models side by side, each figure with its bootstrap interval over tasks; and the Loop view —
Algorithm 1 per iteration (search -> data -> curation -> train -> evaluate) with each stage's status
and a "Next iteration" button.

Why intervals everywhere: on a few dozen held-out tasks, a difference of a few points between two
models is usually noise; the page shows the interval next to every figure so nobody reads a gain
into overlapping bars. Why "Next iteration" is one iterate job: the loop's stages depend on each
other's outputs (the run a search makes, the model a training makes), and `orchard iterate` already
runs them in order and records each; the job continues the selected loop under its own id with its
newest model (engine.jobs.submit.next_iteration_config).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import auth, compare, data, figures, loop
from dashboard import forms as fm
from dashboard import jobs_panel as jp
from dashboard.store import Store
from dashboard.text import md, number
from engine.envs.registry import known_envs
from engine.evaluate import MODES, EvalConfig
from engine.loop import METHODS

FORM = "ev_new"
MODE_HELP = {"greedy": "one episode per task, temperature 0", "sampled": "one episode per task and seed, sampled",
             "mcts": "MCTS at every step with the budget below (simulations, K)"}

path = data.db_path()
db = str(path)
state = st.session_state
st.title("Evaluation")


@st.cache_data(show_spinner=False, max_entries=8)
def read(path: str, version: data.Version) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with Store(path, readonly=True) as store:
        return store.evaluations(), store.iterations()


@st.cache_data(show_spinner=False, max_entries=8)
def read_episodes(path: str, version: data.Version, ids: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """The stored episodes of evaluations `ids` (for paired differences), read only for those."""
    with Store(path, readonly=True) as store:
        return {e["id"]: e["episodes"] for e in store.evaluations(with_episodes=True) if e["id"] in ids}


@st.cache_data(show_spinner=False, max_entries=16)
def task_spec(env_spec: str, split: str, task_ids: tuple[str, ...]) -> str:
    """The form's Tasks text that selects exactly `task_ids`: "" (the whole split), START:STOP, or ids."""
    from engine.envs.base import close_env
    from engine.envs.registry import env_factory

    try:
        env = env_factory(env_spec)()
        try:
            ids = [t.id for t in env.tasks(split)]
        finally:
            close_env(env)
    except fm.submit_errors():
        return ",".join(task_ids)
    if list(task_ids) == ids:
        return ""
    start = ids.index(task_ids[0]) if task_ids and task_ids[0] in ids else -1
    if start >= 0 and ids[start:start + len(task_ids)] == list(task_ids):
        return f"{start}:{start + len(task_ids)}"
    return ",".join(task_ids)


def model_label(model: str) -> str:
    """A short name: 'tiny', or the model folder's name."""
    return model if model == "tiny" or "/" not in model else Path(model).name


def interval(m: Any) -> str:
    if not isinstance(m, dict) or not isinstance(m.get("mean"), int | float) or math.isnan(m["mean"]):
        return "—"
    return f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


problem = jp.poll(db)
if problem:
    st.error(problem)

# --- launch an evaluation ---------------------------------------------------------------------------------

newest = loop.newest_model(db)
evaluations, iterations = read(db, data.db_version(path)) if data.has_data(path) else ([], [])
by_id = {e["id"]: e for e in evaluations}


def compared(evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evaluations of the env and split the comparison below shows (its pickers' values, or their
    defaults on a first visit)."""
    envs_seen = sorted({e["env"] for e in evals})
    env = state.get("ev_env") if state.get("ev_env") in envs_seen else (envs_seen or [None])[0]
    splits = sorted({e["split"] for e in evals if e["env"] == env})
    split = state.get("ev_split") if state.get("ev_split") in splits else "test" if "test" in splits else (
        splits or [None])[0]
    return [e for e in evals if e["env"] == env and e["split"] == split]


# The form starts from the chosen baseline's settings (so what it launches is comparable with it), or the
# demo's (engine.evaluate.DEFAULT_EVAL). Its keyed widgets keep what was typed, so a new baseline resets them.
chosen = compared(evaluations)
if state.get("ev_baseline") not in {e["id"] for e in chosen}:
    state.pop("ev_baseline", None)
baseline_id = state.get("ev_baseline") or compare.default_baseline(chosen, iterations)
baseline = by_id.get(baseline_id or "")
form_keys = ["ev_env_new", "ev_env_arg", "ev_split_new", "ev_tasks", "ev_mode",
             *(f"ev_set_{f}" for f in EvalConfig.__dataclass_fields__ if f != "mode")]
if state.get("ev_form_base", "") != baseline_id:
    for key in form_keys:
        state.pop(key, None)
    state["ev_form_base"] = baseline_id
defaults = compare.form_defaults(baseline)
base_env, _, base_arg = (baseline["env"] if baseline else "textcraft").partition(":")
with st.expander("Launch an evaluation", expanded=bool(fm.form_errors(FORM))), st.form(FORM, border=False):
    left, mid, right = st.columns(3)
    model = left.text_input("Model", value=newest, key="ev_model",
                            help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH (default: the newest trained)")
    with left:
        fm.field_error(FORM, "model")
    envs = known_envs()
    env_name = mid.selectbox("Environment", envs, index=envs.index(base_env) if base_env in envs else
                             envs.index("textcraft") if "textcraft" in envs else 0, key="ev_env_new")
    env_arg = mid.text_input("Env argument", value=base_arg, key="ev_env_arg", placeholder="(none)")
    with mid:
        fm.field_error(FORM, "env")
    split = right.selectbox("Split", ["test", "train"], index=1 if baseline and baseline["split"] == "train" else 0,
                            key="ev_split_new")
    tasks = right.text_input("Tasks", key="ev_tasks", placeholder="(empty: the whole split)",
                             value=task_spec(baseline["env"], baseline["split"], tuple(baseline["task_ids"]))
                             if baseline else "",
                             help="Index range START:STOP[:STEP] into the split, or ids a,b,c.")
    with right:
        fm.field_error(FORM, "tasks")
    mode = st.radio("Mode", list(MODES), horizontal=True, key="ev_mode", index=list(MODES).index(defaults["mode"]) if defaults["mode"] in MODES else 0,
                    captions=[MODE_HELP[m] for m in MODES])
    st.markdown("**Settings** (the MCTS budget: mcts simulations, mcts k); they start from "
                + (f"the baseline's below ({md(model_label(baseline['model']))} · {md(baseline['id'][:6])})"
                   if baseline else "the demo's"))
    values = fm.settings_inputs(EvalConfig, FORM, "ev_set_", skip=("mode",), defaults=defaults)
    launch = st.form_submit_button("Launch the evaluation", type="primary")


def check_eval_form() -> tuple[dict[str, str], dict[str, Any]]:
    from engine.evaluate import EvalJob, eval_tasks
    from engine.jobs.submit import eval_job_config

    problems: dict[str, str] = {}
    spec = f"{env_name}:{env_arg.strip()}" if env_arg.strip() else env_name
    settings = fm.changed(EvalConfig, values)
    config = eval_job_config(model.strip() or "tiny", spec, split, tasks.strip(),
                             {"mode": mode, **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}})
    fm.check_target(problems, spec, lambda: eval_tasks(EvalJob(model=config["model"], env=spec, split=split,
                                                               tasks=config["tasks"])), config["model"])
    problems.update(fm.check_settings(EvalConfig, values))
    if values.get("constrained") is True and config["model"].startswith("openai:") and "model" not in problems:
        problems["constrained"] = ("constrained decoding needs an hf: or vllm: model (an HTTP server decodes "
                                   "unconstrained): untick it, and compare with a baseline evaluated the same way")
    return problems, config


if launch and (refused := fm.refused(db)) is not None:  # before any probe (forms.refused)
    fm.set_errors(FORM, {})
    state["ev_error"] = f"The evaluation was not queued: {refused}"
    st.rerun()
if launch:
    problems, config = check_eval_form()
    fm.set_errors(FORM, problems)
    if not problems:
        from engine.jobs.submit import submit_eval

        try:
            auth.require(db, "launch_jobs")  # a login (and a maintainer) where one is needed
            with Store(db) as store:
                job_id = submit_eval(store, config["model"], config["env"], config["split"], config["tasks"],
                                     config["eval"])
            state["ev_flash"] = f"Queued job {job_id}: evaluate {md(model_label(config['model']))} ({mode})."
        except fm.submit_errors() as e:
            state["ev_error"] = f"The evaluation was not queued: {fm.refusal(e)}"
    st.rerun()

if "ev_error" in state:
    st.error(state.pop("ev_error"))  # md()-escaped when set
if "ev_flash" in state:
    st.success(state.pop("ev_flash"))
if data.has_data(path) and (job := jp.latest_job(db, ("eval", "iterate"))) is not None:
    jp.job_panel(db, job, "ev_job")

# --- compare models ---------------------------------------------------------------------------------------

if not evaluations:
    st.info("No evaluations yet: launch one above (or `orchard eval --model tiny --tasks test --mode greedy`, "
            "or `orchard iterate`).")
else:
    st.subheader("Compare models")
    left, mid, right = st.columns(3)
    envs_seen = sorted({e["env"] for e in evaluations})
    env = left.selectbox("Environment", envs_seen, key="ev_env")
    splits = sorted({e["split"] for e in evaluations if e["env"] == env})
    split_seen = mid.selectbox("Split", splits, index=splits.index("test") if "test" in splits else 0,
                               key="ev_split")
    metric = right.selectbox("Metric", [k for k, _ in figures.EVAL_METRICS], key="ev_metric",
                             format_func=lambda k: dict(figures.EVAL_METRICS)[k])
    chosen = [e for e in evaluations if e["env"] == env and e["split"] == split_seen]
    ids = [e["id"] for e in chosen]
    default_base = compare.default_baseline(chosen, iterations)
    base_id = st.selectbox(
        "Baseline", ids, index=ids.index(baseline_id) if baseline_id in ids else ids.index(default_base or ids[0]),
        key="ev_baseline", format_func=lambda i: f"{model_label(by_id[i]['model'])} · {by_id[i]['mode']} · {i[:6]}",
        help="What the others are compared with (paired over the same tasks); a new evaluation launched above "
             "starts from its settings. Default: the loop's base evaluation, else the oldest.")
    base = by_id[base_id]
    base_key = compare.group_key(base)
    alike = {e["id"] for e in chosen if compare.group_key(e) == base_key}
    names = {e["id"]: f"{model_label(e['model'])} · {e['mode']} · {e['id'][:6]}" for e in chosen}
    labels = {i: name + ("" if i in alike else " · other settings") for i, name in names.items()}
    # By default the baseline and the newest evaluation of each (model, mode) under the baseline's settings:
    # only like with like. The key names the newest evaluation and the baseline: a keyed multiselect keeps its
    # picks when its default changes, so an evaluation that lands while the page is open would stay out.
    newest_each: dict[tuple[str, str], str] = {}
    for ev in chosen:
        if ev["id"] in alike and ev["id"] != base_id:
            newest_each[(ev["model"], ev["mode"])] = ev["id"]
    picked = st.multiselect("Evaluations side by side", list(labels),
                            default=[base_id, *list(newest_each.values())[-3:]],
                            format_func=lambda i: labels[i], key=f"ev_pick_{chosen[-1]['id']}_{base_id}")
    shown = [e for e in chosen if e["id"] in picked] or [base]
    for ev in shown:
        if diffs := compare.differences(base, ev):
            st.warning(md(f"Not comparable with the baseline {names[base_id]}: {names[ev['id']]} differs in "
                          + "; ".join(diffs)) + " — evaluate it with the baseline's settings (the form above "
                       "starts from them).")
    rows = [{"label": labels[e["id"]], "mode": e["mode"], **{k: e["metrics"].get(k) for k, _ in figures.EVAL_METRICS}}
            for e in shown]
    if any(isinstance(r.get(metric), dict) for r in rows):
        st.plotly_chart(figures.eval_figure(rows, metric), key="ev_chart", config={"displayModeBar": False})
    else:
        st.caption(f"No evaluation here measured {dict(figures.EVAL_METRICS)[metric]}.")
    episodes = read_episodes(db, data.db_version(path), tuple(e["id"] for e in shown))

    def against_base(e: dict[str, Any]) -> str:
        if e["id"] == base_id:
            return "baseline"
        diff = compare.diff_text(compare.paired({**base, "episodes": episodes.get(base_id)},
                                                {**e, "episodes": episodes.get(e["id"])}, metric))
        return diff if e["id"] in alike or diff.startswith("no ") else f"{diff}; other settings (see above)"

    metric_label = dict(figures.EVAL_METRICS)[metric]
    side = pd.DataFrame({labels[e["id"]]: {label: interval(e["metrics"].get(key)) for key, label in figures.EVAL_METRICS}
                         | {f"{metric_label} − baseline (paired)": against_base(e), "tasks": str(len(e["task_ids"])),
                            "episodes": str(e["metrics"].get("episodes"))}
                         for e in shown})
    st.dataframe(side, key="ev_side")
    st.caption("Each figure: mean [low, high] of a bootstrap interval resampling tasks; overlapping intervals are "
               "no evidence of a difference. The difference from the baseline is paired: per task, then a "
               "bootstrap over the same resampled tasks (an interval holding 0 is no evidence of a difference).")
    with st.expander("Every evaluation"):
        every = pd.DataFrame([{
            "id": e["id"], "model": model_label(e["model"]), "mode": e["mode"], "tasks": len(e["task_ids"]),
            "episodes": e["metrics"].get("episodes"),
            **{label: interval(e["metrics"].get(key)) for key, label in figures.EVAL_METRICS},
            "baseline's settings": "yes" if e["id"] in alike else "; ".join(compare.differences(base, e)),
            "created": pd.Timestamp(e["created_at"], unit="s").floor("s"), "path": e["model"],
        } for e in reversed(chosen)])
        st.dataframe(every, hide_index=True, key="ev_table")
        st.download_button("Download as CSV", every.to_csv(index=False).encode("utf-8"), file_name="evaluations.csv",
                           mime="text/csv", key="ev_download", on_click="ignore")

# --- the loop (Algorithm 1) -------------------------------------------------------------------------------


LOOP_COLUMNS = ("search", "human nodes", "data", "curation", "train", "gate", "evaluate", "evaluation", "model")


def curation_cell(gate: dict[str, Any] | None, counts: dict[str, int]) -> str:
    """What an iteration trained on, by curation state (its recorded gate), else the run's pair counts."""
    if isinstance(gate, dict):
        used = gate.get("final", 0) + gate.get("uncurated_used", 0)
        return (f"trained on {used}: {gate.get('final', 0)} curated + {gate.get('uncurated_used', 0)} uncurated; "
                f"{gate.get('uncurated_left_out', 0)} uncurated left out")
    if counts:
        return f"{counts.get('approved', 0)} approved · {counts.get('pending', 0)} pending"
    return "—"


def model_cell(model: Any, names: dict[str, str]) -> str:
    """The model as the Evaluation page labels it (its folder's name) and, when it is registered, as the
    Training page's Models table names it."""
    label = model_label(str(model or ""))
    return f"{label} ({names[model]})" if isinstance(model, str) and model in names and names[model] != label else label


def stage_rows(records: list[dict[str, Any]], pair_counts: dict[str, dict[str, int]],
               names: dict[str, str] | None = None, live: loop.LiveStage | None = None,
               human: dict[str, int] | None = None) -> pd.DataFrame:
    """One row per iteration, one column per stage, each cell its status; with `live` (this loop's
    running job), a row for the iteration under way, its running stage with that stage's progress.
    `human`: the human-authored nodes of each search run (loop.human_counts), by run id."""
    names, human = names or {}, human or {}
    rows = []
    for r in sorted(records, key=lambda r: r["idx"]):
        ev: dict[str, Any] = found if isinstance(found := r.get("eval"), dict) else {}
        if r["idx"] == 0:
            rows.append({"iteration": "base", "search": "—", "human nodes": "—", "data": "—", "curation": "—",
                         "train": "—", "gate": "—",
                         "evaluate": interval(ev.get("success")), "evaluation": str(ev.get("eval_id") or "—"),
                         "model": model_cell(r.get("model"), names)})
            continue
        counts = pair_counts.get(r.get("run_id") or "", {})
        data_n = r.get("pairs", r.get("samples"))
        rows.append({
            "iteration": str(r["idx"]),
            "search": f"✓ run {r.get('run_id')} · {r.get('solved_in_search', 0)} solved" if r.get("run_id") else "—",
            "human nodes": str(human.get(r["run_id"], 0)) if r.get("run_id") else "—",
            "data": f"✓ {data_n} rows" if data_n else "✗ none",
            "curation": curation_cell(r.get("curation"), counts),
            "train": "✓" if r.get("train") else f"skipped: {r['skipped']}" if r.get("skipped") else "✗",
            "gate": loop.gate_cell(r),
            "evaluate": interval(ev.get("success")) if ev else "—",
            "evaluation": str(ev.get("eval_id") or "—"),
            "model": model_cell(r.get("model"), names),
        })
    if live is not None and live.iteration is not None and (cells := live.row_cells()):
        running = {"iteration": f"{live.iteration} (running)" if live.iteration else "base (running)",
                   **dict.fromkeys(LOOP_COLUMNS, "—")}
        if live.iteration:  # curation happens as the data stage ends
            running.update(cells, curation="✓" if cells["data"] == "✓" else "…")
        else:  # the base's evaluation, before the loop has any record
            running["evaluate"] = cells["evaluate"]
        rows.append(running)
    return pd.DataFrame(rows)


def loop_view() -> None:
    """The Loop view: every loop's iterations, stage by stage, read from the store on every run; while a
    loop job is queued or running, a fragment refreshed every LIVE_EVERY_S s that also shows the
    iteration under way, its stage and the stage's own progress (simulations, trees, steps, episodes),
    so a record appears as soon as its iteration ends; once the job ends, the whole page is read again."""
    has = data.has_data(path)
    evals_now, records = read(db, data.db_version(path)) if has else ([], [])
    evals_by_id = {e["id"]: e for e in evals_now}
    live = loop.LiveStage.of(jp.latest_job(db, ("iterate",))) if has else None
    if live is None and state.pop("ev_loop_live", None):
        st.rerun(scope="app")  # the loop job just ended: every part of the page reads the store again
    if live is not None:
        state["ev_loop_live"] = live.job.id
    st.subheader("Loop")
    st.caption("Algorithm 1 (docs/algorithms.md §3) per iteration: search → data → curation → train → gate → "
               "evaluate.")
    loops: dict[str, list[dict[str, Any]]] = {}
    for it in records:
        loops.setdefault(it["loop_id"], []).append(it)
    if live is not None and live.loop_id not in loops:
        loops[live.loop_id] = []  # a new loop: no record until its first stage ends
    if not loops:
        new_loop_form()
        return
    methods = {i: its[0]["method"] if its else live.method if live is not None else "" for i, its in loops.items()}
    order = list(reversed(loops))
    if live is not None and not loops[live.loop_id]:
        order = [live.loop_id, *(i for i in order if i != live.loop_id)]
    # No record count in the label: the frontend keeps showing the label an option had when the picker was
    # first drawn (streamlit/streamlit#13788); the count is in the caption below.
    loop_id = st.selectbox("Loop", order, key="ev_loop", format_func=lambda i: f"{methods[i]} · {i}")
    its = sorted(loops[loop_id], key=lambda r: r["idx"])
    running = live if live is not None and live.loop_id == loop_id else None
    st.caption(f"{len(its)} records" + (f"; job {running.job.id} is running it" if running else "")
               + ".")
    if running is not None:
        p = running.job.progress
        step, total = p.get("step") or 0, p.get("total") or 0
        st.progress(min(1.0, step / total) if total else 0.0, text=md(running.headline()))
    with Store(db, readonly=True) as store:
        pc = {r["run_id"]: store.pair_counts(run_id=r["run_id"]) for r in its if r.get("run_id")}
        names = {m.path: m.name for m in store.models()}
        human = loop.human_counts(store, [r["run_id"] for r in its if r.get("run_id")])
    stages = stage_rows(its, pc, names, running, human)
    # Each iteration's evaluation beside the base's: named differences, else the paired difference in success.
    evals = {r["idx"]: evals_by_id.get((r.get("eval") or {}).get("eval_id") or "") for r in its}
    first = evals.get(0) or next((e for e in evals.values() if e), None)
    if first is not None:
        found = read_episodes(db, data.db_version(path), tuple(e["id"] for e in evals.values() if e))
        vs_base = []
        for r in its:
            found_eval = evals.get(r["idx"])
            if found_eval is None or found_eval["id"] == first["id"]:
                vs_base.append("baseline" if found_eval is not None else "—")
                continue
            if diffs := compare.differences(first, found_eval):
                name = f"iteration {r['idx']}" if r["idx"] else "base"
                st.warning(md(f"Not comparable: {name} was evaluated under other settings than the first "
                              f"evaluation: " + "; ".join(diffs)))
            vs_base.append(compare.diff_text(compare.paired({**first, "episodes": found.get(first["id"])},
                                                            {**found_eval, "episodes": found.get(found_eval["id"])}, "success")))
        vs_base += ["—"] * (len(stages) - len(vs_base))  # the running iteration's row
        stages["success − baseline (paired)"] = vs_base
    if len(stages):
        st.dataframe(stages, hide_index=True, key="ev_loop_stages")
    scored = [{"label": f"iteration {r['idx']}" if r["idx"] else "base",
               **{k: (r.get("eval") or {}).get(k) for k, _ in figures.EVAL_METRICS}} for r in its]
    if any(isinstance(r.get(k), dict) for r in scored for k in ("success", "progress", "loop_rate")):
        st.plotly_chart(figures.loop_figure(scored), key="ev_loop_chart", config={"displayModeBar": False})
    if not its:
        return  # the loop's first job is still on its first stage: nothing to continue yet
    last_gate = next((r["curation"] for r in reversed(its) if isinstance(r.get("curation"), dict)), None)
    was_pending = bool(next((r["config"].get("include_pending") for r in reversed(its)
                             if isinstance(r.get("config"), dict)), False))
    next_pending = st.checkbox(
        "Next iteration: include uncurated rows", value=was_pending, key="ev_next_pending",
        help="By default the loop trains only on rows curated on the Data pages (approved / edited). Checked, it "
             "also trains on rows nobody has reviewed; rejected and disputed rows never.")
    if last_gate:
        count = {k: int(number(last_gate.get(k), 0)) for k in ("final", "uncurated_used", "uncurated_left_out")}
        st.caption(f"Last iteration: {count['final']} curated rows, "
                   f"{count['uncurated_used'] + count['uncurated_left_out']} uncurated "
                   f"({'included' if count['uncurated_used'] else 'left out'}). The next iteration "
                   f"{'includes' if next_pending else 'leaves out'} the uncurated rows of its own search.")
    if st.button("Next iteration", key="ev_next", type="primary", disabled=running is not None,
                 help="One more iteration of this loop, with its newest model (an iterate job)."
                      + (" Not while a job runs this loop: it would start from the model before it." if running
                         else "")):
        from engine.jobs.submit import next_iteration_config, submit_iterate

        try:
            auth.require(db, "launch_jobs")  # a login (and a maintainer) where one is needed
            with Store(db) as store:
                cfg = {**next_iteration_config(store, loop_id), "include_pending": next_pending}
                job_id = submit_iterate(store, cfg)
            state["ev_flash"] = (f"Queued job {job_id}: iteration {cfg['first_iteration']} of loop {md(loop_id)} "
                                 f"from {md(model_label(cfg['model']))}.")
        except fm.submit_errors() as e:
            state["ev_error"] = f"The next iteration was not queued: {fm.refusal(e)}"
        st.rerun(scope="app")


def new_loop_form() -> None:
    """No loop yet: the form that starts one (an iterate job)."""
    st.caption("No loop yet. Start one: its first iteration searches with the newest model, builds the data, "
               "trains and evaluates (an iterate job; `orchard iterate` does the same).")
    with st.form("ev_loop_new", border=True):
        left, mid, right = st.columns(3)
        method = left.selectbox("Method", list(METHODS), key="ev_loop_method",
                                help="exit: expert iteration, SFT on each solved tree's shortest success (the "
                                     "default); agentq: step pairs + DPO; agentr: revisions + SFT; visits: SFT "
                                     "toward the search's visit counts")
        loop_model = mid.text_input("Model", value=newest, key="ev_loop_model")
        fm.field_error("ev_loop_new", "model")
        loop_env = right.selectbox("Environment", envs, index=envs.index("textcraft") if "textcraft" in envs else 0,
                                   key="ev_loop_env")
        per_it = left.number_input("Tasks per iteration", value=8, step=1, key="ev_loop_tasks")
        fm.field_error("ev_loop_new", "tasks_per_iteration")
        eval_tasks_spec = mid.text_input("Held-out tasks", key="ev_loop_eval", placeholder="(empty: the test split)")
        fm.field_error("ev_loop_new", "eval_tasks")
        fixes = right.number_input("Corrections per failed episode", value=0, min_value=0, step=1,
                                   key="ev_loop_corrections",
                                   help="exit-mcts / exit-sampled only: also train on the first N failing steps of "
                                        "each greedy failure, labelled with the step of a played win the "
                                        "environment verified (0: off; measured worse than off on the "
                                        "validation tasks, see the README)")
        fm.field_error("ev_loop_new", "corrections")
        copies = left.number_input("Renamed copies per trajectory", value=0, min_value=0, step=1, key="ev_loop_renamed",
                                   help="distilling methods (exit, exit-mcts, exit-sampled, visits) on an environment "
                                        "that can rename its entities (TextCraft): each trajectory is also trained "
                                        "on N times with its item names swapped consistently, so the policy reads "
                                        "recipes instead of memorising them by name (0: off; measured: no gain on "
                                        "the test tasks, see the README)")
        fm.field_error("ev_loop_new", "renamed")
        loop_pending = st.checkbox("Include uncurated rows", key="ev_loop_pending",
                                   help="Nobody curates while an iteration runs: checked, the loop trains on the "
                                        "rows its search produced that nobody has reviewed; unchecked, only on "
                                        "curated ones (so an iteration with none trains nothing and says so).")
        start = st.form_submit_button("Start the loop", type="primary")
    if start and (refused := fm.refused(db)) is not None:  # before any probe (forms.refused)
        fm.set_errors("ev_loop_new", {})
        state["ev_error"] = f"The loop was not started: {refused}"
        st.rerun(scope="app")
    if start:
        from engine.jobs.submit import submit_iterate
        from engine.llm.registry import check_model

        cfg: dict[str, Any] = {"method": method, "model": loop_model.strip() or "tiny", "env": loop_env, "iterations": 1,
               "tasks_per_iteration": int(per_it), "eval_tasks": eval_tasks_spec.strip(),
               "include_pending": bool(loop_pending), "name": f"{method}-{time.strftime('%Y%m%d-%H%M%S')}",
               "corrections": int(fixes), "renamed": int(copies)}
        problems = {}
        try:
            check_model(cfg["model"])
        except fm.submit_errors() as e:
            problems["model"] = fm.refusal(e)
        try:
            from engine.envs.base import close_env
            from engine.envs.registry import env_factory
            from engine.loop import IterateConfig, loop_tasks

            env = env_factory(loop_env)()
            try:
                config = IterateConfig.from_dict(cfg)
                loop_tasks(config, env)
                config.check_env(env)
            finally:
                close_env(env)
        except fm.submit_errors() as e:
            problems["corrections" if "corrections" in str(e) else "renamed" if "renamed" in str(e) else
                     "eval_tasks" if "task" in str(e) and "per_iteration" not in str(e) else "tasks_per_iteration"] = (
                fm.refusal(e))
        fm.set_errors("ev_loop_new", problems)
        if not problems:
            try:
                auth.require(db, "launch_jobs")  # a login (and a maintainer) where one is needed
                with Store(db) as store:
                    job_id = submit_iterate(store, cfg)
                state["ev_flash"] = f"Queued job {job_id}: loop {md(cfg['name'])}, iteration 1."
            except fm.submit_errors() as e:
                state["ev_error"] = f"The loop was not started: {fm.refusal(e)}"
        st.rerun(scope="app")


# Live while a loop job is queued or running (the fragment stops itself, and reruns the page, when it ends).
st.fragment(run_every=jp.LIVE_EVERY_S if data.has_data(path) and loop.LiveStage.of(
    jp.latest_job(db, ("iterate",))) is not None else None)(data.store_errors_shown(loop_view))()
