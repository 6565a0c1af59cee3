"""The Tree explorer's "Compare with another run" (dashboard/tree_compare.py) through AppTest, on a
store of its own with two runs that searched one task under two settings."""

from __future__ import annotations

from pathlib import Path

from doubles import ScriptedGenerator, SnapshotLineEnv
from test_app import open_tree

from engine.actions import CompositeAction
from engine.config import SearchConfig
from engine.search.runner import new_run
from engine.store import Store
from engine.tree_nodes import SearchTree, Simulation


def two_runs(path: Path) -> tuple[str, str, str]:
    """Two searches of one line task (a steady policy and a wandering one): (run A, run B, task)."""
    with Store(path) as store:
        task = SnapshotLineEnv().tasks()[2:3]
        a, _ = new_run(store, "line", task, ScriptedGenerator(p_right=0.9), SearchConfig(simulations=8, k=2,
                       depth_limit=4), "steady", make_env=SnapshotLineEnv)
        b, _ = new_run(store, "line", task, ScriptedGenerator(p_right=0.3, p_garbage=0.2),
                       SearchConfig(simulations=8, k=3, depth_limit=4, alpha=0.3), "wandering", make_env=SnapshotLineEnv)
    return a, b, task[0].id


def tree_of(path: Path, run_id: str) -> SearchTree:
    with Store(path) as store:
        ((tree_id, _),) = store.tree_ids(run_id)
        tree = store.load_tree(tree_id)
    assert tree is not None
    return tree


def command(tree: SearchTree, ids: list[int], depth: int) -> str:
    if depth == 0 or depth > len(ids):
        return ""
    node = tree.nodes[ids[depth - 1]]
    return "(format error)" if node.action is None or node.format_error else node.action.command


