"""The Tree explorer's tree as a Vega-Lite chart (`st.vega_lite_chart`): a constant spec, data in a table.

WHY Vega-Lite, not plotly: measured in headless Chromium (docs/decisions.md, "The Tree explorer draws
with Vega-Lite"), plotly.js alone costs seconds to boot and draw on this host whatever the figure;
Vega draws the same ~3000 marks on a canvas in a fraction of that. WHY a constant spec: Streamlit
keys a keyed chart by its key, and re-embeds the Vega view only when the spec changes; when only the
data changes it swaps the rows in the running view, so a live redraw (new nodes, new visit counts, a
new selected node) keeps the zoom and pan (`bind: "scales"`) without any script of ours. So nothing
that depends on the tree goes into the spec: the spec depends on the measure's label only.

Rows: one per drawn node, with its position, its parent's position (the edge), its colour value,
marker area, kind (shape) and its hover fields: the chart's main data. The few rows that one layer
each draws (the best path's edges, the search matches' rings, the "+n" labels; the selected node's
ring and its path's edges) go as small named datasets (`chart_data`, `selection_data`). WHY: on a
rerun Streamlit compares each dataset's Arrow bytes with the last ones and leaves an unchanged one
alone in the Vega view, so a click (a new selected node) replaces a few rows, not every node's
(measured: docs/decisions.md, "The Tree explorer answers a click in a fragment"); and no layer runs
a filter over all the rows. Hover text is shown by Vega's tooltip handler, which escapes `&` and
`<` before writing it (vega-tooltip's `sanitize`), so model and env text is shown as text: it must
not be escaped here (it would show `&lt;`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import data, figures
from dashboard.figures import short_command
from dashboard.layout import TreeLayout
from engine.tree_columns import TreeColumns
from engine.tree_nodes import SearchTree

PICK = "pick"  # the point selection: a click names a node (its "id" field)
ZOOM = "zoom"  # the interval selection bound to the scales: wheel zoom, drag pan, double-click resets
MEASURES: dict[str, str] = {  # label shown in the UI -> key
    "Q (eq. 10)": "q",
    "Q~ (MCTS mean)": "q_mcts",
    "Q^ (critic)": "q_critic",
    "Outcome": "outcome",  # success / failure / open / format error: the node's own end, no estimate
}
# WHY an outcome colouring and grey for N = 0: Q~ of a node never visited is no estimate (the engine keeps 0
# there for selection), and drawn on the value scale it showed an unvisited success leaf dark red, as a failure.
OUTCOMES = {"success": "success", "failure": "failure", "depth_limit": "failure", "stopped": "failure",
            "format_error": "format error"}  # terminal status -> outcome; anything else is "open"
OUTCOME_COLORS = {"success": "#2e7d32", "failure": "#c62828", "open": "#90a4ae", "format error": "#8e24aa"}
# Marker shape per kind (terminal status, or "hidden": a node standing for a hidden subtree).
STAR = ("M0,-1L0.2245,-0.309L0.9511,-0.309L0.3633,0.118L0.5878,0.809L0,0.382L-0.5878,0.809"
        "L-0.3633,0.118L-0.9511,-0.309L-0.2245,-0.309Z")
HEXAGON = "M0,-1L0.866,-0.5L0.866,0.5L0,1L-0.866,0.5L-0.866,-0.5Z"
X_MARK = ("M-1,-0.7L-0.7,-1L0,-0.3L0.7,-1L1,-0.7L0.3,0L1,0.7L0.7,1L0,0.3L-0.7,1L-1,0.7L-0.3,0Z")
SHAPES: dict[str, str] = {
    "open": "circle",  # inner node or unfinished leaf
    "success": STAR,
    "failure": X_MARK,
    "format_error": "diamond",
    "depth_limit": "square",
    "stopped": "triangle-down",
    "hidden": HEXAGON,
}
MAX_COUNT_LABELS = 100  # "+n" labels drawn beside the hidden subtrees that hide the most
LEGEND = (
    "circle: open or inner node · star: success · x: failure · diamond: format error · "
    "square: depth limit · triangle: stopped (STATUS ≠ CONTINUE) · hexagon: has hidden descendants "
    "(+count; click it to draw its subtree) · size: visits N · grey: no value (Q^ of the root; Q~ and Q of a "
    "node not visited yet, N = 0: shown as —) · "
    "blue line: best path (eq. 10) · orange: the selected node and its path · magenta ring: search match · "
    "teal square: a human-authored node (added from the tree) · "
    "red ring t': a revision's first error · green line: the revision's trained path (prefix and good suffix), "
    "red dashes: its bad steps through t' (no loss), purple dots: the revision turn back to the split · "
    "wheel: zoom, drag: pan, double-click: full view"
)
BEST_COLOR = "#1565c0"
SELECTED_COLOR = "#ff6f00"
MATCH_COLOR = "#d500f9"
HUMAN_COLOR = "#00897b"
EDGE_COLOR = "#b0b0b0"
NO_VALUE_COLOR = "#bdbdbd"
FIRST_ERROR_COLOR = "#d50000"
SPLICE_GOOD_COLOR = "#2e7d32"
SPLICE_BAD_COLOR = "#c62828"
JUMP_COLOR = "#6a1b9a"
# A big tree's chart grows with its leaves (and depth) and scrolls, instead of squeezing into the column:
# at 255 nodes a fitted chart drew depths 3-4 as one band of markers. Px per leaf slot / depth level, the
# width capped so that a canvas at device pixel ratio 2 stays under Chromium's 32767 px.
FIT_WIDTH = 720  # about the plot column's width on a wide page; narrower layouts fit the column
SLOT_PX = 14.0
LEVEL_PX = 64
MAX_WIDTH = 16_000
FIT_HEIGHT = 640
MAX_HEIGHT = 2_400
# (field, title) shown on hover, in this order. The numbers go as one line ("facts"): each column of the
# chart's rows costs the browser a decoding pass over every row (measured: docs/decisions.md, "The Tree
# explorer answers a click in a fragment").
HOVER = [("id", "node"), ("command", "command"), ("facts", "values")]
HOVER_ONLY = ["depth", "N", "terminal", "hidden"]  # in `tree_rows` for tests and tables; not sent


def _fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}"


def tree_rows(
    tree: SearchTree | TreeColumns,
    lay: TreeLayout,
    measure: str = "q",
    alpha: float = 0.5,
    best_path: Sequence[int] = (),
    matches: Collection[int] = (),
    commands: Mapping[int, str] | None = None,
    human: Collection[int] = (),
) -> pd.DataFrame:
    """One row per drawn node (`lay`), everything but the selection (`selection_data`). `commands`: the
    drawn nodes' one-line commands (`figures.short_command`), for hover; a TreeColumns has no texts.
    `human`: ids of the human-authored nodes (a teal square around each; "human" on hover)."""
    if measure not in MEASURES.values():
        raise ValueError(f"unknown measure {measure!r} (one of {', '.join(MEASURES.values())})")
    if commands is None:
        commands = {} if isinstance(tree, TreeColumns) else {int(v): short_command(tree.nodes[v]) for v in lay.ids}
    shape = TreeColumns.from_tree(tree)
    ids = lay.ids
    x, y = lay.x.astype(np.float64), -lay.y.astype(np.float64)  # root on top
    par = np.where(lay.parent_index >= 0, lay.parent_index, np.arange(len(ids)))  # the root: a null edge
    q_mcts = shape.q_mcts(ids)
    q_critic = np.asarray(shape.q_critic, dtype=np.float64)[ids]
    q = shape.value(alpha, ids)
    visits = np.asarray(shape.N, dtype=np.float64)[ids]
    unvisited = visits == 0
    q_mcts = np.where(unvisited, np.nan, q_mcts)  # no estimate before a visit: "—" and grey, not 0 (red)
    q = np.where(unvisited, np.nan, q)
    values = {"q": q, "q_mcts": q_mcts, "q_critic": q_critic, "outcome": np.full(len(ids), np.nan)}[measure]
    small, extra = (6.0, 13.0) if len(ids) <= 2000 else (4.5, 9.0)  # diameter, px: big trees smaller
    diameter = small + extra * np.sqrt(visits / max(1.0, float(visits.max(initial=0.0))))
    id_list = ids.tolist()
    terminal = [shape.terminal[v] or "" for v in id_list]
    hidden = lay.hidden
    kind = ["hidden" if h else (t if t in SHAPES else "open") for t, h in zip(terminal, hidden.tolist())]
    counted = np.flatnonzero(hidden)
    if len(counted) > MAX_COUNT_LABELS:  # text is drawn per label: the biggest hidden subtrees only
        counted = counted[np.argsort(-hidden[counted], kind="stable")[:MAX_COUNT_LABELS]]
    count_label = np.full(len(ids), "", dtype=object)
    count_label[counted] = [f"+{h}" for h in hidden[counted].tolist()]
    on_best = np.isin(ids, np.asarray([0, *best_path], dtype=np.int64))
    by_human = np.isin(ids, np.asarray(sorted(human), dtype=np.int64))
    rows = pd.DataFrame({
        "id": ids.astype(np.int64),
        "x": x, "y": y, "px": x[par], "py": y[par],
        "value": np.where(np.isnan(values), None, values),  # null: drawn grey
        # The colour's field: never null, as Vega-Lite drops a mark whose continuous field is null or NaN
        # (an unvisited node would vanish from the tree); the colour condition on `value` paints it grey.
        "shade": np.where(np.isnan(values), 0.0, values),
        "area": diameter ** 2,
        "ring": _ring(diameter),
        "kind": kind,
        "best": on_best & on_best[par] & (lay.parent_index >= 0),  # an edge of the best path ends here
        "match": np.isin(ids, np.asarray(sorted(matches), dtype=np.int64)),
        "human": by_human,
        "count_label": count_label,
        "depth": [shape.depth[v] for v in id_list],
        "command": [commands.get(v, "") for v in id_list],
        "N": [shape.N[v] for v in id_list],
        "terminal": terminal,
        "hidden": hidden.astype(np.int64),
        "facts": [_facts(*f) for f in zip(
            (shape.depth[v] for v in id_list), (shape.N[v] for v in id_list), q_mcts.tolist(),
            q_critic.tolist(), q.tolist(), terminal, hidden.tolist(), by_human.tolist())],
    })
    if measure == "outcome":
        rows["outcome"] = [OUTCOMES.get(t, "open") for t in terminal]
    return rows


def _facts(depth: int, visits: int, q_mcts: float, q_critic: float, q: float, terminal: str, hidden: int,
           human: bool = False) -> str:
    """A node's numbers on one hover line (`terminal`, the hidden count and "human" only when there are any)."""
    out = f"depth {depth} · N {visits} · Q~ {_fmt(q_mcts)} · Q^ {_fmt(q_critic)} · Q {_fmt(q)}"
    return (out + (f" · {terminal}" if terminal else "") + (f" · {hidden} hidden below" if hidden else "")
            + (" · human" if human else ""))


