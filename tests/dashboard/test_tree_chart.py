"""The Tree explorer's chart (dashboard.tree_chart) shows the engine's values: positions from the layout,
colours from Node values, node ids for clicks, each edge from its parent's position, the best path from
`SearchTree.best_path`; and its spec is the same for every tree and redraw (so the zoom survives)."""

from __future__ import annotations

import json
import math

import altair as alt
import numpy as np
import pytest

from dashboard import lod, tree_chart
from dashboard.figures import matching_nodes
from dashboard.layout import layout_tree
from engine.actions import CompositeAction
from engine.envs.base import TaskSpec
from engine.store import Store
from engine.tree_columns import TreeColumns as TreeShape
from engine.tree_nodes import SearchTree


@pytest.fixture(scope="module")
def tree(store_db) -> SearchTree:
    path, runs = store_db
    with Store(path) as store:
        trees = [store.load_tree(t) for t, _ in store.tree_ids(runs["main"])]
    return max(trees, key=lambda t: len(t.nodes))


@pytest.mark.parametrize("measure", ["q", "q_mcts", "q_critic"])
def test_the_spec_is_valid_vega_lite_and_names_no_tree(measure: str) -> None:
    spec = tree_chart.tree_spec(measure)
    alt.Chart.from_dict({**spec, "data": {"values": []}})  # validated against Vega-Lite's JSON schema
    assert tree_chart.tree_spec(measure) == spec and json.dumps(spec)  # constant, serialisable: nothing of a tree in it
    nodes = next(layer for layer in spec["layer"] if layer.get("name") == "nodes")
    params = {p["name"]: p for p in nodes["params"]}
    assert params[tree_chart.PICK]["select"]["fields"] == ["id"] and params[tree_chart.ZOOM]["bind"] == "scales"
    assert {"Q (eq. 10)": "q", "Q~ (MCTS mean)": "q_mcts", "Q^ (critic)": "q_critic"}[
        nodes["encoding"]["color"]["title"]] == measure


@pytest.mark.parametrize("measure", ["q", "q_mcts", "q_critic"])
def test_rows_carry_engine_values(tree: SearchTree, measure: str) -> None:
    alpha = 0.3
    lay = layout_tree(tree)
    rows = tree_chart.tree_rows(tree, lay, measure, alpha)
    ids = rows["id"].tolist()
    assert ids == lay.ids.tolist() and sorted(ids) == list(range(len(tree.nodes)))
    assert np.allclose(rows["x"], lay.x) and np.allclose(rows["y"], -lay.y)
    expected = {  # Q~ and Q of a node not visited yet: no value (grey), not the engine's 0
        "q": lambda n: n.value(alpha) if n.N else math.nan,
        "q_mcts": lambda n: n.Q_mcts if n.N else math.nan,
        "q_critic": lambda n: math.nan if n.Q_critic is None else n.Q_critic,
    }[measure]
    got = [math.nan if v is None else v for v in rows["value"]]
    assert np.allclose(got, [expected(tree.nodes[i]) for i in ids], equal_nan=True)
    if measure == "q_critic":
        assert rows["value"][ids.index(0)] is None  # the root has no critic score: drawn grey
    # Every field the node marks encode is a number: Vega-Lite drops a mark whose continuous field is null,
    # so a node without a value would vanish from the tree (grey comes from the colour's condition instead).
    encoding = next(layer for layer in tree_chart.tree_spec(measure)["layer"] if layer.get("name") == "nodes")["encoding"]
    for channel in ("x", "y", "color", "size"):
        field = encoding[channel]["field"]
        assert all(v is not None and not math.isnan(v) for v in rows[field]), (channel, field)
    assert list(rows["kind"]) == [tree.nodes[i].terminal or "open" for i in ids]
    assert set(rows["kind"]) <= set(tree_chart.SHAPES)
    visits = [tree.nodes[i].N for i in ids]
    order = np.argsort(visits, kind="stable")
    assert np.all(np.diff(rows["area"].to_numpy()[order]) >= 0)  # more visits, never a smaller marker
    assert list(rows["N"]) == visits and list(rows["depth"]) == [tree.nodes[i].depth for i in ids]
    for i, facts in zip(ids, rows["facts"]):  # the hover line of each node's numbers
        n = tree.nodes[i]
        q_critic = "—" if n.Q_critic is None else f"{n.Q_critic:.2f}"
        q_mcts, q = (f"{n.Q_mcts:.2f}", f"{n.value(alpha):.2f}") if n.N else ("—", "—")
        assert facts.startswith(f"depth {n.depth} · N {n.N} · Q~ {q_mcts} · Q^ {q_critic} · Q {q}")
        assert facts.endswith(f" · {n.terminal}") == bool(n.terminal)


def test_each_edge_runs_from_the_parent(tree: SearchTree) -> None:
    lay = layout_tree(tree)
    rows = tree_chart.tree_rows(tree, lay).set_index("id")
    for n in tree.nodes:
        p = n.parent if n.parent is not None else n.id  # the root's edge has no length
        assert (rows.at[n.id, "px"], rows.at[n.id, "py"]) == (rows.at[p, "x"], rows.at[p, "y"])


