"""Tree explorer: one MCTS tree drawn at a level of detail, and an inspector for one node.

The URL holds run / task / node (`?run=..&task=..&node=..`, and `max_nodes=..|all` for the drawing
budget), so a view can be shared. Every way of choosing a node (a click in the plot, a typed id, a
row in the path / sibling / children / search tables) writes the `node` query parameter; the page
reads it back. A big tree is drawn in part (`dashboard.lod`): selecting a marker that hides a
subtree draws that subtree. The plot and the inspector are a fragment: a click, a table row or a
typed id reruns only them. While the run is searching, they redraw every few seconds, keeping the
selected node, the filters and the zoom (the chart is Vega-Lite, `dashboard.tree_chart`: a constant
spec whose rows change; the sidebar can pause following). The tree is read as a skeleton
(`engine.tree_columns.TreeColumns`: numbers, no texts; a live view reads only the nodes added since); texts are
read for the drawn nodes' hover labels and the inspected node's neighbourhood. Env and model text
is shown only through `st.text` and data frames, never as markdown or HTML; not `st.code`: any code
block on a page makes the browser load and run Streamlit's syntax highlighter (measured: ~0.4 s of
each view of this page, docs/decisions.md "The Tree explorer answers a click in a fragment").
`compare=RUN` puts that run's tree of the same task beside the shown one, below it (dashboard.tree_compare).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import auth, data, figures, lod, overview, tree_chart, tree_compare
from dashboard import forms as fm
from dashboard import jobs_panel as jp
from dashboard.store import RunInfo, Store
from dashboard.text import md, number, whole_number
from engine.tree_columns import TreeColumns
from engine.tree_nodes import TERMINALS, Node

MAX_TABLE_ROWS = 500
NODE_INPUT = "te_node"
PLOT = "te_plot"  # + the tree id: a zoom is kept per tree
LAST_PICK = "te_last_pick"  # (chart key, node) the chart's point selection named last
JUMP = "te_jump"  # set by a click in the run overview: the whole page reruns on that tree
SEEN_SEARCHING = "te_seen_searching"  # the tree this live view saw being searched (following moves on after it)
NO_REVISION = "(none)"
NO_COMPARE = "(none)"
SCROLL_HEIGHT = 760  # px of the scrolling container around a big tree's chart
REFRESH_S = 3.0  # how often the page redraws while its run is searching
BUDGETS = (1000, lod.DEFAULT_BUDGET, 10_000, 0)  # nodes drawn at most; 0: all of them
STEER = "te_steer"  # the steering form at the selected node (its field messages: forms.field_error)
STEER_KINDS = ("add_action", "search_here", "more_candidates")
STEER_QUEUED = "te_steer_queued"

path = data.db_path()
db = str(path)
version = data.db_version(path)
runs = data.list_runs(db, version)
qp = st.query_params

# --- resolve run / task / node from the URL (falling back to the newest run, its first task, root) ---

notes: list[str] = []
run_id = data.resolve_run(db, qp["run"], version) if qp.get("run") else None
if qp.get("run") and run_id is None:
    notes.append("The run named in the URL was not found (or is ambiguous); showing the newest run.")
run = next((r for r in runs if r.id == run_id), runs[-1])
summaries = data.tree_summaries(db, run.id, version)
trees = [(s.tree_id, s.task_id) for s in summaries]
per_task = run.config.get("simulations")
planned = per_task if isinstance(per_task, int) and per_task > 0 else None
if not trees:
    st.title("Tree explorer")
    st.info("This run has no tasks.")
    st.stop()
tree_of_task = {task: tree_id for tree_id, task in trees}
task_id = qp.get("task")
if task_id is not None and task_id not in tree_of_task:
    notes.append("The task named in the URL is not in this run; showing its first task.")
    task_id = None
if task_id is None and run.status == "running":  # a live run opens on a tree being searched
    task_id = overview.follow_target(summaries, "", planned, True)
task_id = task_id if task_id is not None else trees[0][1]
shown_task: str = task_id  # a task of the run by now
tree_id = tree_of_task[task_id]
summary_of = {s.task_id: s for s in summaries}
tree: TreeColumns | None = data.load_shape(db, tree_id, version)  # numbers only; texts of the nodes shown

node_id = 0
raw_node = qp.get("node")
if tree is not None and raw_node is not None:
    if (wanted := whole_number(raw_node)) is not None and wanted < len(tree):
        node_id = wanted
    else:
        notes.append("The node named in the URL is not in this tree; showing the root.")
# The tree's Agent-R revisions (Trajectories page): their first errors and the chosen one's splice are drawn.
revisions = [s for s in data.sample_page(db, data.filters(kind="revision", run_id=run.id, task_id=task_id), 200, 0,
                                         version) if s.source.get("tree_id") == tree_id]
revision_of = {s.id: s for s in revisions}
raw_revision = qp.get("revision")
if raw_revision is not None and raw_revision != NO_REVISION and raw_revision not in revision_of:
    notes.append("The revision named in the URL is not one of this tree's; showing its first one.")
    raw_revision = None
revision_id = raw_revision if raw_revision is not None else (revisions[0].id if revisions else NO_REVISION)
# A second run's tree of this task beside this one (`?compare=RUN`: a link opens the comparison).
compare_with = tree_compare.candidates(runs, run.id, task_id)
compare_run: RunInfo | None = None
if qp.get("compare"):
    other_id = data.resolve_run(db, qp["compare"], version)
    compare_run = next((r for r in compare_with if r.id == other_id), None)
    if compare_run is None:
        notes.append("The run to compare with named in the URL was not found, or did not search this task; "
                     "showing this tree alone.")
qp.update(run=run.id, task=task_id, node=str(node_id))  # the canonical, shareable URL
if compare_run is not None:
    qp["compare"] = compare_run.id
else:
    qp.pop("compare", None)
if revisions:
    qp["revision"] = revision_id
else:
    qp.pop("revision", None)
alpha = number(run.config.get("alpha", 0.5), 0.5)
raw_budget = qp.get("max_nodes")
if raw_budget is not None and "te_budget" not in st.session_state:
    value = 0 if raw_budget == "all" else whole_number(raw_budget)
    if value is None or value not in BUDGETS:
        notes.append(f"max_nodes in the URL must be one of {', '.join(map(str, BUDGETS[:-1]))} or all; "
                     f"drawing at most {lod.DEFAULT_BUDGET}.")
    else:
        st.session_state["te_budget"] = value


# --- callbacks: each writes the query parameters, the page reads them on the rerun ---------------------


def _go_to(node: int) -> None:
    st.query_params["node"] = str(node)
    st.session_state[NODE_INPUT] = str(node)


def _pick_run() -> None:
    st.query_params.clear()
    st.query_params["run"] = st.session_state["te_run"]


def _pick_task() -> None:
    st.query_params["task"] = st.session_state["te_task"]
    if compare_run is not None and st.session_state["te_task"] not in compare_run.task_ids:
        st.query_params.pop("compare", None)  # the compared run did not search that task
    st.query_params["node"] = "0"
    st.query_params.pop("revision", None)


def _pick_compare() -> None:
    picked = st.session_state["te_compare"]
    if picked == NO_COMPARE:
        st.query_params.pop("compare", None)
    else:
        st.query_params["compare"] = picked


def _pick_revision() -> None:
    st.query_params["revision"] = st.session_state["te_revision"]


def _picked_tree(key: str) -> None:
    """A click on a tile of the run overview opens that tree (the whole page reruns: the sidebar shows it)."""
    task = overview.picked_task(st.session_state[key].selection)
    if task is not None and task != st.query_params.get("task"):
        st.query_params["task"] = task
        st.query_params["node"] = "0"
        st.query_params.pop("revision", None)
        st.session_state[JUMP] = True


def _typed_node(n_nodes: int) -> None:
    text = (st.session_state.get(NODE_INPUT) or "").strip().lstrip("#")
    if (wanted := whole_number(text)) is not None and wanted < n_nodes:
        _go_to(wanted)
    else:
        st.session_state["te_node_error"] = f"No node {md(repr(text))} in this tree (ids 0..{n_nodes - 1})."


def _clicked_node(key: str) -> None:
    """A click names a node. The chart also reports its zoom (so that Streamlit keeps it across
    redraws): a zoom leaves the last click's node in the state, which must not undo a node chosen
    since in a table, so only a changed pick moves the inspector."""
    picked = tree_chart.picked_node(st.session_state[key].selection)
    if picked is not None and (key, picked) != st.session_state.get(LAST_PICK):
        _go_to(picked)
    st.session_state[LAST_PICK] = (key, picked)


def _picked_row(key: str, ids: Sequence[int]) -> None:
    rows = st.session_state[key].selection.rows
    if rows:
        _go_to(int(ids[rows[0]]))


def _toggle_collapse(tid: int, node: int) -> None:
    folded = st.session_state.setdefault("te_collapsed", {}).setdefault(tid, set())
    folded.symmetric_difference_update({node})


def _pick_budget() -> None:
    value = st.session_state["te_budget"]
    if value == lod.DEFAULT_BUDGET:
        st.query_params.pop("max_nodes", None)
    else:
        st.query_params["max_nodes"] = "all" if value == 0 else str(value)


def _steer(kind: str, node: int) -> None:
    """A button of the steering form: queue a job that grows this tree at `node` (engine/search/steer.py).
    Who may is asked first, before any check touches the env (forms.refused); every check then runs at
    submission (the node, the action read by the policy's parser, the env's step): a refusal is shown
    at its field and nothing is queued or stored."""
    from engine.jobs.submit import submit_steer

    state = st.session_state
    field = {"add_action": "action", "search_here": "simulations", "more_candidates": "k"}[kind]
    config: dict[str, Any] = {"run": run.id, "task": shown_task, "at": node}
    if kind == "add_action":
        config["action"] = str(state.get("te_steer_action") or "")
    elif kind == "search_here":
        config["simulations"] = int(state.get("te_steer_n") or 1)
    else:
        config["k"] = int(state.get("te_steer_k") or 1)
    model = str(state.get("te_steer_model") or "").strip()
    if model:
        config["model"] = model
    refused = fm.refused(db)
    if refused is not None:
        fm.set_errors(STEER, {field: f"Not queued: {refused}"})
        return
    try:
        auth.require(db, "launch_jobs")  # a login (and a maintainer) where one is needed
        with Store(db) as store:
            job_id = submit_steer(store, kind, config)
    except fm.submit_errors() as e:
        fm.set_errors(STEER, {field: fm.refusal(e)})
        return
    fm.set_errors(STEER, {})
    words = {"add_action": "add the branch", "search_here": f"{config.get('simulations')} simulations",
             "more_candidates": f"{config.get('k')} more candidates"}[kind]
    state["te_steer_flash"] = f"Queued job {job_id}: {words} at node {node} (progress below the tree)."
    state[STEER_QUEUED] = True  # the whole page reruns: the job's live panel is drawn below the tree
    if kind == "add_action":
        state["te_steer_action"] = ""


def steer_form(node: Node) -> None:
    """At the selected node: a human branch (a command or a composite action), "Search here" (N more
    simulations rooted here) and "More candidates" (K more proposals, ranked by the critic)."""
    why = auth.why_not("launch_jobs")
    with st.expander("Steer the search at this node", expanded=False):
        if node.terminal is not None:
            st.caption(f"This node is terminal ({md(node.terminal)}): nothing grows below it.")
            return
        if why:
            st.caption(why)
        with st.form(STEER, border=False):
            st.text_area("Action: a command, or a whole composite action (THOUGHT: / ACTION: / ...)",
                         key="te_steer_action", height=90, placeholder="e.g. get 1 oak log")
            fm.field_error(STEER, "action")
            st.form_submit_button("Add branch", on_click=_steer, args=("add_action", node.id), disabled=bool(why),
                                  help="Take this step in the env from this node's state and add it as a "
                                       "human-authored child, backed up by one rollout of the policy.")
            left, right = st.columns(2)
            left.number_input("Simulations N", 1, 10_000, 8, key="te_steer_n")
            with left:
                fm.field_error(STEER, "simulations")
                st.form_submit_button("Search here", on_click=_steer, args=("search_here", node.id),
                                      disabled=bool(why), help="N more simulations whose selection starts here; "
                                                               "every ancestor counts them too.")
            k = int(number(run.config.get("k", 4), 4))
            right.number_input("Candidates K", 1, 64, k if 1 <= k <= 64 else 4, key="te_steer_k")
            with right:
                fm.field_error(STEER, "k")
                st.form_submit_button("More candidates", on_click=_steer, args=("more_candidates", node.id),
                                      disabled=bool(why), help="K more proposals of the policy here, ranked by "
                                                               "the critic together with this node's children.")
            st.text_input("Model", key="te_steer_model", placeholder="(empty: the run's own)")
    flash = st.session_state.pop("te_steer_flash", None)
    if flash:
        st.success(flash)  # fixed words, ids and numbers


def _expand_all(tid: int) -> None:
    st.session_state.setdefault("te_collapsed", {}).pop(tid, None)


# Key columns narrow, texts wide (a reason squeezed to one letter beside numbers is unreadable); a cut text
# shows whole on hover.
NODE_COLUMNS = {
    "": st.column_config.TextColumn("", width=24), "node": st.column_config.NumberColumn("node", width=56),
    "step": st.column_config.NumberColumn("step", width=48), "rank": st.column_config.NumberColumn("rank", width=48),
    "command": st.column_config.TextColumn("command", width="medium", help="the node's ACTION (hover for all of it)"),
    "reason": st.column_config.TextColumn("reason", width="large", help="the critic's reason for its rank"),
}


def node_table(
    nodes: dict[int, Node], ids: Sequence[int], key: str,
    extra: dict[str, list] | None = None, columns: Sequence[str] | None = None,
) -> None:
    """A selectable table of nodes (`nodes`: the full nodes read, by id; plus `extra` columns, shown
    in `columns` order); choosing a row inspects that node."""
    shown = list(ids[:MAX_TABLE_ROWS])
    frame = pd.DataFrame([_row(nodes[i], alpha) for i in shown])
    for name, values in (extra or {}).items():
        frame[name] = values[:MAX_TABLE_ROWS]
    st.dataframe(
        frame, hide_index=True, key=key, on_select=partial(_picked_row, key, shown),
        selection_mode="single-row", height=min(38 + 35 * len(frame), 320), column_order=columns,
        column_config=NODE_COLUMNS,
    )
    if len(ids) > MAX_TABLE_ROWS:
        st.caption(f"first {MAX_TABLE_ROWS} of {len(ids)}")


def _row(n: Node, alpha: float) -> dict[str, object]:
    return {
        "node": n.id,
        "command": figures.short_command(n, 80),
        "N": n.N,
        "Q~": round(n.Q_mcts, 3) if n.N else None,  # no estimate before a visit
        "Q^": None if n.Q_critic is None else round(n.Q_critic, 3),
        "Q": round(n.value(alpha), 3) if n.N else None,
        "terminal": n.terminal or "",
    }


# --- sidebar: what to show -----------------------------------------------------------------------------

run_ids = [r.id for r in reversed(runs)]
run_names = {r.id: f"{r.name} · {r.id}" for r in runs}
st.session_state["te_run"] = run.id
st.session_state["te_task"] = task_id
running = run.status == "running"
task_labels = {s.task_id: overview.task_label(s, planned, running) for s in summaries}
with st.sidebar:
    st.selectbox("Run", run_ids, format_func=run_names.__getitem__, key="te_run", on_change=_pick_run)
    st.selectbox("Task", list(tree_of_task), key="te_task", on_change=_pick_task, format_func=task_labels.__getitem__,
                 help="✓ solved (a success leaf) · ✗ not solved · … being searched · · not started; then the "
                      "task's goal")
    if compare_with:
        st.session_state["te_compare"] = compare_run.id if compare_run is not None else NO_COMPARE
        st.selectbox("Compare with another run", [NO_COMPARE, *(r.id for r in compare_with)], key="te_compare",
                     on_change=_pick_compare, format_func=lambda i: "none" if i == NO_COMPARE else run_names[i],
                     help="Another run's tree of this task beside this one (below the tree): aligned by the "
                          "commands along each path, per-depth visits and successes, the two best paths and "
                          "the depth where they first part.")
    if revisions:
        st.session_state["te_revision"] = revision_id
        st.selectbox("Revision drawn on the tree", [NO_REVISION, *revision_of], key="te_revision",
                     on_change=_pick_revision,
                     format_func=lambda i: "none" if i == NO_REVISION else
                     f"{i} · t' node {revision_of[i].source.get('t_prime_node')} · {revision_of[i].status}",
                     help="An Agent-R revision of this tree (Trajectories page): its trained path (shared prefix "
                          "and good suffix) green, its bad steps through the first error t' red dashes, the "
                          "revision turn purple dots. Every revision's t' is ringed red.")
    measure_label = st.radio(
        "Colour by", list(tree_chart.MEASURES), key="te_measure",
        help=f"Q~: MCTS mean reward (eq. 8) · Q^: critic score · Q: eq. 10 with this run's alpha = {alpha} "
             "(grey where a node has no visit yet) · Outcome: the node's own end (success, failure, format error) "
             "or open",
    )
    search = st.text_input("Search actions", key="te_search", placeholder="e.g. craft stick")

st.title("Tree explorer")
for note in notes:
    st.warning(note)
if tree is None and run.status != "running":
    st.info("This task's tree has no committed nodes yet (the search has not reached it).")
    st.stop()

max_tree_depth = max(tree.depth) if tree is not None else 0
folded: set[int] = st.session_state.setdefault("te_collapsed", {}).get(tree_id, set())
with st.sidebar:
    depth_limit = max_tree_depth
    if max_tree_depth >= 2:  # a slider needs min < max
        depth_limit = st.slider("Show depth ≤", 1, max_tree_depth, max_tree_depth, key=f"te_depth_{tree_id}")
    st.session_state.setdefault("te_budget", lod.DEFAULT_BUDGET)
    st.selectbox("Draw at most", BUDGETS, key="te_budget",
                 format_func=lambda b: "all nodes" if b == 0 else f"{b:,} nodes", on_change=_pick_budget,
                 help="Big trees are drawn in part: the selected node's path and children, then the "
                      "most-visited subtrees. A hexagon stands for a hidden subtree; select it to draw it.")
    follow = run.status == "running" and st.toggle(
        "Follow the search live", value=True, key="te_follow",
        help=f"Redraw every {REFRESH_S:g} s while the run searches, keeping the selection, the filters "
             "and the zoom (double-click the plot for the full view); turn this off to hold the drawing still.")
    follow_run = bool(follow) and len(trees) > 1 and st.toggle(
        "Move on with the search", value=True, key="te_follow_run",
        help="When the tree you watch being searched is finished, open the next tree the search is on "
             "(the run overview shows them all).")
    if folded:
        st.caption(f"Collapsed below nodes {', '.join(str(i) for i in sorted(folded))}")
        st.button("Expand all", on_click=_expand_all, args=(tree_id,), key="te_expand_all")
    if tree is not None and st.toggle("Export this tree", key="te_export",
                                      help="JSON (orchard.tree/1) or GraphML, as `orchard export tree` writes "
                                           "them; the whole tree is read when this is on."):
        stem = f"{run.id}-{task_id}"
        for fmt, mime in (("json", "application/json"), ("graphml", "application/xml")):
            blob = data.tree_export(db, run.id, tree_id, fmt, version)
            if blob is not None:
                st.download_button(f"Download {fmt.upper()}", blob, file_name=f"{stem}.{fmt}", mime=mime,
                                   key=f"te_download_{fmt}", on_click="ignore")
    st.caption("Database")
    st.text(data.shown_db(path))

measure = tree_chart.MEASURES[measure_label]
chosen_revision = revision_of[revision_id].source if revision_id in revision_of else None
first_errors = {int(v) for v in (s.source.get("t_prime_node") for s in revisions)
                if isinstance(v, int) and not isinstance(v, bool)}
# At the slider's end: no limit, also when a live search grows the tree deeper than the slider knows.
max_depth = None if depth_limit >= max_tree_depth else int(depth_limit)
collapsed = tuple(sorted(folded))
budget = st.session_state.get("te_budget", lod.DEFAULT_BUDGET) or None


def progress_line(info: RunInfo) -> None:
    """The run's progress and success count (numbers from the store), a bar while it runs."""
    per_task = info.config.get("simulations")
    planned = per_task * len(info.task_ids) if isinstance(per_task, int) and per_task > 0 else 0
    text = f"run {md(info.status)} · {info.simulations} / {planned or '?'} simulations · " \
           f"{info.solved} / {info.trees} tasks solved"
    if info.status == "running" and planned:
        st.progress(min(1.0, info.simulations / planned), text=text)
    else:
        st.caption(text)