def test_a_link_opens_two_trees_of_one_task_side_by_side(db: Path) -> None:
    a, b, task = two_runs(db)
    at = open_tree(run=a, task=task, compare=b)
    assert not at.exception
    assert at.query_params["compare"] == b and at.selectbox(key="te_compare").value == b
    (table,) = [d.value for d in at.dataframe if "A best command" in d.value]
    ta, tb = tree_of(db, a), tree_of(db, b)
    depth = 1 + max(n.depth for n in ta.nodes + tb.nodes)
    assert list(table["depth"]) == list(range(depth))
    for tree, side in ((ta, "A"), (tb, "B")):
        visits = [sum(n.N for n in tree.nodes if n.depth == d) for d in range(depth)]
        assert list(table[f"{side} visits"]) == visits
        assert table[f"{side} visits"][0] == len(tree.simulations) == 8
        wins = [s for s in tree.simulations if s.reward >= 1.0]
        assert list(table[f"{side} successes"]) == [sum(len(s.path) >= d for s in wins) for d in range(depth)]
    best_a, best_b = ta.best_path(0.5), tb.best_path(0.3)
    assert list(table["A best command"]) == [command(ta, best_a, d) for d in range(depth)]
    assert list(table["B best command"]) == [command(tb, best_b, d) for d in range(depth)]
    differ = [d for d in range(1, depth) if table["A best command"][d] != table["B best command"][d]]
    assert list(table["parted"]) == ["✓" if differ and d >= differ[0] else "" for d in range(depth)]
    words = f"first part at depth {differ[0]}" if differ else "same commands all the way"
    assert any(words in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 1


def test_picking_the_second_run_writes_the_url_and_a_run_without_the_task_is_refused(db: Path) -> None:
    a, b, task = two_runs(db)
    with Store(db) as store:
        other, _ = new_run(store, "line", SnapshotLineEnv().tasks()[:1], ScriptedGenerator(),
                           SearchConfig(simulations=2, k=2, depth_limit=2), "other-task", make_env=SnapshotLineEnv)
    at = open_tree(run=a, task=task)
    assert at.selectbox(key="te_compare").options == ["none", "wandering · " + b]  # only runs of this task
    assert not [d for d in at.dataframe if "A best command" in d.value]
    at.selectbox(key="te_compare").select(b).run()
    assert not at.exception and at.query_params["compare"] == b
    assert [d for d in at.dataframe if "A best command" in d.value]
    at = open_tree(run=a, task=task, compare=other)
    assert not at.exception and "compare" not in at.query_params
    assert any("did not search this task" in w.value for w in at.warning)


def test_a_command_with_markup_is_shown_as_text_in_the_table_only(db: Path) -> None:
    from dash_fixtures import XSS

    a, b, task = two_runs(db)
    with Store(db) as store:  # a successful human branch at B's root: B's best path now starts with it
        ((tree_id, _),) = store.tree_ids(b)
        tree = store.load_tree(tree_id)
        assert tree is not None
        node = tree.add_child(tree.root, observation="done", author="human", terminal="success", reward=1.0,
                              action=CompositeAction(thought="t", command=f"{XSS} **bold**"))
        tree.backpropagate([node.id], 1.0)
        sim = Simulation((node.id,), 1.0)
        tree.simulations.append(sim)
        store.save_simulation(tree_id, tree, sim, node.id)
    at = open_tree(run=a, task=task, compare=b)
    assert not at.exception
    (table,) = [d.value for d in at.dataframe if "A best command" in d.value]
    assert table["B best command"][1] == f"{XSS} **bold**" and table["parted"][1] == "✓"
    rendered = [e.value for kind in ("markdown", "caption", "subheader", "warning", "info") for e in getattr(at, kind)]
    assert not any("<script>" in text or "**bold**" in text for text in rendered)


def test_picking_a_task_the_compared_run_did_not_search_drops_the_comparison(db: Path) -> None:
    with Store(db) as store:
        tasks = SnapshotLineEnv().tasks()
        a, _ = new_run(store, "line", tasks[2:4], ScriptedGenerator(), SearchConfig(simulations=2, k=2,
                       depth_limit=2), "two-tasks", make_env=SnapshotLineEnv)
        b, _ = new_run(store, "line", tasks[2:3], ScriptedGenerator(), SearchConfig(simulations=2, k=2,
                       depth_limit=2), "one-task", make_env=SnapshotLineEnv)
    at = open_tree(run=a, task=tasks[2].id, compare=b)
    assert at.query_params["compare"] == b
    at.selectbox(key="te_task").select(tasks[3].id).run()
    assert not at.exception and "compare" not in at.query_params and not at.warning
    assert not [d for d in at.dataframe if "A best command" in d.value]


def test_the_two_trees_are_drawn_side_by_side_each_with_its_best_path_and_the_parting_node_ringed(db: Path) -> None:
    import json

    import pyarrow as pa

    from dashboard.tree_compare import CHART_DESCRIPTION, CHART_KEYS, parting_node
    from engine.search.compare_trees import compare_trees

    a, b, task = two_runs(db)
    at = open_tree(run=a, task=task, compare=b)
    assert not at.exception
    drawn = list(at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart"))
    charts = {side: [c for c in drawn if json.loads(c.proto.spec).get("description") == CHART_DESCRIPTION.format(
        side=side)] for side in CHART_KEYS}
    assert [len(found) for found in charts.values()] == [1, 1]  # one chart per side, apart from the explorer's
    ta, tb = tree_of(db, a), tree_of(db, b)
    parting = compare_trees(ta, tb, 0.5, 0.3).first_parting
    assert parting is not None  # the steady and the wandering policy's best paths differ
    for (side, (chart,)), tree, alpha in zip(charts.items(), (ta, tb), (0.5, 0.3), strict=True):
        spec = json.loads(chart.proto.spec)
        assert spec["height"] == 360 and any(layer.get("name") == "nodes" for layer in spec["layer"])
        sets = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets}
        rows = pa.ipc.open_stream(chart.proto.data.data).read_all().to_pandas()
        best = tree.best_path(alpha)
        assert best and set(rows["id"]) == set(range(len(tree.nodes)))  # a small tree: every node drawn
        best_edges = sorted(zip(sets["best"]["x"], sets["best"]["y"], strict=True))
        assert best_edges == sorted(zip(rows.set_index("id").loc[best, "x"], rows.set_index("id").loc[best, "y"],
                                        strict=True))
        ring = parting_node(best, parting)
        assert ring == (0 if parting == 1 else best[parting - 2])
        (ringed,) = sets["selected"].itertuples()
        node = rows.set_index("id").loc[ring]
        assert (ringed.x, ringed.y) == (node["x"], node["y"])
    assert any(f"A · steady · {a}" in c.value for c in at.caption)
    assert any(f"B · wandering · {b}" in c.value for c in at.caption)
