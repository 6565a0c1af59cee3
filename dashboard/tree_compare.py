"""The Tree explorer's "Compare with another run": the shown tree beside the same task's tree of a
second run (`?compare=RUN`), aligned by the path of commands (engine/search/compare_trees.py):
per-depth visits and successes of each, the two best paths side by side, where they first part.

Commands are model text: they reach the page only in a data frame's cells; run and task ids go
through `md` where a caption names them, and plotly labels are escaped (figures.depth_success_figure).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from dashboard import data, figures
from dashboard.text import md
from engine.search.compare_trees import TreeComparison, compare_trees
from engine.store import RunInfo

FORMAT_ERROR = "(format error)"
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


def section(path: str, version: data.Version, a: RunInfo, b: RunInfo, task_id: str, tree_a: int, tree_b: int) -> None:
    """The comparison below the explorer: caption, aligned table, per-depth success chart."""
    st.subheader("Compared with another run")
    c = cached_comparison(path, tree_a, tree_b, version, float(a.config.get("alpha", 0.5)),
                          float(b.config.get("alpha", 0.5)))
    if c is None:
        st.info("One of the two trees has no committed nodes yet.")
        return
    where = ("the best paths take the same commands all the way" if c.first_parting is None
             else f"the best paths first part at depth {c.first_parting}")
    st.caption(f"Task {md(task_id)}: A is this run ({md(a.id)}), B is run {md(b.id)}. Nodes are aligned by the "
               f"commands along their paths from the root: {c.matched} of A's nodes have a path B holds too; "
               f"{where}. Each best path is its own run's (eq. 10, its alpha).")
    frame = depth_frame(c)
    st.dataframe(frame, hide_index=True, key="te_compare_table", column_config=COLUMNS,
                 height=min(38 + 35 * len(frame), 420))
    rates = {f"A · {a.id}": list(frame["A success rate"]), f"B · {b.id}": list(frame["B success rate"])}
    st.plotly_chart(figures.depth_success_figure(list(frame["depth"]), rates, c.first_parting),
                    key="te_compare_chart", config={"displayModeBar": False})