def run_overview(info: RunInfo, now: Sequence[Any], live: bool) -> None:
    """Every tree of the run as a tile (sized by nodes, coloured by outcome); a click opens that tree;
    while live, following the search moves on to the next tree when the one watched is finished."""
    states = [overview.outcome(s, planned, info.status == "running") for s in now]
    if live and follow_run:
        if any(s.task_id == task_id and overview.being_searched(s, planned, True) for s in now):
            st.session_state[SEEN_SEARCHING] = task_id
        elif st.session_state.get(SEEN_SEARCHING) == task_id:
            target = overview.follow_target(now, shown_task, planned, True)
            if target is not None:
                st.session_state[SEEN_SEARCHING] = target
                st.query_params.update(task=target, node="0")
                st.query_params.pop("revision", None)
                st.rerun()
    if len(now) < 2:
        return
    counts = {k: states.count(k) for k in overview.OUTCOME_COLORS if states.count(k)}
    label = f"Run overview: {len(now)} trees · " + " · ".join(f"{v} {k}" for k, v in counts.items())
    with st.expander(label, expanded=True):
        key = f"te_overview_{run.id}_{task_id}"  # a new chart per shown tree: any click is a new pick
        st.vega_lite_chart(overview.overview_rows(now, planned, info.status == "running", shown_task),
                           overview.overview_spec(len(now)), key=key, on_select=partial(_picked_tree, key),
                           selection_mode=overview.PICK, width="content")
        st.caption("One tile per tree in run order, sized by its nodes, coloured by its outcome; the ringed one "
                   "is shown below. Hover a tile for its task and goal, click it to open that tree.")


