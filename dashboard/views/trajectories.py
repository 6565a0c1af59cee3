"""Trajectories: Agent-R revision data (docs/algorithms.md §4), one (good, bad) path pair at a time.

Why this page: a revision trajectory is only as good as its transition point t'. Showing the good and
the bad path side by side, t' marked with the judge's own words, and the spliced result with each
turn's loss flag lets a person check the splice before it is trained on, and approve or reject it.

Writes name the version the page showed (`expected_version`); a stale one is refused by the store
and explained. Env and model text is shown only in `st.code`, `st.text` and data frames. The URL
holds run / task / sample, so a view can be shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import auth, builders, data, figures, tree_chart
from dashboard.history import history_table
from dashboard.store import CURATION_STATUSES, ConflictError, Store, StoreError
from dashboard.text import md
from dashboard.versions import VersionGuard
from engine.actions import FormatError, parse
from engine.datasets.samples import Sample, to_messages
from engine.tree_nodes import SearchTree

KIND = "revision"
PAGE_SIZE = 200
ALL = "(all)"
ERROR = "tr_error"
FLASH = "tr_flash"
PAGE = "tr_page"
LOSS = {True: "✓ trained", False: "✗ no loss", None: "– unspecified (trained)"}
SEGMENTS = {"prefix": "shared prefix", "bad": "bad steps (to t')", "revision": "revision turn",
            "good": "good suffix"}
ROLES = {"system": "SYSTEM", "user": "USER", "assistant": "ASSISTANT"}
TREE_PAGE = "views/tree_explorer.py"

path = data.db_path()
db = str(path)
version = data.db_version(path)
runs = data.list_runs(db, version)
qp = st.query_params
state = st.session_state
guard = VersionGuard("tr", "sample", "trajectory")


# --- writes -------------------------------------------------------------------------------------------------


def _set_status(sample_id: str, expected: int, status: str) -> None:
    """Approve / reject / reset, if nobody changed the sample since the page showed it."""
    state.pop(ERROR, None)
    who = auth.acting_as(db, "curate")
    if who is None:
        state[ERROR] = state.pop(auth.NOTICE, "Not saved.")
        return
    try:
        with Store(db) as store:
            sample = store.set_sample_status(sample_id, status, who, expected)
    except ConflictError as e:
        guard.refused(sample_id, e)
        return
    except (StoreError, OSError) as e:
        state[ERROR] = f"The database refused the change: {e}"
        return
    guard.saved(sample_id, sample.version)
    words = {"approved": "Approved", "rejected": "Rejected", "pending": "Reset to pending"}
    state[FLASH] = f"{words[status]} revision trajectory {sample_id}."
    data.clear_dataset_caches()


# --- navigation ---------------------------------------------------------------------------------------------


def _go(sample_id: str) -> None:
    st.query_params["sample"] = sample_id


def _set_page_from_filter() -> None:
    state[PAGE] = 0
    st.query_params.pop("sample", None)


def _set_page() -> None:
    state[PAGE] = int(state["tr_page_input"]) - 1
    st.query_params.pop("sample", None)


def _pick_run() -> None:
    chosen = state["tr_run"]
    for key in ("run", "task", "sample"):
        st.query_params.pop(key, None)
    if chosen != ALL:
        st.query_params["run"] = chosen
    state[PAGE] = 0


def _pick_task() -> None:
    chosen = state["tr_task"]
    for key in ("task", "sample"):
        st.query_params.pop(key, None)
    if chosen != ALL:
        st.query_params["task"] = chosen
    state[PAGE] = 0


def _picked_row(key: str, ids: Sequence[str]) -> None:
    rows = state[key].selection.rows
    if rows:
        _go(ids[rows[0]])


# --- display helpers ----------------------------------------------------------------------------------------


def command_of(text: str) -> str:
    parsed = parse(text)
    return "(format error)" if isinstance(parsed, FormatError) else parsed.command


def path_table(tree: SearchTree | None, nodes: Sequence[int], split: int, sample: Sample,
               verdicts: dict[int, str] | None = None, t_prime_node: int | None = None) -> pd.DataFrame:
    """One row per step of a root-to-leaf path: the tree's nodes when the tree is there, else what the
    sample itself kept of them."""
    by_node = {t.node: t for t in sample.turns if t.node is not None}
    rows = []
    for step, nid in enumerate(nodes):
        if tree is not None and nid < len(tree.nodes):
            node = tree.nodes[nid]
            command, observation = figures.short_command(node, 120), node.observation
        elif nid in by_node:
            command, observation = command_of(by_node[nid].text), by_node[nid].observation or ""
        else:
            command, observation = "(not stored)", ""
        row: dict[str, Any] = {
            "": "◀ t'" if nid == t_prime_node else "",
            "step": step + 1, "node": nid, "part": "shared" if step < split else "after the split",
            "action": command, "observation": observation,
        }
        if verdicts is not None:
            row["judgement"] = verdicts.get(nid, "" if step < split else "(not judged)")
        rows.append(row)
    return pd.DataFrame(rows)


def split_of(source: dict[str, Any]) -> int:
    """Steps the good and bad path share (down to their common ancestor)."""
    good, bad = tree_chart.node_ids(source.get("good_path")), tree_chart.node_ids(source.get("bad_path"))
    return next((i for i, (g, b) in enumerate(zip(good, bad)) if g != b), min(len(good), len(bad)))


def t_prime_step(source: dict[str, Any]) -> int | None:
    """t' as a 1-based step of the bad path (the engine stores it counted from the split)."""
    t = source.get("t_prime")
    return split_of(source) + t + 1 if isinstance(t, int) else None