def test_best_path_matches_and_the_selected_path(tree: SearchTree) -> None:
    lay = layout_tree(tree)
    best = tree.best_path(0.3)
    assert best, "the fixture tree should have a visited path"
    hits = matching_nodes(tree, "WAIT")
    assert hits and all(tree.nodes[h].action and "wait" in tree.nodes[h].action.command for h in hits)
    rows = tree_chart.tree_rows(tree, lay, "q", 0.3, best, hits)
    assert set(rows["id"][rows["best"]]) == set(best)  # the edge into each best-path node
    assert set(rows["id"][rows["match"]]) == set(hits)
    main, subsets = tree_chart.chart_data(rows)
    assert not {"best", "match", "count_label", "ring"} & set(main.columns) and len(main) == len(rows)
    at = main.set_index("id")

    def places(frame, ids) -> list[tuple[float, float]]:
        return sorted(zip(frame["x"], frame["y"])) if ids is None else sorted((at.loc[i, "x"], at.loc[i, "y"]) for i in ids)

    assert places(subsets["best"], None) == places(None, best)  # each best-path edge, from its parent
    assert sorted(zip(subsets["best"]["px"], subsets["best"]["py"])) == sorted(
        (at.loc[tree.nodes[i].parent, "x"], at.loc[tree.nodes[i].parent, "y"]) for i in best)
    assert places(subsets["match"], None) == places(None, hits)
    assert np.allclose(subsets["match"]["ring"], rows.loc[rows["match"], "ring"])
    node = max(n.id for n in tree.nodes if n.depth >= 2)
    sel = tree_chart.selection_data(main, TreeShape.from_tree(tree), node)
    assert places(sel["selected"], None) == places(None, [node])
    assert np.allclose(sel["selected"]["ring"], rows.loc[rows["id"] == node, "ring"])
    assert places(sel["path"], None) == places(None, [v.id for v in tree.path(tree.nodes[node])])
    assert tree_chart.selection_data(main, TreeShape.from_tree(tree), 0)["path"].empty


def test_collapsed_nodes_are_hexagons_and_hide_their_subtree(tree: SearchTree) -> None:
    folded = next(n.id for n in tree.nodes if n.parent is not None and n.children)
    rows = tree_chart.tree_rows(tree, layout_tree(tree, collapsed=[folded]))
    ids = rows["id"].tolist()
    assert rows["kind"][ids.index(folded)] == "hidden" and rows["hidden"][ids.index(folded)] > 0
    assert rows["facts"][ids.index(folded)].endswith(f" · {rows['hidden'][ids.index(folded)]} hidden below")
    assert not set(tree.nodes[folded].children) & set(ids)


def test_hover_text_is_the_raw_text() -> None:
    """Vega's tooltip escapes & and < itself (vega-tooltip's sanitize; tests/dashboard/test_browser.py
    checks the page): escaping here would show "&lt;"."""
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    tree.add_child(tree.root, observation="o", action=CompositeAction(thought="t", command="<b>x</b> <script>"))
    rows = tree_chart.tree_rows(tree, layout_tree(tree))
    assert rows["command"].tolist() == ["(root)", "<b>x</b> <script>"]


def test_hidden_subtrees_are_counted_beside_their_hexagon() -> None:
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    for _ in range(3 * tree_chart.MAX_COUNT_LABELS):
        child = tree.add_child(tree.root, observation="o")
        for _ in range(2 + child.id % 5):
            tree.add_child(child, observation="o")
    lay = layout_tree(tree, opened=lod.choose_open(tree, budget=3 * tree_chart.MAX_COUNT_LABELS + 1))
    rows = tree_chart.tree_rows(tree, lay)
    labels = [int(t.lstrip("+")) for t in rows["count_label"] if t]
    assert sorted(tree_chart.chart_data(rows)[1]["labels"]["count_label"]) == sorted(t for t in rows["count_label"] if t)
    assert sorted(labels, reverse=True) == sorted(lay.hidden.tolist(), reverse=True)[:tree_chart.MAX_COUNT_LABELS]
    assert set(rows["kind"][lay.hidden > 0]) == {"hidden"}
    assert sum(lay.hidden.tolist()) + len(lay) == len(tree.nodes)


def test_a_click_names_a_node_and_anything_else_names_none() -> None:
    assert tree_chart.picked_node({tree_chart.PICK: [{"id": 7}], tree_chart.ZOOM: {"x": [0, 1]}}) == 7
    for state in (None, {}, {tree_chart.PICK: []}, {tree_chart.PICK: {}}, {tree_chart.PICK: ["7"]}, {tree_chart.PICK: [{"id": "7"}]}, {tree_chart.PICK: [{"id": True}]},
                  {tree_chart.ZOOM: {"x": [0, 1]}}):
        assert tree_chart.picked_node(state) is None, state


