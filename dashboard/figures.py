"""Plotly figures. The tree is two WebGL traces (edges, nodes) whatever its size, plus small overlays
(best path, search matches, "+n" counts of hidden subtrees). What part of a big tree is drawn is
chosen by `dashboard.lod`; arrays go to the browser as typed arrays (plotly's base64 `bdata`).

Values shown come from the engine (`Node.Q_mcts`, `Node.Q_critic`, `Node.value(alpha)` = eq. 10,
`SearchTree.best_path`), or for a tree read as a skeleton from `dashboard.shape.TreeShape`, which
computes the same; this module only maps them to marks. Traces are built with plotly's
validation off: validating 100k-element symbol/text arrays costs seconds, and the tests validate
the same construction on small trees instead.
"""

from __future__ import annotations

import html
import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from plotly.colors import get_colorscale

from dashboard import data, keep_zoom, lod
from dashboard.layout import TreeLayout, layout_tree
from dashboard.shape import TreeShape, as_shape
from engine.actions import CompositeAction
from engine.search.tree import Node, SearchTree

# What colours the nodes: label shown in the UI -> key.
MEASURES: dict[str, str] = {
    "Q (eq. 10)": "q",
    "Q~ (MCTS mean)": "q_mcts",
    "Q^ (critic)": "q_critic",
}
SYMBOLS: dict[str | None, str] = {
    None: "circle",  # inner node or unfinished leaf
    "success": "star",
    "failure": "x",
    "format_error": "diamond",
    "depth_limit": "square",
    "stopped": "triangle-down",
}
COLLAPSED_SYMBOL = "hexagon"  # a node whose descendants are hidden
MAX_COUNT_LABELS = 100  # "+n" labels drawn beside the hexagons that hide the most
LEGEND = (
    "circle: open or inner node · star: success · x: failure · diamond: format error · "
    "square: depth limit · triangle: stopped (STATUS ≠ CONTINUE) · hexagon: has hidden descendants "
    "(+count; click it to draw its subtree) · "
    "size: visits N · grey: no value (Q^ of the root) · blue line: best path (eq. 10) · magenta ring: search match"
)
# Diverging red (0) -> green (1), spelled out: plotly.js has no "RdYlGn" of its own (plotly.py expands
# the name only when validating, which we skip).
COLORSCALE = get_colorscale("RdYlGn")
NO_VALUE = float("nan")  # nodes without a critic score (the root, critic off): drawn grey
BEST_COLOR = "#1565c0"
MATCH_COLOR = "#d500f9"
EDGE_COLOR = "#b0b0b0"


def node_value(node: Node, measure: str, alpha: float) -> float:
    if measure == "q_mcts":
        return node.Q_mcts
    if measure == "q_critic":
        return NO_VALUE if node.Q_critic is None else node.Q_critic
    if measure == "q":
        return node.value(alpha)
    raise ValueError(f"unknown measure {measure!r} (one of {', '.join(MEASURES.values())})")


def short_command(node: Node, limit: int = 60) -> str:
    """One line naming the node's action (the root and format errors have none)."""
    if node.parent is None:
        return "(root)"
    if node.action is None:
        return "(format error)"
    cmd = " ".join(node.action.command.split())
    return cmd if len(cmd) <= limit else cmd[: limit - 1] + "…"


