"""Plotly figures (training curves, evaluation bars, a revision's paths on its tree), the one-line
labels and search of tree nodes, and the Tree explorer's cached level of detail and layout. The Tree
explorer's own chart is Vega-Lite (`dashboard.tree_chart`: measured faster to draw in the browser).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from dashboard import data, lod
from dashboard.layout import TreeLayout, layout_tree
from engine.actions import CompositeAction
from engine.tree_columns import TreeColumns
from engine.tree_nodes import Node, SearchTree

EDGE_COLOR = "#b0b0b0"


def short_command(node: Node, limit: int = 60) -> str:
    """One line naming the node's action (the root and format errors have none)."""
    if node.parent is None:
        return "(root)"
    if node.action is None:
        return "(format error)"
    cmd = " ".join(node.action.command.split())
    return cmd if len(cmd) <= limit else cmd[: limit - 1] + "…"


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


# --- cached per (database version, tree, view settings) ---------------------------------------------
# Rebuilt only when one of these changes (`dashboard.tree_chart.cached_chart_data` builds on them).


def _shape(path: str, tree_id: int, version: data.Version) -> TreeColumns:
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


MIN_BAR = 0.012  # a bar's least drawn height (a score of 0 is a sliver with its "0/8", not nothing)


def score_text(stat: dict) -> str:
    """A bar's value: 'k/n' when the mean is a whole count of the n tasks (one episode each), else '0.375'."""
    mean, n = stat.get("mean"), stat.get("n")
    if not isinstance(mean, int | float) or math.isnan(mean):
        return "—"
    if isinstance(n, int) and n > 0 and abs(mean * n - round(mean * n)) < 1e-9:
        return f"{round(mean * n)}/{n}"
    return f"{mean:.3f}"


def interval_bars(name: str, labels: Sequence[str], stats: Sequence[dict]) -> go.Bar:
    """One bar trace: height = each mean (at least MIN_BAR, so a zero shows), error bars = its
    bootstrap interval, its value as text under the bar, in its axis label (text at the bar's top would
    sit on the error bar)."""
    means = [s["mean"] for s in stats]
    shown = [max(m, MIN_BAR) for m in means]
    values = [score_text(s) for s in stats]
    return go.Bar(
        x=[f"{html.escape(str(x))}<br><b>{html.escape(v)}</b>" for x, v in zip(labels, values, strict=True)],
        y=shown, name=html.escape(str(name)), text=[html.escape(v) for v in values], textposition="none",
        customdata=means, hovertemplate="%{text}: %{customdata:.3f}<extra>%{fullData.name}</extra>",
        error_y={"type": "data", "symmetric": False,
                 "array": [max(0.0, s.get("high", m) - y) for s, m, y in zip(stats, means, shown, strict=True)],
                 "arrayminus": [max(0.0, y - s.get("low", m)) for s, m, y in zip(stats, means, shown, strict=True)]},
    )


def eval_figure(rows: Sequence[dict], metric: str) -> go.Figure:
    """One bar per evaluation (x = its label), height = the metric's mean, error bars = its
    bootstrap interval. `rows`: {"label", "mode", metric: {"mean", "low", "high"}}."""
    fig = go.Figure()
    for mode in dict.fromkeys(r["mode"] for r in rows):
        sel = [r for r in rows if r["mode"] == mode and isinstance(r.get(metric), dict)]
        if sel:
            fig.add_trace(interval_bars(mode, [r["label"] for r in sel], [r[metric] for r in sel]))
    label = dict(EVAL_METRICS).get(metric, metric)
    fig.update_layout(barmode="group", yaxis={"title": label, "range": [0, 1.12]}, height=340,
                      legend={"title": "mode"}, margin={"l": 50, "r": 10, "t": 20, "b": 80})
    return fig


def loop_figure(rows: Sequence[dict]) -> go.Figure:
    """Success, progress and loop rate per iteration (x = "base", "iteration 1", ...), each with its
    interval. `rows`: {"label", "success" / "progress" / "loop_rate": {"mean", "low", "high"}}."""
    fig = go.Figure()
    for key, name in EVAL_METRICS[:3]:
        sel = [r for r in rows if isinstance(r.get(key), dict)]
        if sel:
            fig.add_trace(interval_bars(name, [r["label"] for r in sel], [r[key] for r in sel]))
    fig.update_layout(barmode="group", yaxis={"title": "rate", "range": [0, 1.12]}, height=340,
                      legend={"title": "metric"}, margin={"l": 50, "r": 10, "t": 20, "b": 60})
    return fig


def depth_success_figure(depths: Sequence[int], rates: Mapping[str, Sequence[float | None]],
                         parting: int | None = None) -> go.Figure:
    """Per-depth success rate of two trees of one task (Tree explorer, "Compare with another run"):
    one line per tree (`rates`: its label -> the rate at each depth, None where no simulation reached
    it), a dotted line where their best paths first part. Labels are escaped (plotly reads tags)."""
    fig = go.Figure()
    for name, values in rates.items():
        fig.add_trace(go.Scatter(x=list(depths), y=list(values), mode="lines+markers", name=html.escape(name),
                                 connectgaps=False))
    if parting is not None:
        fig.add_vline(x=parting, line_dash="dot", line_color="#888",
                      annotation_text="best paths part", annotation_position="top")
    fig.update_layout(xaxis={"title": "depth", "dtick": 1}, yaxis={"title": "success rate", "range": [0, 1.05]},
                      height=300, legend={"title": "tree"}, margin={"l": 50, "r": 10, "t": 30, "b": 40})
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
