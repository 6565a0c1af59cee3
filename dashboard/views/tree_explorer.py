"""Tree explorer: one MCTS tree drawn whole, and an inspector for one node.

The URL holds run / task / node (`?run=..&task=..&node=..`), so a view can be shared. Every way of
choosing a node (a click in the plot, a typed id, a row in the path / sibling / children / search
tables) writes the `node` query parameter; the page reads it back. Env and model text is shown only
through `st.code` and data frames, never as markdown or HTML.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import pandas as pd
import streamlit as st

from dashboard import data, figures
from engine.search.tree import TERMINALS, Node, SearchTree

MAX_TABLE_ROWS = 500
NODE_INPUT = "te_node"
PLOT = "te_plot"

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
trees = data.tree_index(db, run.id, version)
if not trees:
    st.title("Tree explorer")
    st.info("This run has no tasks.")
    st.stop()
tree_of_task = {task: tree_id for tree_id, task in trees}
task_id = qp.get("task")
if task_id is not None and task_id not in tree_of_task:
    notes.append("The task named in the URL is not in this run; showing its first task.")
    task_id = None
task_id = task_id if task_id is not None else trees[0][1]
tree_id = tree_of_task[task_id]
tree: SearchTree | None = data.load_tree(db, tree_id, version)

node_id = 0
raw_node = qp.get("node")
if tree is not None and raw_node is not None:
    if raw_node.isdigit() and int(raw_node) < len(tree.nodes):
        node_id = int(raw_node)
    else:
        notes.append("The node named in the URL is not in this tree; showing the root.")
qp.update(run=run.id, task=task_id, node=str(node_id))  # the canonical, shareable URL
alpha = float(run.config.get("alpha", 0.5))


# --- callbacks: each writes the query parameters, the page reads them on the rerun ---------------------


def _go_to(node: int) -> None:
    st.query_params["node"] = str(node)
    st.session_state[NODE_INPUT] = str(node)


def _pick_run() -> None:
    st.query_params.clear()
    st.query_params["run"] = st.session_state["te_run"]


def _pick_task() -> None:
    st.query_params["task"] = st.session_state["te_task"]
    st.query_params["node"] = "0"


def _typed_node(n_nodes: int) -> None:
    text = (st.session_state.get(NODE_INPUT) or "").strip().lstrip("#")
    if text.isdigit() and int(text) < n_nodes:
        _go_to(int(text))
    else:
        st.session_state["te_node_error"] = f"No node {text!r} in this tree (ids 0..{n_nodes - 1})."


def _clicked_node() -> None:
    points = st.session_state[PLOT].selection.points
    if points:
        value = points[0].get("customdata")
        if isinstance(value, list):
            value = value[0]
        if value is not None:
            _go_to(int(value))


def _picked_row(key: str, ids: Sequence[int]) -> None:
    rows = st.session_state[key].selection.rows
    if rows:
        _go_to(int(ids[rows[0]]))


def _toggle_collapse(tid: int, node: int) -> None:
    folded = st.session_state.setdefault("te_collapsed", {}).setdefault(tid, set())
    folded.symmetric_difference_update({node})


def _expand_all(tid: int) -> None:
    st.session_state.setdefault("te_collapsed", {}).pop(tid, None)


def node_table(
    tree: SearchTree, ids: Sequence[int], key: str,
    extra: dict[str, list] | None = None, columns: Sequence[str] | None = None,
) -> None:
    """A selectable table of nodes (plus `extra` columns, shown in `columns` order); choosing a row
    inspects that node."""
    shown = list(ids[:MAX_TABLE_ROWS])
    frame = pd.DataFrame([_row(tree.nodes[i], alpha) for i in shown])
    for name, values in (extra or {}).items():
        frame[name] = values[:MAX_TABLE_ROWS]
    st.dataframe(
        frame, hide_index=True, key=key, on_select=partial(_picked_row, key, shown),
        selection_mode="single-row", height=min(38 + 35 * len(frame), 320), column_order=columns,
    )
    if len(ids) > MAX_TABLE_ROWS:
        st.caption(f"first {MAX_TABLE_ROWS} of {len(ids)}")


def _row(n: Node, alpha: float) -> dict[str, object]:
    return {
        "node": n.id,
        "command": figures.short_command(n, 80),
        "N": n.N,
        "Q~": round(n.Q_mcts, 3),
        "Q^": None if n.Q_critic is None else round(n.Q_critic, 3),
        "Q": round(n.value(alpha), 3),
        "terminal": n.terminal or "",
    }


# --- sidebar: what to show -----------------------------------------------------------------------------

run_ids = [r.id for r in reversed(runs)]
run_names = {r.id: f"{r.name} · {r.id}" for r in runs}
st.session_state["te_run"] = run.id
st.session_state["te_task"] = task_id
with st.sidebar:
    st.selectbox("Run", run_ids, format_func=run_names.__getitem__, key="te_run", on_change=_pick_run)
    st.selectbox("Task", list(tree_of_task), key="te_task", on_change=_pick_task)
    measure_label = st.radio(
        "Colour by", list(figures.MEASURES), key="te_measure",
        help=f"Q~: MCTS mean reward (eq. 8) · Q^: critic score · Q: eq. 10 with this run's alpha = {alpha}",
    )
    query = st.text_input("Search actions", key="te_search", placeholder="e.g. craft stick")

st.title("Tree explorer")
for note in notes:
    st.warning(note)
if tree is None:
    st.info("This task's tree has no committed nodes yet (the search has not reached it).")
    st.stop()

max_tree_depth = max(n.depth for n in tree.nodes)
folded: set[int] = st.session_state.setdefault("te_collapsed", {}).get(tree_id, set())
with st.sidebar:
    depth_limit = max_tree_depth
    if max_tree_depth >= 2:  # a slider needs min < max
        depth_limit = st.slider("Show depth ≤", 1, max_tree_depth, max_tree_depth, key=f"te_depth_{tree_id}")
    if folded:
        st.caption(f"Collapsed below nodes {', '.join(str(i) for i in sorted(folded))}")
        st.button("Expand all", on_click=_expand_all, args=(tree_id,), key="te_expand_all")
    st.caption("Database")
    st.code(db, language=None, wrap_lines=True)

st.caption("Goal")
st.code(tree.task.goal, language=None, wrap_lines=True)

measure = figures.MEASURES[measure_label]
max_depth = None if depth_limit >= max_tree_depth else int(depth_limit)
collapsed = tuple(sorted(folded))
fig = figures.cached_tree_figure(db, tree_id, version, measure, alpha, max_depth, collapsed, query.strip())
lay = figures.cached_layout(db, tree_id, version, max_depth, collapsed)
matches = figures.cached_matches(db, tree_id, version, query.strip())
best = tree.best_path(alpha)

plot_col, inspect_col = st.columns([3, 2], gap="medium")
with plot_col:
    st.caption(
        f"{len(tree.nodes)} nodes ({len(lay)} shown) · {len(tree.simulations)} simulations · "
        f"{'solved' if tree.solved() else 'not solved'} · best path {len(best)} steps · "
        "click a node to inspect it"
    )
    st.plotly_chart(
        fig, key=PLOT, on_select=_clicked_node, selection_mode="points",
        config={"scrollZoom": True, "displaylogo": False},
    )
    st.caption(figures.LEGEND)
    if query.strip():
        st.caption(f"{len(matches)} nodes match the search")
        if matches:
            node_table(tree, matches, key=f"te_matches_{tree_id}_{node_id}")

# --- inspector -------------------------------------------------------------------------------------------

node = tree.nodes[node_id]
with inspect_col:
    st.session_state[NODE_INPUT] = str(node_id)  # the input always shows the node being inspected
    st.text_input("Node id", key=NODE_INPUT, on_change=_typed_node, args=(len(tree.nodes),))
    error = st.session_state.pop("te_node_error", None)
    if error:
        st.warning(error)

    st.subheader(f"Node {node.id}")
    terminal = node.terminal if node.terminal in TERMINALS else ("unknown" if node.terminal else "—")
    c = st.columns(3)  # three a row: a 6-digit visit count still fits beside the plot
    c[0].metric("N (visits)", node.N)
    c[1].metric("Q~ (MCTS)", f"{node.Q_mcts:.3f}")
    c[2].metric("Q^ (critic)", "—" if node.Q_critic is None else f"{node.Q_critic:.3f}")
    c = st.columns(3)
    c[0].metric("Q (eq. 10)", f"{node.value(alpha):.3f}")
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
    if node.children:
        label = "Expand subtree" if node.id in folded else "Collapse subtree"
        st.button(label, on_click=_toggle_collapse, args=(tree_id, node.id), key="te_collapse")

    action = node.action
    if node.parent is None:
        st.caption("The root: the task's first observation, before any action.")
    elif action is None:
        st.caption("FORMAT ERROR (the completion could not be parsed; the environment was not stepped)")
        st.code(node.format_error or "", language=None, wrap_lines=True)
    else:
        parts = [("PLAN", action.plan), ("THOUGHT", action.thought), ("ACTION", action.command),
                 ("EXPLANATION", action.explanation), ("STATUS", action.status)]
        for name, text in parts:
            if name == "PLAN" and not text:
                continue
            st.caption(name)
            st.code(text or "", language=None, wrap_lines=True)
    st.caption("OBSERVATION")
    st.code(node.observation, language=None, wrap_lines=True)
    shot = data.node_screenshot(db, tree_id, node.id, version) if node.terminal else None
    if shot is not None:
        st.caption("SCREENSHOT of the final page")
        st.image(shot)
    if node.raw is not None:
        with st.expander("Raw completion", expanded=action is None):
            st.code(node.raw, language=None, wrap_lines=True)

    if node.parent is not None:
        st.caption("Critic's ranking of this node and its siblings (0 = best)")
        kin = tree.nodes  # a local: the lambda cannot see the module-level `tree` narrowed to SearchTree
        siblings = sorted(
            kin[node.parent].children,
            key=lambda i: (kin[i].critic_rank is None, kin[i].critic_rank or 0, i),
        )
        node_table(
            tree, siblings, key=f"te_siblings_{tree_id}_{node_id}",
            extra={
                "": ["▶" if i == node.id else "" for i in siblings],
                "rank": [tree.nodes[i].critic_rank for i in siblings],
                "reason": [tree.nodes[i].critic_reason or "" for i in siblings],
            },
            columns=["", "rank", "node", "command", "Q^", "reason", "N", "Q~", "Q", "terminal"],
        )
    st.caption("Path from the root")
    path_ids = [0, *(n.id for n in tree.path(node))]
    node_table(tree, path_ids, key=f"te_path_{tree_id}_{node_id}", extra={"step": list(range(len(path_ids)))},
               columns=["step", "node", "command", "N", "Q", "terminal"])
    if node.children:
        st.caption("Children")
        node_table(tree, node.children, key=f"te_children_{tree_id}_{node_id}")
