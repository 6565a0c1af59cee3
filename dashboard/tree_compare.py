"""The Tree explorer's "Compare with another run": the shown tree beside the same task's tree of a
second run (`?compare=RUN`), aligned by the path of commands (engine/search/compare_trees.py):
per-depth visits and successes of each, the two trees drawn side by side (each with its own best path
and the node where the best paths first part ringed), where they first part.

Commands are model text: they reach the page only in a data frame's cells; run and task ids go
through `md` where a caption names them, and plotly labels are escaped (figures.depth_success_figure).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from dashboard import data, figures, tree_chart
from dashboard.store import RunInfo
from dashboard.text import md
from engine.search.compare_trees import TreeComparison, compare_trees

FORMAT_ERROR = "(format error)"
CHART_HEIGHT = 360  # px: each side's tree chart, fitted to its column
CHART_BUDGET = 1000  # nodes drawn at most per side (dashboard.lod around the best path's end)
CHART_KEYS = {"A": "te_compare_tree_a", "B": "te_compare_tree_b"}
# the spec's description names its side: a chart without on_select has no element id to find it by
CHART_DESCRIPTION = "the compared trees, side {side}"
COLUMNS = {
    "A best command": st.column_config.TextColumn("A best command", width="medium",
                                                  help="the command of this run's best path (eq. 10) at this depth"),
    "B best command": st.column_config.TextColumn("B best command", width="medium",
                                                  help="the command of the compared run's best path at this depth"),
    "shared paths": st.column_config.NumberColumn("shared paths", help="command paths of this depth both trees hold"),
    "parted": st.column_config.TextColumn("parted", width="small",
                                          help="✓ from the first depth where the two best paths' commands differ"),
}


def candidates(runs: Sequence[RunInfo], run_id: str, task_id: str) -> list[RunInfo]:
    """The other runs that searched `task_id` (newest first): what the shown tree can be compared with."""
    return [r for r in reversed(runs) if r.id != run_id and task_id in r.task_ids]


@st.cache_data(show_spinner=False, max_entries=16)
def cached_comparison(path: str, tree_a: int, tree_b: int, version: data.Version, alpha_a: float,
                      alpha_b: float) -> TreeComparison | None:
    """The comparison of two stored trees (None while either has no committed node)."""
    a, b = data.load_tree(path, tree_a, version), data.load_tree(path, tree_b, version)
    if a is None or b is None:
        return None
    return compare_trees(a, b, alpha_a, alpha_b)


def _command(text: str | None) -> str:
    return FORMAT_ERROR if text is None else text


def depth_frame(c: TreeComparison) -> pd.DataFrame:
    """One row per depth: whether the best paths have parted by then (next to the depth: a wide table
    still shows it), each tree's visits and successes (and their rate), the paths both hold, and each
    best path's command."""
    def rate(s: int, n: int) -> float | None:
        return None if not n else round(s / n, 3)

    return pd.DataFrame([{
        "depth": r.depth, "parted": "✓" if r.parted else "", "A visits": r.a_visits, "A successes": r.a_successes,
        "A success rate": rate(r.a_successes, r.a_visits), "B visits": r.b_visits, "B successes": r.b_successes,
        "B success rate": rate(r.b_successes, r.b_visits), "shared paths": r.shared,
        "A best command": _command(r.a_best), "B best command": _command(r.b_best),
    } for r in c.rows])


def parting_node(best: Sequence[int], first_parting: int | None) -> int | None:
    """The node where the two best paths first part, on the path `best` (root's child first): the last
    node they share, at depth `first_parting` - 1 (0, the root, when they part at once); None when the
    paths take the same commands all the way."""
    if first_parting is None:
        return None
    return 0 if first_parting == 1 else best[first_parting - 2]


def tree_chart_column(path: str, version: data.Version, run: RunInfo, side: str, tree_id: int, alpha: float,
                      best: Sequence[int], ring: int | None) -> None:
    """One side's tree: the explorer's chart (`dashboard.tree_chart`, its best path under this run's
    alpha drawn thick), compact, in part for a big tree (`dashboard.lod` around the best path's end,
    so the whole best path is drawn), the parting node ringed as the explorer rings its selected node."""
    st.caption(f"{side} · {md(run.name)} · {md(run.id)}")
    focus = best[-1] if best else None
    rows, datasets = tree_chart.cached_chart_data(path, tree_id, version, "q", alpha, None, (), "", CHART_BUDGET,
                                                  focus)
    shape = data.load_shape(path, tree_id, version)
    if shape is None:
        return
    shown = len(rows)
    datasets = {**datasets, **tree_chart.selection_data(rows, shape, len(shape) if ring is None else ring)}
    spec = {**tree_chart.tree_spec("q", CHART_HEIGHT), "datasets": datasets,
            "description": CHART_DESCRIPTION.format(side=side)}
    st.vega_lite_chart(rows, spec, key=CHART_KEYS[side])
    st.caption(f"{len(shape)} nodes ({shown} shown) · best path {len(best)} steps"
               + ("" if ring is None else f" · ringed: node {ring}, where the best paths part"))


def section(path: str, version: data.Version, a: RunInfo, b: RunInfo, task_id: str, tree_a: int, tree_b: int) -> None:
    """The comparison below the explorer: caption, the two trees side by side, aligned table,
    per-depth success chart."""
    st.subheader("Compared with another run")
    alpha_a, alpha_b = float(a.config.get("alpha", 0.5)), float(b.config.get("alpha", 0.5))
    c = cached_comparison(path, tree_a, tree_b, version, alpha_a, alpha_b)
    if c is None:
        st.info("One of the two trees has no committed nodes yet.")
        return
    where = ("the best paths take the same commands all the way" if c.first_parting is None
             else f"the best paths first part at depth {c.first_parting}")
    st.caption(f"Task {md(task_id)}: A is this run ({md(a.id)}), B is run {md(b.id)}. Nodes are aligned by the "
               f"commands along their paths from the root: {c.matched} of A's nodes have a path B holds too; "
               f"{where}. Each best path is its own run's (eq. 10, its alpha).")
    for col, (side, run, tree_id, alpha, best) in zip(st.columns(2, gap="medium"), (
            ("A", a, tree_a, alpha_a, c.a_best), ("B", b, tree_b, alpha_b, c.b_best)), strict=True):
        with col:
            tree_chart_column(path, version, run, side, tree_id, alpha, best, parting_node(best, c.first_parting))
    frame = depth_frame(c)
    st.dataframe(frame, hide_index=True, key="te_compare_table", column_config=COLUMNS,
                 height=min(38 + 35 * len(frame), 420))
    rates = {f"A · {a.id}": list(frame["A success rate"]), f"B · {b.id}": list(frame["B success rate"])}
    st.plotly_chart(figures.depth_success_figure(list(frame["depth"]), rates, c.first_parting),
                    key="te_compare_chart", config={"displayModeBar": False})
