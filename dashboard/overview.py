"""The run overview: every tree of a run at a glance (a Vega-Lite chart of tiles), and which tree a live
view follows.

Why: a run searches tens to hundreds of tasks; the task picker alone shows one at a time. A tile per
tree, sized by its nodes and coloured by its outcome (solved / not solved / searching / not started),
shows where the run stands and which trees to open; a click opens that tree. The tiles are laid out in
run order, row by row. Task ids and goals come from the env (untrusted): they are shown only in the
chart's hover (Vega's tooltip handler escapes them) and in plain-text option labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dashboard.store import TreeSummary

PICK = "tree"  # the point selection: a click names a tree (its "task" field)
OUTCOME_COLORS = {"solved": "#2e7d32", "not solved": "#c62828", "searching": "#1e88e5", "not started": "#cfd8dc"}
SELECTED_COLOR = "#ff6f00"
GOAL_CHARS = 70  # of a goal in a picker label


def being_searched(s: TreeSummary, planned: int | None, running: bool) -> bool:
    """The run runs and this tree has nodes and fewer simulations than planned (solved or not)."""
    return running and s.nodes > 0 and (planned is None or s.simulations < planned)


def outcome(s: TreeSummary, planned: int | None, running: bool) -> str:
    """One tree's state in a run: solved (a success leaf), not started (no node yet), searching (the run
    runs and the tree has fewer simulations than planned), else not solved."""
    if s.solved:
        return "solved"
    if s.nodes == 0:
        return "not started"
    if being_searched(s, planned, running):
        return "searching"
    return "not solved"


MARKS = {"solved": "✓", "not solved": "✗", "searching": "…", "not started": "·"}


def task_label(s: TreeSummary, planned: int | None, running: bool) -> str:
    """The task picker's label: solved mark, task id, goal (one line, shortened). Plain text: selectbox
    options are not Markdown."""
    goal = " ".join(s.goal.split())
    goal = goal if len(goal) <= GOAL_CHARS else goal[: GOAL_CHARS - 1] + "…"
    return f"{MARKS[outcome(s, planned, running)]} {s.task_id} — {goal}" if goal else \
        f"{MARKS[outcome(s, planned, running)]} {s.task_id}"


def follow_target(summaries: Sequence[TreeSummary], current: str, planned: int | None, running: bool) -> str | None:
    """The tree a live view should move to: while the followed tree is finished (or not started) and
    another one is being searched, the first such one in run order; else None (stay)."""
    searched = {s.task_id: being_searched(s, planned, running) for s in summaries}
    if searched.get(current):
        return None
    return next((s.task_id for s in summaries if searched[s.task_id] and s.task_id != current), None)


def columns_for(n: int) -> int:
    """Tiles per row: a near-square grid, at most 32 wide."""
    return max(1, min(32, math.ceil(math.sqrt(n * 2))))


def cell_px(n: int) -> int:
    return 44 if n <= 64 else 30 if n <= 256 else 22


def overview_rows(summaries: Sequence[TreeSummary], planned: int | None, running: bool, current: str) -> pd.DataFrame:
    """One row per tree: its grid cell, tile area (sqrt of its nodes against the biggest tree's),
    outcome, hover text, and whether it is the tree shown."""
    n = len(summaries)
    cols, cell = columns_for(n), cell_px(n)
    biggest = max((s.nodes for s in summaries), default=0) or 1
    side = [cell * (0.3 + 0.6 * math.sqrt(s.nodes / biggest)) for s in summaries]
    states = [outcome(s, planned, running) for s in summaries]
    return pd.DataFrame({
        "task": [s.task_id for s in summaries],
        "col": [i % cols for i in range(n)],
        "row": [i // cols for i in range(n)],
        "area": [a * a for a in side],
        "ring": [(a + 8) ** 2 for a in side],
        "outcome": states,
        "goal": [" ".join(s.goal.split())[:200] for s in summaries],
        "facts": [f"{s.nodes} nodes · {s.simulations}{f' / {planned}' if planned else ''} simulations · "
                  f"{s.successes} success leaves · depth {s.max_depth}" for s in summaries],
        "current": [s.task_id == current for s in summaries],
    })


def overview_spec(n: int) -> dict[str, Any]:
    """The overview chart for `n` trees (its size follows the grid)."""
    cols, cell = columns_for(n), cell_px(n)
    rows = max(1, math.ceil(n / cols))
    x = {"field": "col", "type": "quantitative", "axis": None, "scale": {"domain": [-0.5, cols - 0.5]}}
    y = {"field": "row", "type": "quantitative", "axis": None, "scale": {"domain": [rows - 0.5, -0.5]}}
    return {
        "width": cols * cell, "height": rows * cell,
        "autosize": {"type": "pad"},
        "config": {"view": {"stroke": None}, "aria": False},
        "usermeta": {"embedOptions": {"renderer": "canvas"}},
        "layer": [
            {"transform": [{"filter": "datum.current"}],
             "mark": {"type": "point", "shape": "square", "filled": False, "color": SELECTED_COLOR, "strokeWidth": 3},
             "encoding": {"x": x, "y": y, "size": {"field": "ring", "type": "quantitative", "scale": None}}},
            {"name": "tiles",
             "params": [{"name": PICK, "select": {"type": "point", "fields": ["task"], "on": "click", "clear": False,
                                                  "toggle": False}}],
             "mark": {"type": "point", "shape": "square", "filled": True, "opacity": 1, "stroke": "#455a64",
                      "strokeWidth": 0.5, "cursor": "pointer"},
             "encoding": {
                 "x": x, "y": y,
                 "size": {"field": "area", "type": "quantitative", "scale": None},
                 "color": {"field": "outcome", "type": "nominal", "title": "tree",
                           "scale": {"domain": list(OUTCOME_COLORS), "range": list(OUTCOME_COLORS.values())},
                           "legend": {"orient": "right"}},
                 "tooltip": [{"field": "task", "type": "nominal"}, {"field": "goal", "type": "nominal"},
                             {"field": "outcome", "type": "nominal"}, {"field": "facts", "title": "counts",
                                                                       "type": "nominal"}],
             }},
        ],
    }


def picked_task(state: Any) -> str | None:
    """The task a click selected, from the chart's selection state (`{PICK: [{"task": ...}]}`)."""
    points = (state or {}).get(PICK) if isinstance(state, Mapping) else None
    if not isinstance(points, list) or not points or not isinstance(points[0], Mapping):
        return None
    value = points[0].get("task")
    return value if isinstance(value, str) else None