def fmt(value: float | None) -> str:
    """A reward from the sample's source (imported data may hold anything): a number, else as text."""
    if value is None:
        return "—"
    return f"{value:g}" if isinstance(value, int | float) else md(value)


# --- what to show -------------------------------------------------------------------------------------------

notes: list[str] = []
run_id = data.resolve_run(db, qp["run"], version) if qp.get("run") else None
if qp.get("run") and run_id is None:
    notes.append("The run named in the URL was not found (or is ambiguous); showing all runs.")
    qp.pop("run", None)
tasks = [task for _, task in data.tree_index(db, run_id, version)] if run_id else []
task_id = qp.get("task")
if task_id is not None and task_id not in tasks:
    if run_id is not None:
        notes.append("The task named in the URL is not in this run; showing all its tasks.")
    task_id = None
    qp.pop("task", None)
if run_id is not None:
    qp["run"] = run_id

run_names = {r.id: f"{r.name} · {r.id}" for r in runs}
state["tr_run"] = run_id or ALL
state["tr_task"] = task_id or ALL
with st.sidebar:
    st.selectbox("Run", [ALL, *(r.id for r in reversed(runs))], key="tr_run", on_change=_pick_run,
                 format_func=lambda i: "All runs" if i == ALL else run_names.get(i, i))
    st.selectbox("Task", [ALL, *tasks], key="tr_task", on_change=_pick_task, disabled=run_id is None,
                 format_func=lambda t: "All tasks" if t == ALL else t)
    statuses = st.multiselect("Status", list(CURATION_STATUSES), key="tr_status", placeholder="all statuses",
                              persist_state="session", on_change=_set_page_from_filter)

st.title("Trajectories")
st.caption("Agent-R revision trajectories: the bad path up to its first error t' (no loss), a revision turn, "
           "then the good path (loss). Build them below, or with `orchard revisions build RUN --model JUDGE`.")
for note in notes:
    st.warning(note)
builders.revisions_builder(db, next((r for r in runs if r.id == run_id), None))  # the judge: the run's own model

f = data.filters(kind=KIND, run_id=run_id, task_id=task_id, status=statuses)
counts = data.sample_counts(db, f, version)
with st.sidebar:
    if counts["total"] and st.toggle("Export these trajectories", key="tr_export",
                                     help="The SFT rows `orchard export sft` writes (messages with per-turn loss "
                                          "flags), of the revision trajectories the filters match."):
        n_rows, blob = data.export_rows(db, "sft", f, version)
        st.download_button(f"Download {n_rows} SFT rows (JSONL)", blob, file_name="revisions.jsonl",
                           mime="application/jsonl", key="tr_download", on_click="ignore")
