"""Trees that read well (issue 31 item 3): the task picker names each task's goal and outcome, the run
overview shows every tree (sized by nodes, coloured by outcome; a click opens it), a revision's first
error and splice are drawn on the tree, a 3000-node tree is drawn whole in a chart as wide as its leaves
(scrolled), and the live view moves on with the search."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from dash_fixtures import APP, copy_store, grow_tree, overview_chart, synthetic_tree, tree_chart_of
from streamlit.testing.v1 import AppTest

from dashboard import overview, tree_chart
from engine.store import Store, TreeSummary

TREE_PAGE = "views/tree_explorer.py"


def open_tree(**params: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page(TREE_PAGE)
    at.query_params.update(params)
    at.run()
    assert not at.exception, at.exception[0].message if at.exception else ""
    return at


@pytest.fixture()
def db(store_db, monkeypatch) -> tuple[Path, dict[str, str]]:
    path, runs = store_db
    monkeypatch.setenv("ORCHARD_DB", str(path))
    return path, runs


def summary(task: str, nodes: int, sims: int, solved: bool = False) -> TreeSummary:
    return TreeSummary(tree_id=1, task_id=task, goal=f"goal of {task}", simulations=sims, solved=solved, nodes=nodes,
                       successes=int(solved), max_depth=2)


def test_outcome_labels_and_which_tree_following_moves_to() -> None:
    trees = [summary("a", 9, 4, solved=True), summary("b", 7, 4), summary("c", 3, 1), summary("d", 0, 0)]
    assert [overview.outcome(s, 4, True) for s in trees] == ["solved", "not solved", "searching", "not started"]
    assert [overview.outcome(s, 4, False) for s in trees] == ["solved", "not solved", "not solved", "not started"]
    assert overview.task_label(trees[0], 4, True) == "✓ a — goal of a"
    long = TreeSummary(1, "t", "x " * 80 + "\n<b>", 0, False, 0, 0, 0)
    label = overview.task_label(long, 4, True)
    assert label.startswith("· t — x x") and label.endswith("…") and "\n" not in label
    assert overview.follow_target(trees, "a", 4, True) == "c"  # the watched tree is done: the one searched
    assert overview.follow_target(trees, "c", 4, True) is None  # still searching: stay
    assert overview.follow_target(trees[:2], "a", 4, True) is None  # nothing else is searched


def test_the_task_picker_and_the_run_overview_show_every_tree_and_a_click_opens_one(db) -> None:
    path, runs = db
    with Store(path) as store:
        summaries = store.tree_summaries(runs["main"])
    at = open_tree(run=runs["main"], task="goal-3")
    labels = at.selectbox(key="te_task").options
    assert [label.split(" — ")[0] for label in labels] == [f"{'✓' if s.solved else '✗'} {s.task_id}" for s in summaries]
    assert any(not s.solved for s in summaries) and any(s.solved for s in summaries)
    spec, rows = overview_chart(at)
    assert rows["task"].tolist() == [s.task_id for s in summaries]
    assert rows["outcome"].tolist() == ["solved" if s.solved else "not solved" for s in summaries]
    assert rows["current"].tolist() == [s.task_id == "goal-3" for s in summaries]
    biggest = max(summaries, key=lambda s: s.nodes)
    assert rows.set_index("task")["area"].idxmax() == biggest.task_id  # sized by nodes
    assert [f"{s.nodes} nodes" in f for s, f in zip(summaries, rows["facts"], strict=True)] == [True] * len(summaries)
    tiles = next(layer for layer in spec["layer"] if layer.get("name") == "tiles")
    assert tiles["encoding"]["color"]["scale"]["range"][0] == overview.OUTCOME_COLORS["solved"]
    assert any("Run overview: 3 trees" in e.label for e in at.expander)

    chart = next(c for c in at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart") if "tiles" in c.proto.spec)
    states = at._tree.get_widget_states()
    states.widgets.add(id=chart.proto.id, string_value=json.dumps({"selection": {overview.PICK: [{"task": "goal-5"}]}}))
    at._run(states)  # what a click on goal-5's tile sends
    assert not at.exception
    assert at.query_params["task"] == "goal-5" and at.selectbox(key="te_task").value == "goal-5"
    assert overview_chart(at)[1].set_index("task")["current"].to_dict() == {"goal-3": False, "goal-4": False,
                                                                             "goal-5": True}


def test_a_revisions_first_error_and_splice_are_drawn_on_its_tree(db) -> None:
    path, runs = db
    with Store(path) as store:
        revisions = [s for s in store.samples(kind="revision", run_id=runs["main"]) if s.source.get("error_found")]
    sample = revisions[0]
    src = sample.source
    at = open_tree(run=runs["main"], task=sample.task.id, revision=sample.id)
    assert at.query_params["revision"] == sample.id and at.selectbox(key="te_revision").value == sample.id
    from dash_fixtures import chart_datasets

    sets = chart_datasets(at)
    rows = tree_chart_of(at)[1].set_index("id")
    t_node = src["t_prime_node"]
    assert [rows.loc[t_node, "x"], rows.loc[t_node, "y"]] in sets["first_error"][["x", "y"]].values.tolist()
    assert len(sets["splice_good"]) == len(src["good_path"])  # every trained step's edge
    assert len(sets["splice_bad"]) == src["t_prime"] + 1 and len(sets["jump"]) == 1
    assert sets["jump"][["x", "y"]].values.tolist() == [[rows.loc[t_node, "x"], rows.loc[t_node, "y"]]]
    assert any(f"first error t' at node {t_node}" in c.value for c in at.caption)
    at.button(key="te_inspect_t").click().run()
    assert at.query_params["node"] == str(t_node) and at.subheader[0].value == f"Node {t_node}"
    at.selectbox(key="te_revision").select("(none)").run()
    sets = chart_datasets(at)
    assert sets["splice_good"].empty and sets["jump"].empty and not sets["first_error"].empty  # t' rings stay
    at.query_params["revision"] = "no-such-sample"
    at.run()
    assert any("revision named in the URL" in w.value for w in at.warning)


def test_a_3000_node_tree_is_drawn_whole_in_a_chart_as_wide_as_its_leaves(tmp_path: Path, monkeypatch) -> None:
    from dash_fixtures import bench_dashboard

    tree = synthetic_tree(3000)
    db = tmp_path / "big.db"
    run_id, _ = bench_dashboard().write_run(db, tree, name="big")
    monkeypatch.setenv("ORCHARD_DB", str(db))
    start = time.perf_counter()
    at = open_tree(run=run_id)
    took = time.perf_counter() - start
    spec, rows, _ = tree_chart_of(at)
    assert len(rows) == len(tree.nodes) == 3000  # the default budget draws all of it
    slots = rows["x"].max() - rows["x"].min() + 1
    assert spec["width"] >= min(tree_chart.MAX_WIDTH, slots * tree_chart.SLOT_PX) > tree_chart.FIT_WIDTH
    assert spec["height"] >= (rows["y"].max() - rows["y"].min() + 1) * tree_chart.LEVEL_PX
    assert any("leaf slots" in c.value and "scroll it" in c.value for c in at.caption)
    assert any(f"{len(tree.nodes)} nodes (3000 shown)" in c.value for c in at.caption)
    at.text_input(key="te_node").input("2999").run()
    assert not at.exception and at.subheader[0].value == "Node 2999"
    assert took < 60, f"the page took {took:.1f} s"


def test_the_live_view_moves_on_when_the_watched_tree_is_finished(store_db, tmp_path: Path, monkeypatch) -> None:
    source, runs = store_db
    db = copy_store(source, tmp_path / "live.db")
    run_id = runs["main"]
    with Store(db) as store:
        store.set_run_status(run_id, "running")
        config = {**store.run(run_id).config, "simulations": 12}  # every tree has 10: all being searched
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET config=? WHERE id=?", (json.dumps(config), run_id))
    con.commit()
    con.close()
    monkeypatch.setenv("ORCHARD_DB", str(db))
    at = open_tree()  # a running run opens on a tree being searched: its first
    assert at.query_params["run"] == run_id and at.query_params["task"] == "goal-3"
    at.query_params["task"] = "goal-4"
    at.run()
    assert at.selectbox(key="te_task").value == "goal-4" and at.toggle(key="te_follow_run").value
    grow_tree(db, run_id, "goal-4", parent=0, n=1)
    at.run()
    assert at.query_params["task"] == "goal-4"  # 11 of 12: still searched
    grow_tree(db, run_id, "goal-4", parent=0, n=1)
    at.run()  # 12 of 12: the view moves on to the next tree the search is on
    assert not at.exception
    assert at.query_params["task"] == "goal-3" and at.selectbox(key="te_task").value == "goal-3"
    at.query_params["task"] = "goal-4"  # opened by hand, a finished tree stays open
    at.run()
    at.run()
    assert at.query_params["task"] == "goal-4"


def test_the_tree_explorer_on_an_empty_store_says_how_to_start(tmp_path: Path, monkeypatch) -> None:
    with Store(tmp_path / "empty.db"):
        pass
    monkeypatch.setenv("ORCHARD_DB", str(tmp_path / "empty.db"))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(TREE_PAGE).run()
    assert not at.exception
    assert any("No runs yet" in e.value for e in at.info)


def test_a_tree_downloads_as_the_cli_exports_it(db, tmp_path: Path) -> None:
    import networkx as nx

    from engine.cli import main

    path, runs = db
    at = open_tree(run=runs["main"], task="goal-4")
    assert not at.get("download_button")  # nothing read until asked
    at.toggle(key="te_export").set_value(True).run()
    assert not at.exception
    buttons = {b.proto.label: b for b in at.get("download_button")}
    assert set(buttons) == {"Download JSON", "Download GRAPHML"}
    out = tmp_path / "cli.json"
    assert main(["export", "tree", runs["main"], "--task", "goal-4", "--format", "json", "-o", str(out),
                 "--db", str(path)]) == 0
    from dashboard import data

    blob = data.tree_export(str(path), runs["main"], Store(path, readonly=True).tree_id(runs["main"], "goal-4"),
                            "json", data.db_version(path))
    assert json.loads(blob) == json.loads(out.read_text())
    graph = data.tree_export(str(path), runs["main"], Store(path, readonly=True).tree_id(runs["main"], "goal-4"),
                             "graphml", data.db_version(path))
    (tmp_path / "t.graphml").write_bytes(graph)
    assert nx.read_graphml(tmp_path / "t.graphml").number_of_nodes() == len(json.loads(blob)["nodes"]) > 5


def test_the_critics_reason_column_is_wide_and_key_columns_narrow(db) -> None:
    _, runs = db
    at = open_tree(run=runs["main"], task="goal-4", node="2")
    siblings = next(d for d in at.dataframe if "reason" in d.value)
    config = json.loads(siblings.proto.columns)
    assert config["reason"]["width"] == "large" and config["node"]["width"] == 56
    assert "critic" in config["reason"]["help"]
