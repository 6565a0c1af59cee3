"""The tree figure shows the engine's values: positions from the layout, colours from Node values,
ids in customdata, one edges trace with NaN breaks, the best path from `SearchTree.best_path`."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest

from dashboard.figures import COLLAPSED_SYMBOL, SYMBOLS, hover_text, matching_nodes, tree_figure
from dashboard.layout import layout_tree
from engine.actions import CompositeAction
from engine.envs.base import TaskSpec
from engine.search.tree import SearchTree
from engine.store import Store


@pytest.fixture(scope="module")
def tree(store_db) -> SearchTree:
    path, runs = store_db
    with Store(path) as store:
        trees = [store.load_tree(t) for t, _ in store.tree_ids(runs["main"])]
    return max(trees, key=lambda t: len(t.nodes))


def trace(fig: go.Figure, name: str):
    (found,) = [t for t in fig.data if t.name == name]
    return found


def test_figure_is_valid_plotly(tree: SearchTree) -> None:
    lay = layout_tree(tree)
    fig = tree_figure(tree, lay, "q", 0.3, tree.best_path(0.3), matching_nodes(tree, "wait"))
    go.Figure(fig.to_dict())  # validation on: catches any misspelt property built unvalidated
    assert [t.type for t in fig.data] == ["scattergl"] * 4


@pytest.mark.parametrize("measure", ["q", "q_mcts", "q_critic"])
def test_nodes_trace_carries_engine_values(tree: SearchTree, measure: str) -> None:
    alpha = 0.3
    lay = layout_tree(tree)
    nodes = trace(tree_figure(tree, lay, measure, alpha), "nodes")
    ids = np.asarray(nodes.customdata).tolist()
    assert ids == lay.ids.tolist() and sorted(ids) == list(range(len(tree.nodes)))
    assert np.allclose(nodes.x, lay.x) and np.allclose(nodes.y, -lay.y)
    expected = {
        "q": lambda n: n.value(alpha),
        "q_mcts": lambda n: n.Q_mcts,
        "q_critic": lambda n: math.nan if n.Q_critic is None else n.Q_critic,
    }[measure]
    want = [expected(tree.nodes[i]) for i in ids]
    assert np.allclose(np.asarray(nodes.marker.color, dtype=float), want, equal_nan=True)
    if measure == "q_critic":
        assert math.isnan(nodes.marker.color[ids.index(0)])  # the root has no critic score
    assert list(nodes.marker.symbol) == [SYMBOLS[tree.nodes[i].terminal] for i in ids]
    visits = [tree.nodes[i].N for i in ids]
    size = np.asarray(nodes.marker.size)
    order = np.argsort(visits, kind="stable")
    assert np.all(np.diff(size[order]) >= 0)  # more visits, never a smaller marker


def test_edges_are_one_trace_of_parent_child_segments(tree: SearchTree) -> None:
    lay = layout_tree(tree)
    edges = trace(tree_figure(tree, lay), "edges")
    ex, ey = np.asarray(edges.x, dtype=float), np.asarray(edges.y, dtype=float)
    assert len(ex) == 3 * (len(tree.nodes) - 1)
    assert np.isnan(ex[2::3]).all() and np.isnan(ey[2::3]).all()
    pos = {v: (lay.x[i], -lay.y[i]) for i, v in enumerate(lay.ids.tolist())}
    segments = {((ex[i], ey[i]), (ex[i + 1], ey[i + 1])) for i in range(0, len(ex), 3)}
    expected = {(pos[n.parent], pos[n.id]) for n in tree.nodes if n.parent is not None}
    assert segments == expected


def test_best_path_and_matches_overlays(tree: SearchTree) -> None:
    lay = layout_tree(tree)
    best = tree.best_path(0.3)
    assert best, "the fixture tree should have a visited path"
    hits = matching_nodes(tree, "WAIT")
    assert hits and all(tree.nodes[h].action and "wait" in tree.nodes[h].action.command for h in hits)
    fig = tree_figure(tree, lay, "q", 0.3, best, hits)
    pos = {v: i for i, v in enumerate(lay.ids.tolist())}
    path = trace(fig, "best path")
    assert np.allclose(path.x, [lay.x[pos[v]] for v in (0, *best)])
    assert np.allclose(path.y, [-lay.y[pos[v]] for v in (0, *best)])
    assert len(trace(fig, "matches").x) == len(hits)
    assert [t.name for t in tree_figure(tree, lay).data] == ["edges", "nodes"]


def test_collapsed_nodes_get_their_own_symbol_and_hide_their_subtree(tree: SearchTree) -> None:
    folded = next(n.id for n in tree.nodes if n.parent is not None and n.children)
    lay = layout_tree(tree, collapsed=[folded])
    nodes = trace(tree_figure(tree, lay), "nodes")
    ids = np.asarray(nodes.customdata).tolist()
    assert nodes.marker.symbol[ids.index(folded)] == COLLAPSED_SYMBOL
    assert not set(tree.nodes[folded].children) & set(ids)


def test_hover_text_escapes_markup() -> None:
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    node = tree.add_child(tree.root, observation="o", action=CompositeAction(thought="t", command="<b>x</b> <script>"))
    text = hover_text(node, 0.5, hidden=0)
    assert "<b>x" not in text and "&lt;b&gt;x&lt;/b&gt; &lt;script&gt;" in text


def test_hidden_subtrees_are_counted_beside_their_hexagon() -> None:
    from dashboard import lod
    from dashboard.figures import MAX_COUNT_LABELS

    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    for _ in range(3 * MAX_COUNT_LABELS):
        child = tree.add_child(tree.root, observation="o")
        for _ in range(2 + child.id % 5):
            tree.add_child(child, observation="o")
    lay = layout_tree(tree, opened=lod.choose_open(tree, budget=3 * MAX_COUNT_LABELS + 1))
    fig = tree_figure(tree, lay)
    counts = trace(fig, "hidden counts")
    labels = [int(t.lstrip("+")) for t in counts.text]
    assert sorted(labels, reverse=True) == sorted(lay.hidden.tolist(), reverse=True)[:MAX_COUNT_LABELS]
    nodes = trace(fig, "nodes")
    assert set(np.asarray(nodes.marker.symbol)[lay.hidden > 0]) == {COLLAPSED_SYMBOL}
    assert sum(lay.hidden.tolist()) + len(lay) == len(tree.nodes)
    go.Figure(fig.to_dict())  # valid plotly