def explorer(live: bool) -> None:
    """Plot and inspector, drawn from the newest committed state of the tree. Always a fragment: a click
    in the plot, a row picked in a table or a typed node id reruns this only, not the sidebar and
    the app around it (and a timer reruns it while live)."""
    if st.session_state.pop(JUMP, False) or st.session_state.pop(STEER_QUEUED, False):
        st.rerun()  # a tile of the run overview was clicked (the page shows that tree), or a steering job queued
    version = data.db_version(path)
    info = run
    if live:
        info = next((r for r in data.list_runs(db, version) if r.id == run.id), run)
    now_folded = tuple(sorted(st.session_state.get("te_collapsed", {}).get(tree_id, set())))
    if (live and info.status != "running") or now_folded != collapsed:
        st.rerun()  # the search ended (stop refreshing) or the sidebar must show a new fold
    tree = data.load_shape(db, tree_id, version)
    progress_line(info)
    run_overview(info, data.tree_summaries(db, run.id, version) if live else summaries, live)
    if tree is None:
        st.info("This task's tree has no committed nodes yet (the search has not reached it).")
        return
    raw = st.query_params.get("node", "0")
    wanted = whole_number(raw)
    node_id = wanted if wanted is not None and wanted < len(tree) else 0
    if live:
        st.caption(f"Live: the search is running; this view redraws every {REFRESH_S:g} s "
                   f"(last {time.strftime('%H:%M:%S')}).")
    elif info.status == "running":
        st.caption("The search is running; live redrawing is off (sidebar).")
    st.caption("Goal")
    st.text(tree.goal)

    focus_of = st.session_state.setdefault("te_focus", {})
    focus = focus_of.get(tree_id)
    if budget is not None:
        opened = figures.cached_open(db, tree_id, version, max_depth, collapsed, budget, focus)
        if not lod.fully_shown(tree, opened, node_id, max_depth, folded):
            focus = focus_of[tree_id] = node_id  # draw the selected node's path, children and subtree
    query = search.strip()
    rows, datasets = tree_chart.cached_chart_data(db, tree_id, version, measure, alpha, max_depth, collapsed,
                                                  query, budget, focus)
    lay = figures.cached_layout(db, tree_id, version, max_depth, collapsed, budget, focus)
    matches = figures.cached_matches(db, tree_id, version, query)
    best = tree.best_path(alpha)
    successes = tree.terminal.count("success")

    plot_col, inspect_col = st.columns([3, 2], gap="medium")
    with plot_col:
        hidden = int(lay.hidden.sum())
        st.caption(
            f"{len(tree)} nodes ({len(lay)} shown) · {tree.simulations} simulations · "
            f"{successes} success leaves · {'solved' if tree.solved else 'not solved'} · "
            f"best path {len(best)} steps · click a node to inspect it"
            + (f" · {hidden} more in hexagons (select one to draw its subtree)" if hidden else "")
        )
        key = f"{PLOT}_{tree_id}"
        if (st.session_state.get(LAST_PICK) or (key,))[0] != key:
            # another tree's chart picked last: this one starts with no selection, so its first click
            # (of any node, the same id included) moves the inspector
            st.session_state.pop(LAST_PICK, None)
        datasets = {**datasets, **tree_chart.selection_data(rows, tree, node_id),  # the rows stay: Vega keeps them
                    **tree_chart.revision_data(rows, chosen_revision, first_errors)}
        width, height = tree_chart.chart_size(lay)
        spec = {**tree_chart.tree_spec(measure, height, width), "datasets": datasets}
        chart = partial(st.vega_lite_chart, rows, spec, key=key, on_select=partial(_clicked_node, key),
                        selection_mode=[tree_chart.PICK, tree_chart.ZOOM])
        if width is None:
            chart()
        else:  # a big tree: as wide as its leaves need, scrolled
            st.caption(f"{int(lay.x.max(initial=0)) + 1} leaf slots × {int(lay.y.max(initial=0)) + 1} depths: the "
                       f"chart is {width} × {height} px; scroll it (or lower 'Show depth ≤', collapse a subtree).")
            with st.container(height=min(height + 40, SCROLL_HEIGHT), key="te_scroll"):
                chart(width="content")
        if chosen_revision is not None:
            good, bad, t_node, split_node = tree_chart.splice_parts(chosen_revision)
            st.caption(f"Revision {md(revision_id)} on the tree: first error t' at node {md(t_node)}, revision turn "
                       f"back to node {split_node}, {len(good)} trained steps, {len(bad)} bad steps without loss.")
            if t_node is not None and t_node < len(tree):
                st.button("Inspect t'", key="te_inspect_t", on_click=_go_to, args=(int(t_node),))
        st.caption(tree_chart.LEGEND)
        if query:
            st.caption(f"{len(matches)} nodes match the search")
            if matches:
                shown = tuple(matches[:MAX_TABLE_ROWS])
                node_table(data.load_nodes(db, tree_id, shown, version), matches,
                           key=f"te_matches_{tree_id}_{node_id}")
    inspector(tree, node_id, best, inspect_col, version)