pages = max(1, -(-counts["total"] // PAGE_SIZE))
page = min(max(int(state.get(PAGE, 0)), 0), pages - 1)
samples = data.sample_page(db, f, PAGE_SIZE, page * PAGE_SIZE, version)
ids = [s.id for s in samples]
if not samples:
    st.info("No revision trajectories match. Build them with `orchard revisions build RUN --model JUDGE`, "
            "or widen the filters.")
    st.stop()

sample_id = qp.get("sample")
loaded = data.read_sample(db, sample_id) if sample_id else None
if sample_id and (loaded is None or loaded[0].kind != KIND):
    st.warning("The sample named in the URL is not a revision trajectory here; showing the first one.")
    loaded = None
if loaded is None:
    sample_id = ids[0]
    loaded = data.read_sample(db, sample_id)
if loaded is None:  # deleted between the two reads
    st.info("That revision trajectory was just removed; reload the page.")
    st.stop()
qp["sample"] = loaded[0].id  # == sample_id, which is a str by now
sample, history = loaded
src = sample.source
good_path = tree_chart.node_ids(src.get("good_path"))  # imported data may hold anything: the ids, in order
bad_path = tree_chart.node_ids(src.get("bad_path"))
ancestor = src.get("ancestor")
split = split_of(src)
stored_judgements = src.get("judgements")
judgements: list[dict[str, Any]] = [j for j in stored_judgements if isinstance(j, dict)] \
    if isinstance(stored_judgements, list) else []
verdicts = {j["node"]: str(j.get("verdict", "")) for j in judgements if tree_chart.node_ids([j.get("node")])}
t_prime_node = src.get("t_prime_node")

table = pd.DataFrame([{
    "": "▶" if s.id == sample_id else "",
    "sample": s.id, "task": s.task.id,
    "t' (bad path step)": t_prime_step(s.source), "error found": bool(s.source.get("error_found")),
    "revision length": s.source.get("revision_length"), "turns": len(s.turns),
    "good reward": s.source.get("good_reward"), "bad reward": s.source.get("bad_reward"), "status": s.status,
} for s in samples])
st.caption(f"{counts['total']} revision trajectories · {counts['pending']} pending · {counts['approved']} approved · "
           f"{counts['rejected']} rejected · {counts['edited']} edited — select a row to open it")
key = f"tr_table_{sample_id}"
st.dataframe(table, hide_index=True, key=key, on_select=partial(_picked_row, key, ids),
             selection_mode="single-row", height=min(38 + 35 * len(table), 240))
if pages > 1:
    state["tr_page_input"] = page + 1
    st.number_input(f"List page (of {pages})", 1, pages, key="tr_page_input", on_change=_set_page)

# --- curation -----------------------------------------------------------------------------------------------

flash = state.pop(FLASH, None)
if flash:
    st.success(flash)
if ERROR in state:
    st.error("Not saved.")
    st.code(state.pop(ERROR), language=None, wrap_lines=True)
expected, blocked = guard.panel(sample)

st.subheader("Revision trajectory")
index = ids.index(sample.id) if sample.id in ids else None
c = st.columns([1, 1, 1, 1, 2])
c[0].metric("Status", md(sample.status))
c[1].metric("t' (bad path step)", t_prime_step(src) or "—",
            help="1-based step of the bad path the judge first called Bad")
c[2].metric("Good reward", fmt(src.get("good_reward")))
c[3].metric("Bad reward", fmt(src.get("bad_reward")))
with c[4]:
    b = st.columns(3)
    b[0].button("Approve", key="tr_approve", icon=":material/check:", type="primary", width="stretch",
                disabled=blocked or sample.status == "approved", on_click=_set_status,
                args=(sample.id, expected, "approved"))
    b[1].button("Reject", key="tr_reject", icon=":material/close:", width="stretch",
                disabled=blocked or sample.status == "rejected", on_click=_set_status,
                args=(sample.id, expected, "rejected"))
    b[2].button("Reset", key="tr_reset", width="stretch", disabled=blocked or sample.status == "pending",
                on_click=_set_status, args=(sample.id, expected, "pending"))
    n = st.columns(2)
    n[0].button("Previous", key="tr_prev", icon=":material/arrow_back:", shortcut="K", width="stretch",
                disabled=not index, on_click=_go, args=(ids[(index or 1) - 1],))
    n[1].button("Next", key="tr_next", icon=":material/arrow_forward:", shortcut="J", width="stretch",
                disabled=index is None or index + 1 >= len(ids), on_click=_go,
                args=(ids[min((index or 0) + 1, len(ids) - 1)],))
st.text(f"sample {sample.id} · run {sample.run_id} · task {sample.task.id} · "
        f"judge {src.get('judge_model', '—')} · version {sample.version} · "
        f"last changed by {sample.updated_by or '—'}")

st.caption("Goal")
st.code(sample.task.goal or sample.task.first_observation, language=None, wrap_lines=True)

# --- good and bad path side by side -------------------------------------------------------------------------

tree_id = src.get("tree_id")
try:
    tree = data.load_tree(db, tree_id, version) if isinstance(tree_id, int) else None
except StoreError:  # a revision imported from another database names a tree this one does not hold
    tree = None
if tree is None:
    st.caption("The search tree is not in this database: paths are shown from the sample's own turns.")

st.subheader("Good and bad path")
st.caption(f"Both start from the root; they share {split} step(s) down to their common ancestor (node "
           f"{md(ancestor)}), then part. The judge walked the bad path's steps after the split in order; the "
           "first one it judged Bad is the transition point t'.")
left, right = st.columns(2, gap="medium")
with left:
    st.markdown("#### :green[Good path]")
    st.caption(f"reward {fmt(src.get('good_reward'))} · {len(good_path)} steps")
    st.dataframe(path_table(tree, good_path, split, sample), hide_index=True, key=f"tr_good_{sample.id}")
with right:
    st.markdown("#### :red[Bad path]")
    st.caption(f"reward {fmt(src.get('bad_reward'))} · {len(bad_path)} steps · ◀ t' marks the first error")
    st.dataframe(path_table(tree, bad_path, split, sample, verdicts, t_prime_node), hide_index=True,
                 key=f"tr_bad_{sample.id}")

if tree is not None:  # the two paths on their tree; a click opens that node in the Tree explorer
    st.caption("On the tree: colours are each step's loss flag in this sample; click a node to open it in "
               "the Tree explorer.")
    losses = {t.node: t.loss for t in sample.turns if t.node is not None}
    event = st.plotly_chart(
        figures.paths_figure(tree, good_path, bad_path, t_prime_node, losses), key=f"tr_tree_{sample.id}",
        on_select="rerun", selection_mode="points", config={"displaylogo": False},
    )
    picked = [p["customdata"] for p in event.selection.points if p.get("customdata") is not None]
    if picked and sample.run_id:
        node = picked[0][0] if isinstance(picked[0], list) else picked[0]
        st.switch_page(TREE_PAGE, query_params={"run": sample.run_id, "task": sample.task.id, "node": str(node),
                                                "revision": sample.id})  # drawn there on the whole tree

with st.container(border=True):
    step = t_prime_step(src)
    if src.get("error_found"):
        st.markdown(f"**Transition point t' — bad path step {step}, node {md(t_prime_node)}:** the first step "
                    "the judge called Bad.")
    else:
        st.markdown(f"**Transition point t' — bad path step {step}, node {md(t_prime_node)}:** the judge called "
                    "no step Bad, so t' is the bad path's last step (docs/algorithms.md §4).")
    record = next((j for j in judgements if j.get("node") == t_prime_node), None)
    at_t = next((t for t in sample.turns if t.node == t_prime_node and t.segment == "bad"), None)
    if at_t is not None:
        st.caption("ACTION AT t'")
        st.code(at_t.text, language=None, wrap_lines=True)
        st.caption("OBSERVATION AFTER IT")
        st.code(at_t.observation or "", language=None, wrap_lines=True)
    st.caption(f"JUDGEMENT ({md(src.get('judge_model', 'judge'))})")
    answer = str(record.get("answer", "")) if record else "(no judgement recorded)"
    st.code(answer, language=None, wrap_lines=True)
    if judgements:
        with st.expander(f"Every judgement on the bad path ({len(judgements)})"):
            st.dataframe(pd.DataFrame([{"step after split": j.get("step"), "node": j.get("node"),
                                        "verdict": j.get("verdict"), "answer": j.get("answer")}
                                       for j in judgements]),
                         hide_index=True, key=f"tr_judgements_{sample.id}")

# --- the spliced trajectory ---------------------------------------------------------------------------------

st.subheader("Spliced revision trajectory")
st.caption("What is trained on: the shared prefix and the bad steps through t' (bad steps get no loss), the "
           "revision turn, then the good path after the split (loss).")
turn_rows = [{
    "turn": i + 1, "part": SEGMENTS.get(t.segment, t.segment), "loss": LOSS.get(t.loss, str(t.loss)),
    # the revision turn is no node of the tree: said in words, never "None"
    "node": "— (revision turn)" if t.node is None else str(t.node), "action": command_of(t.text),
    "observation": t.observation or "",
} for i, t in enumerate(sample.turns)]
turn_table = pd.DataFrame(turn_rows)
st.dataframe(turn_table, hide_index=True, key=f"tr_turns_{sample.id}_{sample.version}")
with st.expander("Full chat, as trained (assistant messages marked with their loss flag)"):
    for message in to_messages(sample):
        role = ROLES.get(message["role"], "MESSAGE")
        flag = "" if message["train"] is None else (" · trained" if message["train"] else " · NO LOSS")
        st.caption(f"{role}{flag}")
        st.code(str(message["content"]), language=None, wrap_lines=True)

st.caption("History (newest first)")
st.dataframe(history_table(history), hide_index=True, key=f"tr_history_{sample.id}_{sample.version}")
