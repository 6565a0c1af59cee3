"""The Tree explorer follows a running search: new nodes show on the next redraw, the selected node,
the filters and the drawing budget stay; the progress beside the tree counts simulations and
solved tasks from the store; when the run ends the page stops being live."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dash_fixtures import APP, copy_store, grow_tree, tree_chart, tree_chart_of
from streamlit.testing.v1 import AppTest

from engine.store import Store

TREE_PAGE = "views/tree_explorer.py"


@pytest.fixture()
def running(store_db, tmp_path: Path, monkeypatch) -> tuple[Path, str]:
    source, runs = store_db
    db = copy_store(source, tmp_path / "live.db")
    with Store(db) as store:
        store.set_run_status(runs["main"], "running")
    monkeypatch.setenv("ORCHARD_DB", str(db))
    return db, runs["main"]


def shown(at: AppTest) -> str:
    return next(c.value for c in at.caption if "shown)" in c.value)


def test_new_nodes_appear_and_the_selection_and_filters_stay(running) -> None:
    db, run_id = running
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task="goal-4")
    at.run()
    with Store(db, readonly=True) as store:
        tree = store.load_tree(store.tree_id(run_id, "goal-4"))
        info = store.run(run_id)
    before = len(tree.nodes)
    assert f"{before} nodes" in shown(at)
    live = [c.value for c in at.caption if c.value.startswith("Live:")]
    assert live, "a running run's tree says it is live"
    (bar,) = at.get("progress")
    assert f"{info.simulations} / 30 simulations" in bar.proto.text and f"{info.solved} / 3 tasks solved" in bar.proto.text

    node = max(n.id for n in tree.nodes if n.action is not None)
    at.text_input(key="te_node").input(str(node)).run()
    at.text_input(key="te_search").input("live").run()
    assert any("0 nodes match the search" in c.value for c in at.caption)

    new = grow_tree(db, run_id, "goal-4", parent=node, n=3)
    at.run()  # what the fragment's timer does: draw again from the newest committed state
    assert not at.exception
    assert f"{before + 3} nodes" in shown(at)
    assert at.subheader[0].value == f"Node {node}" and at.query_params["node"] == str(node)
    assert at.text_input(key="te_search").value == "live"
    assert any("3 nodes match the search" in c.value for c in at.caption)
    children = at.dataframe[-1].value  # the selected node's children table now lists the new nodes
    assert set(new) <= set(children["node"])
    (bar,) = at.get("progress")
    assert f"{info.simulations + 1} / 30 simulations" in bar.proto.text

    with Store(db) as store:
        store.set_run_status(run_id, "finished")
    at.run()
    assert not at.exception
    assert not [c.value for c in at.caption if c.value.startswith("Live:")]
    assert not at.get("progress") and any(c.value.startswith("run finished · ") for c in at.caption)
    assert at.subheader[0].value == f"Node {node}"


def test_a_big_tree_is_drawn_in_part_and_a_hexagon_opens_its_subtree(running) -> None:
    db, run_id = running
    with Store(db, readonly=True) as store:
        tree = store.load_tree(store.tree_id(run_id, "goal-5"))
    leaf = max(n.id for n in tree.nodes if not n.children)
    new = grow_tree(db, run_id, "goal-5", parent=leaf, n=1200)  # a wide node: more than the 1000 budget
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task="goal-5", max_nodes="1000")
    at.run()
    assert not at.exception
    total = len(tree.nodes) + len(new)
    assert at.selectbox(key="te_budget").value == 1000
    assert f"{total} nodes ({len(tree.nodes)} shown)" in shown(at)  # the wide group does not fit
    assert "1200 more in hexagons" in shown(at)
    at.text_input(key="te_node").input(str(leaf)).run()  # selecting the hexagon draws what it hides
    drawn = int(re.search(r"\((\d+) shown\)", shown(at)).group(1))
    hidden = re.search(r"(\d+) more in hexagons", shown(at))
    assert drawn > len(new) and drawn + (int(hidden.group(1)) if hidden else 0) == total
    assert at.subheader[0].value == f"Node {leaf}"
    at.selectbox(key="te_budget").select(0).run()
    assert at.query_params["max_nodes"] == "all"


def test_following_can_be_paused(running) -> None:
    _, run_id = running
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task="goal-3")
    at.run()
    assert any(c.value.startswith("Live:") for c in at.caption)
    at.toggle(key="te_follow").set_value(False).run()
    assert not at.exception
    assert not any(c.value.startswith("Live:") for c in at.caption)
    assert any("live redrawing is off" in c.value for c in at.caption)
    assert at.get("progress"), "the progress still shows"


def test_a_bad_budget_in_the_url_is_one_warning(running) -> None:
    _, run_id = running
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task="goal-3", max_nodes="12abc")
    at.run()
    assert not at.exception
    assert any("max_nodes in the URL must be one of 1000, 3000, 10000 or all" in w.value for w in at.warning)
    assert at.selectbox(key="te_budget").value == 3000


def test_a_node_added_while_live_is_inspected_in_full(running) -> None:
    """The live view reads only the new nodes' numbers; the inspector reads the chosen node whole."""
    db, run_id = running
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task="goal-4")
    at.run()
    new = grow_tree(db, run_id, "goal-4", parent=0, n=2)
    at.run()
    at.text_input(key="te_node").input(str(new[-1])).run()
    assert not at.exception
    assert at.subheader[0].value == f"Node {new[-1]}"
    texts = [c.value for c in at.text]  # the inspector's texts (st.text: no syntax highlighter)
    assert f"live observation {new[-1]}" in texts and f"live {new[-1]}" in texts
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["N (visits)"] == "1" and metrics["critic rank"] == "1"
    siblings = at.dataframe[0].value
    assert set(new) <= set(siblings["node"])