def inspector(tree: TreeColumns, node_id: int, best: list[int], inspect_col: Any, version: data.Version) -> None:
    """The selected node: values, composite action, observation, siblings, path, children. Only
    these nodes' texts are read from the store (`Store.load_nodes`), not the whole tree's."""
    parent = tree.parent[node_id]
    siblings = tree.children[parent] if parent is not None else []
    path_ids = [0, *tree.path(node_id)]
    children = tree.children[node_id]
    wanted = {node_id, *siblings[:MAX_TABLE_ROWS], *path_ids, *children[:MAX_TABLE_ROWS]}
    nodes = data.load_nodes(db, tree_id, tuple(sorted(wanted)), version)
    node = nodes[node_id]
    node.children = list(children)
    with inspect_col:
        st.session_state[NODE_INPUT] = str(node_id)  # the input always shows the node being inspected
        st.text_input("Node id", key=NODE_INPUT, on_change=_typed_node, args=(len(tree),))
        error = st.session_state.pop("te_node_error", None)
        if error:
            st.warning(error)

        st.subheader(f"Node {node.id}")
        terminal = node.terminal if node.terminal in TERMINALS else ("unknown" if node.terminal else "—")
        c = st.columns(3)  # three a row: a 6-digit visit count still fits beside the plot
        c[0].metric("N (visits)", node.N)
        c[1].metric("Q~ (MCTS)", f"{node.Q_mcts:.3f}" if node.N else "—")
        c[2].metric("Q^ (critic)", "—" if node.Q_critic is None else f"{node.Q_critic:.3f}")
        c = st.columns(3)
        c[0].metric("Q (eq. 10)", f"{node.value(alpha):.3f}" if node.N else "—")
        c[1].metric("reward", "—" if node.reward is None else f"{node.reward:g}")
        c[2].metric("progress", "—" if node.progress is None else f"{node.progress:.2f}")
        c = st.columns(3)
        c[0].metric("log-prob", "—" if node.logprob is None else f"{node.logprob:.2f}")
        c[1].metric("critic rank", "—" if node.critic_rank is None else node.critic_rank)
        st.caption(
            f"depth {node.depth} · terminal: {terminal} · {node.n_tokens} tokens · "
            f"generation {node.gen_ms:.0f} ms · env {node.env_ms:.0f} ms · "
            f"{'on' if node.id in best or node.id == 0 else 'off'} the best path"
        )
        if node.author == "human":
            st.caption("HUMAN-AUTHORED: a person added this step from the tree (teal square on the tree)")
        if node.children:
            label = "Expand subtree" if node.id in folded else "Collapse subtree"
            st.button(label, on_click=_toggle_collapse, args=(tree_id, node.id), key="te_collapse")
        steer_form(node)

        action = node.action
        if node.parent is None:
            st.caption("The root: the task's first observation, before any action.")
        elif action is None:
            st.caption("FORMAT ERROR (the completion could not be parsed; the environment was not stepped)")
            st.text(node.format_error or "")
        else:
            parts = [("PLAN", action.plan), ("THOUGHT", action.thought), ("ACTION", action.command),
                     ("EXPLANATION", action.explanation), ("STATUS", action.status)]
            for name, text in parts:
                if name == "PLAN" and not text:
                    continue
                st.caption(name)
                st.text(text or "")
        st.caption("OBSERVATION")
        st.text(node.observation)
        shot = data.node_screenshot(db, tree_id, node.id, version) if node.terminal else None
        if shot is not None:
            st.caption("SCREENSHOT of the final page")
            st.image(shot)
        if node.raw is not None:
            with st.expander("Raw completion", expanded=action is None):
                st.text(node.raw)

        if node.parent is not None:
            st.caption("Critic's ranking of this node and its siblings (0 = best)")
            ranks = tree.critic_rank
            siblings = sorted(siblings, key=lambda i: (ranks[i] is None, ranks[i] or 0, i))[:MAX_TABLE_ROWS]
            if parent is not None and len(siblings) < len(tree.children[parent]):
                nodes.update(data.load_nodes(db, tree_id, tuple(siblings), version))  # the first by rank
            node_table(
                nodes, siblings, key=f"te_siblings_{tree_id}_{node_id}",
                extra={
                    "": ["▶" if i == node.id else "" for i in siblings],
                    "rank": [ranks[i] for i in siblings],
                    "reason": [nodes[i].critic_reason or "" for i in siblings],
                },
                columns=["", "rank", "node", "command", "Q^", "reason", "N", "Q~", "Q", "terminal"],
            )
        st.caption("Path from the root")
        node_table(nodes, path_ids, key=f"te_path_{tree_id}_{node_id}", extra={"step": list(range(len(path_ids)))},
                   columns=["step", "node", "command", "N", "Q", "terminal"])
        if node.children:
            st.caption("Children")
            node_table(nodes, children, key=f"te_children_{tree_id}_{node_id}")


live = bool(follow)
st.fragment(run_every=REFRESH_S if live else None)(data.store_errors_shown(explorer))(live)
if compare_run is not None:
    other_tree = {t: i for i, t in data.tree_index(db, compare_run.id, version)}.get(shown_task)
    if other_tree is not None:
        tree_compare.section(db, version, run, compare_run, shown_task, tree_id, other_tree)
steer_job = jp.latest_job(db, STEER_KINDS, run.id) if data.has_data(path) else None
if steer_job is not None:  # the newest steering job of this run, live; the page reruns as each simulation lands
    st.subheader("Steering job")
    jp.job_panel(db, steer_job, "te_steer_job", follow=True)