def _fmt(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def hover_text(node: Node, alpha: float, hidden: int) -> str:
    """Short hover label. Env/model text is HTML-escaped: plotly renders a subset of HTML in labels."""
    return _hover(node.id, node.depth, short_command(node), node.N, node.Q_mcts,
                  NO_VALUE if node.Q_critic is None else node.Q_critic, node.value(alpha), node.terminal, hidden)


def matching_nodes(tree: SearchTree, query: str) -> list[int]:
    """Nodes whose composite action (or raw completion, for format errors) contains `query`
    (case-insensitive)."""
    return matching_texts(((n.id, n.action, n.raw) for n in tree.nodes), query)


def matching_texts(rows: Iterable[tuple[int, CompositeAction | None, str | None]], query: str) -> list[int]:
    """`matching_nodes` over (node id, action, raw completion) rows (`Store.node_texts`)."""
    q = query.strip().lower()
    if not q:
        return []
    out = []
    for v, a, raw in rows:
        if a is not None:
            text = " ".join((a.command, a.thought, a.explanation, a.plan or "", a.status))
        else:
            text = raw or ""
        if q in text.lower():
            out.append(v)
    return out


def _hover(v: int, depth: int, command: str, visits: int, q_mcts: float, q_critic: float, q: float,
           terminal: str | None, hidden: int) -> str:
    parts = [
        f"#{v} · depth {depth}",
        html.escape(command),
        f"N={visits} · Q~={_fmt(q_mcts)} · Q^={_fmt(q_critic)} · Q={_fmt(q)}",
    ]
    if terminal:
        parts.append(html.escape(terminal))
    if hidden:
        parts.append(f"+{hidden} hidden below")
    return "<br>".join(parts)


def tree_figure(
    tree: SearchTree | TreeShape,
    lay: TreeLayout,
    measure: str = "q",
    alpha: float = 0.5,
    best_path: Sequence[int] = (),
    matches: Collection[int] = (),
    height: int = 640,
    commands: Mapping[int, str] | None = None,
    revision: str | None = None,
) -> go.Figure:
    """The tree: one Scattergl trace of edges (NaN-separated segments), one of nodes (node id in
    customdata, so a click names the node), and overlays for the best path and search matches.
    `commands`: the drawn nodes' one-line commands (`short_command`) for their hover labels; a
    SearchTree has them itself, a `TreeShape` has no texts (the page reads the drawn nodes').
    `revision`: the layout's `uirevision` (`keep_zoom.revision`: one per tree; default per task)."""
    if commands is None:
        commands = {} if isinstance(tree, TreeShape) else {int(v): short_command(tree.nodes[v]) for v in lay.ids}
    shape = as_shape(tree)
    # Root on top via y = -depth: a reversed y axis draws Scattergl *lines* flat along the bottom in the
    # plotly.js that Streamlit 1.67 bundles (markers are fine).
    ids, x, y = lay.ids, lay.x, -lay.y
    m = len(ids)

    child = np.arange(1, m)
    par = lay.parent_index[1:]
    nan = np.full(m - 1, np.nan)
    ex = np.column_stack([x[par], x[child], nan]).ravel()
    ey = np.column_stack([y[par], y[child], nan]).ravel()

    hidden = lay.hidden.tolist()
    q_mcts = shape.q_mcts(ids)
    q_critic = np.asarray(shape.q_critic, dtype=np.float64)[ids]
    q = shape.value(alpha, ids)
    if measure not in ("q", "q_mcts", "q_critic"):
        raise ValueError(f"unknown measure {measure!r} (one of {', '.join(MEASURES.values())})")
    values = {"q": q, "q_mcts": q_mcts, "q_critic": q_critic}[measure]
    visits = np.asarray(shape.N, dtype=np.float64)[ids]
    small, extra = (5.0, 13.0) if m <= 2000 else (3.0, 9.0)  # big trees: smaller marks, less overlap
    size = small + extra * np.sqrt(visits / max(1.0, float(visits.max(initial=0.0))))
    id_list = ids.tolist()
    terminal = [shape.terminal[v] for v in id_list]
    symbol = [COLLAPSED_SYMBOL if h else SYMBOLS.get(t, "circle") for t, h in zip(terminal, hidden)]
    text = [  # short; as many as marks drawn
        _hover(v, shape.depth[v], commands.get(v, ""), shape.N[v], a, b, c, t, h)
        for v, a, b, c, t, h in zip(id_list, q_mcts.tolist(), q_critic.tolist(), q.tolist(), terminal, hidden)
    ]
    label = next(k for k, v in MEASURES.items() if v == measure)

    traces = [
        go.Scattergl(
            x=ex, y=ey, mode="lines", line={"color": EDGE_COLOR, "width": 1},
            hoverinfo="skip", name="edges", showlegend=False, _validate=False,
        ),
    ]
    pos = {int(v): i for i, v in enumerate(ids.tolist())}
    path = [p for p in (0, *best_path) if p in pos]
    if len(path) > 1:
        idx = np.asarray([pos[p] for p in path])
        traces.append(go.Scattergl(
            x=x[idx], y=y[idx], mode="lines", line={"color": BEST_COLOR, "width": 4},
            hoverinfo="skip", name="best path", showlegend=False, _validate=False,
        ))
    traces.append(go.Scattergl(
        x=x, y=y, mode="markers", customdata=ids.astype(np.int32), text=text, hoverinfo="text", name="nodes",
        showlegend=False,
        marker={
            "color": values, "colorscale": COLORSCALE, "cmin": 0.0, "cmax": 1.0, "size": size,
            "symbol": symbol, "line": {"width": 0.5, "color": "#424242"},
            "colorbar": {"title": {"text": label}, "thickness": 12, "len": 0.6},
        },
        unselected={"marker": {"opacity": 0.55}},
        _validate=False,
    ))
    folded = np.flatnonzero(lay.hidden)
    if len(folded) > MAX_COUNT_LABELS:  # WebGL text is slow to draw: label the biggest hidden subtrees
        folded = np.sort(folded[np.argsort(-lay.hidden[folded], kind="stable")[:MAX_COUNT_LABELS]])
    if len(folded):  # a marker that stands for a hidden subtree says how many nodes it holds (hover: all)
        traces.append(go.Scattergl(
            x=x[folded], y=y[folded], mode="text", text=[f"+{h}" for h in lay.hidden[folded].tolist()],
            textposition="bottom center", textfont={"size": 9, "color": "#616161"},
            hoverinfo="skip", name="hidden counts", showlegend=False, _validate=False,
        ))
    hits = [pos[h] for h in matches if h in pos]
    if hits:
        idx = np.asarray(sorted(hits))
        traces.append(go.Scattergl(
            x=x[idx], y=y[idx], mode="markers", hoverinfo="skip", name="matches", showlegend=False,
            marker={"symbol": "circle-open", "size": 18, "color": MATCH_COLOR, "line": {"width": 2.5}},
            _validate=False,
        ))
    fig = go.Figure(data=traces, _validate=False)
    fig.update_layout(
        height=height,
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        xaxis={"visible": False},
        yaxis={"visible": False},
        hovermode="closest",
        plot_bgcolor="white",
        uirevision=revision or f"tree-{shape.task_id}",
    )
    return fig


# --- cached per (database version, tree, view settings) ---------------------------------------------
# The figure is rebuilt only when one of these changes, so a rerun that only changes the selected
# node sends byte-identical JSON and the chart (and its selection) stays as it is in the browser.


def _shape(path: str, tree_id: int, version: data.Version) -> TreeShape:
    shape = data.load_shape(path, tree_id, version)
    if shape is None:
        raise ValueError(f"tree {tree_id} has no nodes yet")
    return shape


@st.cache_data(show_spinner=False, max_entries=32)
def cached_layout(
    path: str, tree_id: int, version: data.Version, max_depth: int | None, collapsed: tuple[int, ...],
    budget: int | None = None, focus: int | None = None,
) -> TreeLayout:
    """The drawn part: all of it (within depth / collapse) when `budget` is None, else the level of
    detail of `dashboard.lod` around `focus`."""
    shape = _shape(path, tree_id, version)
    if budget is None:
        return layout_tree(shape, max_depth=max_depth, collapsed=collapsed)
    return layout_tree(shape, opened=cached_open(path, tree_id, version, max_depth, collapsed, budget, focus))


@st.cache_data(show_spinner=False, max_entries=32)
def cached_open(
    path: str, tree_id: int, version: data.Version, max_depth: int | None, collapsed: tuple[int, ...],
    budget: int, focus: int | None,
) -> frozenset[int]:
    """`lod.choose_open` for these view settings (the nodes whose children are drawn)."""
    return lod.choose_open(_shape(path, tree_id, version), budget, focus, max_depth, collapsed)


@st.cache_data(show_spinner=False, max_entries=32)
def cached_matches(path: str, tree_id: int, version: data.Version, query: str) -> list[int]:
    """Nodes matching `query`; the only read of every node's action text, made when one searches."""
    return matching_texts(data.read_node_texts(path, tree_id), query) if query.strip() else []


# cache_resource: a pickled plotly Figure re-validates every array when loaded (~0.8 s at 100k
# nodes), which cache_data would do on every rerun; the figure is never mutated after building.
@st.cache_resource(show_spinner=False, max_entries=12)
def cached_tree_figure(
    path: str,
    tree_id: int,
    version: data.Version,
    measure: str,
    alpha: float,
    max_depth: int | None,
    collapsed: tuple[int, ...],
    query: str,
    budget: int | None = None,
    focus: int | None = None,
) -> go.Figure:
    """The figure, its hover labels read for the drawn nodes only (`Store.load_nodes`)."""
    shape = _shape(path, tree_id, version)
    lay = cached_layout(path, tree_id, version, max_depth, collapsed, budget, focus)
    matches = cached_matches(path, tree_id, version, query)
    commands = {v: short_command(n) for v, n in data.read_nodes(path, tree_id, lay.ids.tolist()).items()}
    return tree_figure(shape, lay, measure, alpha, shape.best_path(alpha), matches, commands=commands,
                       revision=keep_zoom.revision(tree_id))


# --- training and evaluation ------------------------------------------------------------------------

CURVES = (("loss", "loss"), ("rewards/margins", "reward margin"), ("rewards/accuracies", "reward accuracy"),
          ("mean_token_accuracy", "token accuracy"))


def metric_curves(metrics: Sequence[dict]) -> go.Figure | None:
    """A job's metric stream (trainer log records) as one line per known metric, each on its own
    row so scales never hide each other; None when nothing plottable was logged yet."""
    from plotly.subplots import make_subplots

    series = []
    for key, label in CURVES:
        points = [(m["step"], m[key]) for m in metrics
                  if m.get("step") is not None and isinstance(m.get(key), int | float) and math.isfinite(m[key])]
        if points:
            series.append((label, points))
    if not series:
        return None
    fig = make_subplots(rows=len(series), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[label for label, _ in series])
    for row, (label, points) in enumerate(series, start=1):
        xs, ys = zip(*points, strict=True)
        fig.add_trace(go.Scatter(x=list(xs), y=list(ys), mode="lines+markers", name=label,
                                 marker={"size": 4}), row=row, col=1)
    fig.update_xaxes(title_text="step", row=len(series), col=1)
    fig.update_layout(height=170 * len(series) + 60, showlegend=False, margin={"l": 40, "r": 10, "t": 30, "b": 40})
    return fig


EVAL_METRICS = (("success", "success rate"), ("progress", "progress rate"), ("loop_rate", "loop rate"),
                ("recovery", "recovery score"))


def eval_figure(rows: Sequence[dict], metric: str) -> go.Figure:
    """One bar per evaluation (x = its label), height = the metric's mean, error bars = its
    bootstrap interval. `rows`: {"label", "mode", metric: {"mean", "low", "high"}}."""
    fig = go.Figure()
    for mode in dict.fromkeys(r["mode"] for r in rows):
        sel = [r for r in rows if r["mode"] == mode and isinstance(r.get(metric), dict)]
        if not sel:
            continue
        means = [r[metric]["mean"] for r in sel]
        fig.add_trace(go.Bar(
            x=[html.escape(str(r["label"])) for r in sel], y=means, name=html.escape(str(mode)),
            error_y={"type": "data", "symmetric": False,
                     "array": [r[metric].get("high", m) - m for r, m in zip(sel, means, strict=True)],
                     "arrayminus": [m - r[metric].get("low", m) for r, m in zip(sel, means, strict=True)]},
        ))
    label = dict(EVAL_METRICS).get(metric, metric)
    fig.update_layout(barmode="group", yaxis={"title": label, "range": [0, 1.05]}, height=340,
                      legend={"title": "mode"}, margin={"l": 50, "r": 10, "t": 20, "b": 80})
    return fig


# --- a revision's two paths on the tree (Trajectories page) -------------------------------------------

LOSS_MARKS = (  # (loss flag of the sample's turn at a node, legend label, colour)
    (True, "trained (loss)", "#2e7d32"),
    (None, "unspecified (trained)", "#7cb342"),
    (False, "no loss (bad step)", "#c62828"),
)
NOT_IN_SAMPLE = "#ffffff"


def paths_figure(
    tree: SearchTree, good_path: Sequence[int], bad_path: Sequence[int], t_prime_node: int | None,
    losses: dict[int, bool | None], height: int = 420,
) -> go.Figure:
    """The good and the bad path of an Agent-R revision (docs/algorithms.md §4) drawn on their tree: both
    paths with their siblings as context, the shared prefix black, the good suffix green, the bad one
    red (dashed), every path node coloured by the loss flag of its turn in the sample (`losses`: node ->
    flag; a node the sample does not contain is white), t' and the split ringed. Node ids in customdata."""
    good, bad = [0, *good_path], [0, *bad_path]
    split = next((i for i, (g, b) in enumerate(zip(good, bad)) if g != b), min(len(good), len(bad)))
    opened = {v for v in (*good[:-1], *bad[:-1]) if v < len(tree.nodes)}
    lay = layout_tree(tree, opened=opened)
    pos = {v: (float(lay.x[i]), float(-lay.y[i])) for i, v in enumerate(lay.ids.tolist())}
    good, bad = [v for v in good if v in pos], [v for v in bad if v in pos]
    on_path = set(good) | set(bad)

    def xy(ids: Sequence[int]) -> tuple[list[float], list[float]]:
        return [pos[v][0] for v in ids], [pos[v][1] for v in ids]

    child = np.arange(1, len(lay))
    par = lay.parent_index[1:]
    nan = np.full(len(lay) - 1, np.nan)
    x, y = lay.x, -lay.y
    traces = [go.Scatter(x=np.column_stack([x[par], x[child], nan]).ravel(),
                         y=np.column_stack([y[par], y[child], nan]).ravel(), mode="lines",
                         line={"color": EDGE_COLOR, "width": 1}, hoverinfo="skip", showlegend=False, name="edges")]
    for ids, colour, dash, label in ((good[: split], "#212121", "solid", "shared prefix"),
                                     (good[max(split - 1, 0):], "#2e7d32", "solid", "good path"),
                                     (bad[max(split - 1, 0):], "#c62828", "dash", "bad path")):
        if len(ids) > 1:
            px, py = xy(ids)
            traces.append(go.Scatter(x=px, y=py, mode="lines", line={"color": colour, "width": 4, "dash": dash},
                                     hoverinfo="skip", name=label))
    context = [v for v in lay.ids.tolist() if v not in on_path]
    if context:
        cx, cy = xy(context)
        traces.append(go.Scatter(x=cx, y=cy, mode="markers", customdata=context, name="other nodes",
                                 marker={"color": "#bdbdbd", "size": 6},
                                 text=[html.escape(short_command(tree.nodes[v])) for v in context],
                                 hovertemplate="#%{customdata} %{text}<extra></extra>"))
    groups = [(label, colour, [v for v in good + bad if v in losses and losses[v] is flag])
              for flag, label, colour in LOSS_MARKS]
    groups.append(("not in the sample", NOT_IN_SAMPLE, [v for v in dict.fromkeys(good + bad) if v not in losses]))
    for label, colour, ids in groups:
        ids = list(dict.fromkeys(ids))
        if ids:
            px, py = xy(ids)
            traces.append(go.Scatter(
                x=px, y=py, mode="markers", customdata=ids, name=label,
                marker={"color": colour, "size": 12, "line": {"color": "#424242", "width": 1}},
                text=[html.escape(short_command(tree.nodes[v])) for v in ids],
                hovertemplate="#%{customdata} %{text}<extra>" + label + "</extra>"))
    marks = []
    if split >= 1 and good[split - 1] in pos:
        marks.append((good[split - 1], "split", "#212121"))
    if t_prime_node is not None and t_prime_node in pos:
        marks.append((t_prime_node, "t'", "#ff6f00"))
    for v, label, colour in marks:
        traces.append(go.Scatter(
            x=[pos[v][0]], y=[pos[v][1]], mode="markers+text", text=[label], textposition="middle right",
            textfont={"size": 14, "color": colour}, customdata=[v], name=f"{label} (node {v})",
            marker={"symbol": "circle-open", "size": 24, "color": colour, "line": {"width": 3}},
            hovertemplate=f"#{v} {label}<extra></extra>"))
    fig = go.Figure(data=traces)
    fig.update_layout(height=height, margin={"l": 10, "r": 10, "t": 10, "b": 10}, xaxis={"visible": False},
                      yaxis={"visible": False}, hovermode="closest", plot_bgcolor="white",
                      legend={"orientation": "h", "y": -0.02})
    return fig