def test_a_live_redraw_keeps_the_spec_and_the_element_and_each_tree_has_its_own(running) -> None:
    """New nodes change the chart's rows only: the spec and the element id stay, so Streamlit swaps the
    rows in the browser's Vega view (zoom kept: tests/dashboard/test_browser.py). Another task's tree
    gets another element (its own zoom)."""
    db, run_id = running
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task="goal-4")
    at.run()
    spec, rows, element = tree_chart_of(at)
    assert not at.get("html")  # no script of ours on the page
    new = grow_tree(db, run_id, "goal-4", parent=0, n=2)
    at.run()
    spec_after, rows_after, element_after = tree_chart_of(at)
    assert (spec_after, element_after) == (spec, element)
    assert set(new) <= set(rows_after["id"]) and not set(new) & set(rows["id"])
    at.selectbox(key="te_task").select("goal-3").run()
    spec_other, _, element_other = tree_chart_of(at)
    assert spec_other == spec and element_other != element


def _click(at: AppTest, node: int) -> AppTest:
    """What a click on `node` in the chart sends: the chart's selection state, with the other widgets'."""
    chart = tree_chart(at)
    states = at._tree.get_widget_states()
    states.widgets.add(id=chart.proto.id, string_value=json.dumps({"selection": {"pick": [{"id": node}], "zoom": {}}}))
    at._run(states)
    assert not at.exception, at.exception[0].message if at.exception else ""
    return at


def test_a_click_on_another_trees_chart_moves_the_inspector_also_to_the_same_node_id(running) -> None:
    """The last pick is the last chart's: node 1 clicked in one tree, then node 1 in another tree's
    chart, is a new pick there (not the zoom's report of a pick already followed)."""
    _, run_id = running
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(run=run_id, task="goal-4")
    at.run()
    _click(at, 1)
    assert at.query_params["node"] == "1" and at.subheader[0].value == "Node 1"
    at.text_input(key="te_node").input("0").run()  # a node chosen elsewhere than in the chart
    _click(at, 1)  # the chart reports its pick again (e.g. with a zoom): the inspector stays
    assert at.query_params["node"] == "0"
    at.selectbox(key="te_task").select("goal-3").run()
    assert at.query_params["node"] == "0"
    _click(at, 1)
    assert at.query_params["node"] == "1" and at.subheader[0].value == "Node 1"