SUBSETS = ("best", "match", "human", "labels")  # named datasets cut from the rows (`chart_data`)
SELECTION = ("path", "selected")  # named datasets of the selected node (`selection_data`)
REVISION = ("splice_good", "splice_bad", "jump", "first_error")  # a revision on the tree (`revision_data`)
EDGE_FIELDS = ["x", "y", "px", "py"]
RING_FIELDS = ["x", "y", "ring"]


def chart_data(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """`rows` (`tree_rows`) split for the chart: every node's marker, edge and hover fields (the chart's
    data, with `area` for the rings of `selection_data`), and the named datasets of `SUBSETS`: the best
    path's edges, the search matches' rings and the "+n" labels, only the fields their layer draws."""
    main = rows.drop(columns=["best", "match", "human", "count_label", "ring", *HOVER_ONLY])
    subsets = {
        "best": rows.loc[rows["best"], EDGE_FIELDS],
        "match": rows.loc[rows["match"], RING_FIELDS],
        "human": rows.loc[rows["human"], RING_FIELDS],
        "labels": rows.loc[rows["count_label"] != "", ["x", "y", "count_label"]],
    }
    return main, {name: frame.reset_index(drop=True) for name, frame in subsets.items()}


def selection_data(main: pd.DataFrame, tree: TreeColumns, node: int) -> dict[str, pd.DataFrame]:
    """The named datasets of `SELECTION`: the edges into the selected node's path from the root (drawn
    orange) and its ring, from `main` (`chart_data`); empty when the node is not drawn."""
    path = np.asarray([0, *tree.path(node)], dtype=np.int64) if node < len(tree) else np.zeros(1, np.int64)
    ids = main["id"].to_numpy()
    selected = main.loc[ids == node, ["x", "y", "area"]]
    return {
        "path": main.loc[np.isin(ids, path[1:]), EDGE_FIELDS].reset_index(drop=True),  # not the root's
        "selected": pd.DataFrame({"x": selected["x"].to_numpy(), "y": selected["y"].to_numpy(),
                                  "ring": _ring(np.sqrt(selected["area"].to_numpy()))}),
    }


def node_ids(value: Any) -> list[int]:
    """Node ids from a sample's source (imported data may hold anything): the ints, in order."""
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def splice_parts(source: Mapping[str, Any]) -> tuple[list[int], list[int], int | None, int]:
    """A revision sample's splice on its tree (docs/algorithms.md §4): (trained path: the shared prefix
    and the good suffix, bad steps through t' (no loss), t' node, the split's node: where the revision
    turn goes back to)."""
    good, bad = node_ids(source.get("good_path")), node_ids(source.get("bad_path"))
    split = next((i for i, (g, b) in enumerate(zip(good, bad)) if g != b), min(len(good), len(bad)))
    t = source.get("t_prime")
    t_node = source.get("t_prime_node")
    t_node = t_node if isinstance(t_node, int) and not isinstance(t_node, bool) else None
    through = split + t + 1 if isinstance(t, int) and not isinstance(t, bool) and t >= 0 else len(bad)
    return good, bad[split:through], t_node, good[split - 1] if split else 0


def revision_data(main: pd.DataFrame, source: Mapping[str, Any] | None,
                  first_errors: Collection[int] = ()) -> dict[str, pd.DataFrame]:
    """The named datasets of `REVISION`, from the drawn rows `main` (`chart_data`): the chosen revision's
    trained edges, its bad edges through t' and the revision turn (a line from t' back to the split's
    node), and a ring with "t'" at each first error of the tree's revisions (`first_errors`, node ids).
    A node that is not drawn (level of detail, depth limit) is left out."""
    ids = main["id"].to_numpy()
    empty_edges = main.iloc[:0][EDGE_FIELDS].reset_index(drop=True)
    good: list[int] = []
    bad: list[int] = []
    jump = empty_edges
    if source is not None:
        good, bad, t_node, split_node = splice_parts(source)
        at = {int(v): i for i, v in enumerate(ids.tolist())}
        if t_node in at and split_node in at:
            a, b = main.iloc[at[t_node]], main.iloc[at[split_node]]
            jump = pd.DataFrame({"x": [a["x"]], "y": [a["y"]], "px": [b["x"]], "py": [b["y"]]})
    errors = main.loc[np.isin(ids, np.asarray(sorted(first_errors), dtype=np.int64)), ["x", "y", "area"]]
    return {
        "splice_good": main.loc[np.isin(ids, np.asarray(good, dtype=np.int64)), EDGE_FIELDS].reset_index(drop=True),
        "splice_bad": main.loc[np.isin(ids, np.asarray(bad, dtype=np.int64)), EDGE_FIELDS].reset_index(drop=True),
        "jump": jump,
        "first_error": pd.DataFrame({"x": errors["x"].to_numpy(), "y": errors["y"].to_numpy(),
                                     "ring": _ring(np.sqrt(errors["area"].to_numpy()) + 6),
                                     "label": ["t'"] * len(errors)}),
    }


def chart_size(lay: TreeLayout) -> tuple[int | None, int]:
    """(width, height) in px of the chart of `lay`: None (fit the column) and the standard height while
    the tree's leaves fit the column at SLOT_PX each; else wide enough for every leaf slot and tall
    enough for every depth, in steps of about 19 % (2^(1/4)) so that a growing tree's chart is rebuilt
    (which resets the zoom) only now and then."""
    slots = float(lay.x.max(initial=0.0)) + 1.0
    levels = float(lay.y.max(initial=0.0)) + 1.0
    if slots * SLOT_PX <= FIT_WIDTH and levels * LEVEL_PX <= FIT_HEIGHT:
        return None, FIT_HEIGHT

    def step(px: float) -> float:
        return 2.0 ** (math.ceil(4 * math.log2(max(px, 1.0))) / 4)

    width = int(min(MAX_WIDTH, max(FIT_WIDTH, step(slots * SLOT_PX))))
    height = int(min(MAX_HEIGHT, max(FIT_HEIGHT, step(levels * LEVEL_PX))))
    return width, height


def _ring(diameter: np.ndarray) -> np.ndarray:
    """The area of the ring around a match or the selected node: clear of a marker of `diameter` px."""
    return (diameter + 10) ** 2


def tree_spec(measure: str = "q", height: int = FIT_HEIGHT, width: int | None = None) -> dict[str, Any]:
    """The chart's spec: the same for every tree and every redraw (only the measure names the legend, and
    a big tree's size, `chart_size`, sets width and height). The layers of `SUBSETS`, `SELECTION` and
    `REVISION` draw the named dataset of their name; the page adds them (`"datasets"`), which Streamlit
    sends beside the spec, not in it. `width` None: fit the column; a number: that wide (the page puts
    the chart in a scrolling container)."""
    label = next(k for k, v in MEASURES.items() if v == measure)
    color: dict[str, Any] = {"condition": {"test": "datum.value === null", "value": NO_VALUE_COLOR},
                             "field": "shade", "type": "quantitative", "title": label,
                             "scale": {"scheme": "redyellowgreen", "domain": [0, 1]},
                             "legend": {"gradientLength": 200, "gradientThickness": 12}}
    if measure == "outcome":
        color = {"field": "outcome", "type": "nominal", "title": label,
                 "scale": {"domain": list(OUTCOME_COLORS), "range": list(OUTCOME_COLORS.values())}}
    x = {"field": "x", "type": "quantitative", "axis": None, "scale": {"zero": False, "nice": False, "padding": 12}}
    y = {"field": "y", "type": "quantitative", "axis": None, "scale": {"zero": False, "nice": False, "padding": 12}}
    edge = {"x": x, "y": y, "x2": {"field": "px"}, "y2": {"field": "py"}}
    ring = {"field": "ring", "type": "quantitative", "scale": None}
    size: dict[str, Any] = ({"height": height, "autosize": {"type": "fit", "contains": "padding"}} if width is None
                            else {"height": height, "width": width, "autosize": {"type": "pad"}})
    return {
        **size,
        "config": {"view": {"stroke": None}, "aria": False},  # no ARIA attributes per mark
        "usermeta": {"embedOptions": {"renderer": "canvas"}},  # Streamlit picks SVG under 2000 rows: slower
        "layer": [
            {"mark": {"type": "rule", "color": EDGE_COLOR, "strokeWidth": 1}, "encoding": edge},
            {"data": {"name": "best"},
             "mark": {"type": "rule", "color": BEST_COLOR, "strokeWidth": 4}, "encoding": edge},
            {"name": "splice_good", "data": {"name": "splice_good"},
             "mark": {"type": "rule", "color": SPLICE_GOOD_COLOR, "strokeWidth": 6, "opacity": 0.55},
             "encoding": edge},
            {"name": "splice_bad", "data": {"name": "splice_bad"},
             "mark": {"type": "rule", "color": SPLICE_BAD_COLOR, "strokeWidth": 5, "strokeDash": [6, 4],
                      "opacity": 0.8}, "encoding": edge},
            {"name": "jump", "data": {"name": "jump"},
             "mark": {"type": "rule", "color": JUMP_COLOR, "strokeWidth": 2.5, "strokeDash": [2, 3]},
             "encoding": edge},
            {"data": {"name": "path"},
             "mark": {"type": "rule", "color": SELECTED_COLOR, "strokeWidth": 2.5}, "encoding": edge},
            {"name": "first_error", "data": {"name": "first_error"},
             "mark": {"type": "point", "shape": "circle", "filled": False, "color": FIRST_ERROR_COLOR,
                      "strokeWidth": 3}, "encoding": {"x": x, "y": y, "size": ring}},
            {"name": "first_error_label", "data": {"name": "first_error"},
             "mark": {"type": "text", "dx": 9, "dy": -9, "fontSize": 12, "fontWeight": "bold",
                      "color": FIRST_ERROR_COLOR, "align": "left"},
             "encoding": {"x": x, "y": y, "text": {"field": "label"}}},
            {"name": "human", "data": {"name": "human"},
             "mark": {"type": "point", "shape": "square", "filled": False, "color": HUMAN_COLOR, "strokeWidth": 2.5},
             "encoding": {"x": x, "y": y, "size": ring}},
            {"data": {"name": "match"},
             "mark": {"type": "point", "shape": "circle", "filled": False, "color": MATCH_COLOR, "strokeWidth": 2.5},
             "encoding": {"x": x, "y": y, "size": ring}},
            {"data": {"name": "selected"},
             "mark": {"type": "point", "shape": "circle", "filled": False, "color": SELECTED_COLOR, "strokeWidth": 3},
             "encoding": {"x": x, "y": y, "size": ring}},
            {"name": "nodes",
             "params": [
                 {"name": PICK, "select": {"type": "point", "fields": ["id"], "on": "click", "clear": False,
                                           "toggle": False}},
                 {"name": ZOOM, "select": {"type": "interval", "encodings": ["x", "y"]}, "bind": "scales"},
             ],
             "mark": {"type": "point", "filled": True, "opacity": 1, "stroke": "#424242", "strokeWidth": 0.5,
                      "cursor": "pointer"},
             "encoding": {
                 "x": x, "y": y,
                 "color": color,
                 "size": {"field": "area", "type": "quantitative", "scale": None},
                 "shape": {"field": "kind", "type": "nominal", "legend": None,
                           "scale": {"domain": list(SHAPES), "range": list(SHAPES.values())}},
                 "tooltip": [{"field": f, "title": t, "type": "nominal"} for f, t in HOVER],
             }},
            {"data": {"name": "labels"},
             "mark": {"type": "text", "dy": 11, "fontSize": 9, "color": "#616161", "baseline": "top"},
             "encoding": {"x": x, "y": y, "text": {"field": "count_label"}}},
        ],
    }


def picked_node(state: Any) -> int | None:
    """The node a click selected, from the chart's selection state (`{PICK: [{"id": ...}]}`); None when
    nothing (or something unreadable) is selected."""
    points = (state or {}).get(PICK) if isinstance(state, Mapping) else None
    if not isinstance(points, list) or not points or not isinstance(points[0], Mapping):
        return None
    value = points[0].get("id")
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# Cached per (database version, tree, view settings): a rerun that changes only the selected node
# rebuilds two small datasets (`selection_data`), not the rows, and reads no texts.
@st.cache_data(show_spinner=False, max_entries=12)
def cached_chart_data(
    path: str, tree_id: int, version: data.Version, measure: str, alpha: float, max_depth: int | None,
    collapsed: tuple[int, ...], query: str, budget: int | None = None, focus: int | None = None,
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """`chart_data` of the rows, their hover commands read for the drawn nodes only (`Store.load_nodes`)."""
    shape = data.load_shape(path, tree_id, version)
    if shape is None:
        raise ValueError(f"tree {tree_id} has no nodes yet")
    lay = figures.cached_layout(path, tree_id, version, max_depth, collapsed, budget, focus)
    matches = figures.cached_matches(path, tree_id, version, query)
    commands = {v: short_command(n) for v, n in data.read_nodes(path, tree_id, lay.ids.tolist()).items()}
    human = data.human_nodes(path, tree_id, version)
    return chart_data(tree_rows(shape, lay, measure, alpha, shape.best_path(alpha), matches, commands, human))