def test_an_unvisited_success_leaf_is_grey_on_q_and_green_by_outcome_never_a_failure() -> None:
    """N = 0: Q~ is no estimate (the engine keeps 0), so it is drawn grey with "—", not dark red; coloured
    by outcome, the leaf is a success (issue 31 D)."""
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    visited = tree.add_child(tree.root, observation="o", terminal="failure", reward=0.0)
    leaf = tree.add_child(tree.root, observation="o", terminal="success", reward=1.0)
    tree.add_child(tree.root, observation="o", terminal="format_error")
    tree.backpropagate([visited.id], 0.0)
    assert leaf.N == 0 and leaf.Q_mcts == 0.0
    for measure in ("q", "q_mcts"):
        rows = tree_chart.tree_rows(tree, layout_tree(tree), measure).set_index("id")
        assert rows.loc[leaf.id, "value"] is None and rows.loc[visited.id, "value"] == 0.0
        assert " · Q~ — · " in rows.loc[leaf.id, "facts"]
        nodes = next(layer for layer in tree_chart.tree_spec(measure)["layer"] if layer.get("name") == "nodes")
        assert nodes["encoding"]["color"]["condition"] == {"test": "datum.value === null",
                                                           "value": tree_chart.NO_VALUE_COLOR}
    main, _ = tree_chart.chart_data(tree_chart.tree_rows(tree, layout_tree(tree), "outcome"))
    assert main.set_index("id")["outcome"].to_dict() == {0: "open", visited.id: "failure", leaf.id: "success",
                                                         3: "format error"}
    spec = tree_chart.tree_spec("outcome")
    alt.Chart.from_dict({**spec, "data": {"values": []}})
    color = next(layer for layer in spec["layer"] if layer.get("name") == "nodes")["encoding"]["color"]
    assert color["field"] == "outcome" and dict(zip(color["scale"]["domain"], color["scale"]["range"]))[
        "success"] == "#2e7d32"


def test_a_revisions_splice_and_first_error_are_drawn_on_the_drawn_nodes(tree: SearchTree) -> None:
    """The revision's trained edges (prefix and good suffix), its bad edges through t' and the revision turn
    (t' back to the split's node) come from the drawn rows; t' gets a ring and a "t'" label."""
    leaves = [n for n in tree.nodes if not n.children and n.depth >= 2]
    a, b = leaves[0], next(n for n in leaves[1:] if n.parent != leaves[0].parent)
    good, bad = [n.id for n in tree.path(a)], [n.id for n in tree.path(b)]
    split = next((i for i, (g, x) in enumerate(zip(good, bad)) if g != x), min(len(good), len(bad)))
    source = {"good_path": good, "bad_path": bad, "t_prime": 0, "t_prime_node": bad[split]}
    main, _ = tree_chart.chart_data(tree_chart.tree_rows(tree, layout_tree(tree)))
    out = tree_chart.revision_data(main, source, {bad[split]})
    at = main.set_index("id")
    assert set(out) == set(tree_chart.REVISION)
    assert out["splice_good"][["x", "y"]].values.tolist() == at.loc[good, ["x", "y"]].values.tolist()
    assert out["splice_bad"][["x", "y"]].values.tolist() == at.loc[[bad[split]], ["x", "y"]].values.tolist()
    split_node = good[split - 1] if split else 0
    assert out["jump"].values.tolist() == [[*at.loc[bad[split], ["x", "y"]], *at.loc[split_node, ["x", "y"]]]]
    assert out["first_error"][["x", "y"]].values.tolist() == [at.loc[bad[split], ["x", "y"]].tolist()]
    assert out["first_error"]["label"].tolist() == ["t'"]
    none = tree_chart.revision_data(main, None)
    assert all(frame.empty for frame in none.values())
    junk = tree_chart.revision_data(main, {"good_path": "x", "bad_path": [True, "1"], "t_prime": "0"})  # imported junk
    assert all(frame.empty for frame in junk.values())


def test_a_big_tree_is_drawn_as_wide_as_its_leaves_and_a_small_one_fits() -> None:
    from dash_fixtures import synthetic_tree as synthetic

    small = synthetic(40)
    assert tree_chart.chart_size(layout_tree(small)) == (None, tree_chart.FIT_HEIGHT)
    widths = []
    for n in (300, 1000, 3000):
        lay = layout_tree(synthetic(n))
        width, height = tree_chart.chart_size(lay)
        slots = lay.x.max() + 1
        assert width is not None and width >= min(tree_chart.MAX_WIDTH, slots * tree_chart.SLOT_PX)
        assert width <= tree_chart.MAX_WIDTH and height >= (lay.y.max() + 1) * tree_chart.LEVEL_PX
        widths.append(width)
        spec = tree_chart.tree_spec("q", height, width)
        alt.Chart.from_dict({**spec, "data": {"values": []}})
        assert (spec["width"], spec["height"], spec["autosize"]) == (width, height, {"type": "pad"})
    assert widths == sorted(widths) and widths[0] < widths[-1]
    assert tree_chart.chart_size(layout_tree(synthetic(1000))) == (widths[1], tree_chart.chart_size(
        layout_tree(synthetic(1000)))[1])  # the same tree, the same size: a live redraw keeps the spec
