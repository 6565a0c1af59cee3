"""The dashboard pages through Streamlit's AppTest, on a fixture store written by a real search."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import APP, XSS, chart_datasets, tree_chart_of
from streamlit.testing.v1 import AppTest

from engine.store import Store
from engine.tree_nodes import SearchTree

TREE_PAGE = "views/tree_explorer.py"


@pytest.fixture()
def db(store_db, monkeypatch) -> tuple[Path, dict[str, str]]:
    path, runs = store_db
    monkeypatch.setenv("ORCHARD_DB", str(path))
    return path, runs


def app() -> AppTest:
    return AppTest.from_file(str(APP), default_timeout=60)


def open_tree(**params: str) -> AppTest:
    at = app().run()
    at.switch_page(TREE_PAGE)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


def trees(path: Path, run_id: str) -> dict[str, SearchTree]:
    with Store(path) as store:
        return {task: store.load_tree(tid) for tid, task in store.tree_ids(run_id)}


def markdown_texts(at: AppTest) -> list[str]:
    """Everything rendered as markdown (or markdown-bodied alerts and labels)."""
    out = [e.value for kind in ("markdown", "caption", "title", "header", "subheader", "latex")
           for e in getattr(at, kind)]
    out += [e.value for kind in ("info", "warning", "error", "success") for e in getattr(at, kind)]
    out += [m.label for m in at.metric] + [str(m.value) for m in at.metric]
    return out


def code_texts(at: AppTest) -> list[str]:
    return [e.value for e in at.code] + [e.value for e in at.text]


def test_runs_page_lists_every_run_with_its_settings(db) -> None:
    path, runs = db
    at = app().run()
    assert not at.exception and at.title[0].value == "Runs"
    table = at.dataframe[0].value
    with Store(path) as store:
        infos = {r.id: r for r in store.runs()}
    assert set(table["id"]) == set(infos)
    row = table.set_index("id").loc[runs["main"]]
    info = infos[runs["main"]]
    assert row["name"] == "fixture-run" and row["env"] == "line" and row["trees"] == info.trees == 3
    assert row["nodes"] == info.nodes and row["simulations"] == info.simulations == 30
    assert row["success rate"] == pytest.approx(info.solved / info.trees)
    assert (row["k"], row["sims/task"], row["depth"], row["alpha"]) == (3, 10, 5, 0.3)
    assert list(table["id"]) == [runs["main"], runs["small"]]  # newest first
    (element,) = [d for d in at.dataframe if "success rate" in d.value]
    order = list(element.proto.column_order)
    assert order[:6] == ["name", "status", "solved", "trees", "success rate", "model"]  # key columns first
    assert order[-1] == "model (full)" and list(table["model (full)"]) == [infos[i].model for i in table["id"]]


def test_a_long_model_path_is_shortened_to_its_end() -> None:
    from dashboard.text import short_path

    long = "/data/models/team/experiments/2026-12-01/iteration-7/checkpoint-best"
    assert short_path(long) == "…" + long[-31:] and len(short_path(long)) == 32
    assert short_path("tiny") == "tiny"


def test_picking_a_run_opens_the_tree_explorer(db) -> None:
    _, runs = db
    at = app().run()
    at.selectbox(key="runs_pick").select(runs["small"]).run()
    at.button(key="runs_open").click().run()
    assert not at.exception
    assert at.title[0].value == "Tree explorer"
    assert at.query_params["run"] == runs["small"] and at.query_params["task"] == "goal-1"
    assert at.query_params["node"] == "0"
    assert at.selectbox(key="te_run").value == runs["small"]


def test_picking_a_task_shows_its_tree(db) -> None:
    path, runs = db
    at = open_tree(run="fixture-run")  # a run name works as well as an id
    assert at.query_params["run"] == runs["main"]
    labels = at.selectbox(key="te_task").options  # each task with its solved mark and goal
    tasks = trees(path, runs["main"])
    assert labels == [f"{'✓' if tasks[t].solved() else '✗'} {t} — {tasks[t].task.goal}" for t in ("goal-3", "goal-4", "goal-5")]
    at.selectbox(key="te_task").select("goal-5").run()
    assert not at.exception
    assert at.query_params["task"] == "goal-5"
    tree = trees(path, runs["main"])["goal-5"]
    assert "reach position 5" in code_texts(at)
    assert any(f"{len(tree.nodes)} nodes" in c.value for c in at.caption)
    at.selectbox(key="te_run").select(runs["small"]).run()  # another run: its first task, the root
    assert at.query_params["run"] == runs["small"] and at.query_params["task"] == "goal-1"
    assert at.selectbox(key="te_task").value == "goal-1" and len(at.selectbox(key="te_task").options) == 1
    assert at.subheader[0].value == "Node 0"


def test_typed_node_id_opens_the_inspector(db) -> None:
    path, runs = db
    tree = trees(path, runs["main"])["goal-4"]
    node = max((n for n in tree.nodes if n.action is not None and n.critic_rank is not None),
               key=lambda n: (n.depth, n.N))
    at = open_tree(run=runs["main"], task="goal-4")
    at.text_input(key="te_node").input(str(node.id)).run()
    assert not at.exception
    assert at.query_params["node"] == str(node.id)
    assert at.subheader[0].value == f"Node {node.id}"
    codes = code_texts(at)
    for part in (node.action.thought, node.action.command, node.action.explanation, node.action.status,
                 node.observation, node.raw):
        assert part in codes
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["N (visits)"] == str(node.N)
    assert metrics["Q~ (MCTS)"] == f"{node.Q_mcts:.3f}"
    assert metrics["Q^ (critic)"] == f"{node.Q_critic:.3f}"
    assert metrics["Q (eq. 10)"] == f"{node.value(0.3):.3f}"  # the run's alpha, not the default
    siblings, path_rows = at.dataframe[0].value, at.dataframe[1].value
    parent = tree.nodes[node.parent]
    assert sorted(siblings["node"]) == sorted(parent.children)
    ranked = siblings.dropna(subset=["rank"])
    assert list(ranked["rank"]) == sorted(ranked["rank"])
    assert set(siblings["reason"]) == {tree.nodes[c].critic_reason or "" for c in parent.children}
    assert list(path_rows["node"]) == [0, *(n.id for n in tree.path(node))]


def test_unknown_typed_id_warns_and_keeps_the_node(db) -> None:
    _, runs = db
    at = open_tree(run=runs["main"], task="goal-4", node="2")
    at.text_input(key="te_node").input("99999").run()
    assert not at.exception
    assert at.query_params["node"] == "2" and at.subheader[0].value == "Node 2"
    assert any("No node \\'99999\\'" in w.value for w in at.warning)  # the typed text escaped: shown as typed


def test_url_names_run_task_and_node(db) -> None:
    _, runs = db
    at = open_tree(run=runs["main"][:6], task="goal-3", node="3")
    assert at.query_params["run"] == runs["main"]
    assert at.subheader[0].value == "Node 3" and at.selectbox(key="te_task").value == "goal-3"
    at = open_tree(run="no-such-run", node="zzz")
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "run named in the URL was not found" in warnings
    assert "node named in the URL is not in this tree" in warnings
    assert at.query_params["run"] == runs["main"] and at.query_params["node"] == "0"


def test_markup_in_observations_is_shown_as_text_only(db) -> None:
    path, runs = db
    hits = [(task, n) for task, tree in trees(path, runs["main"]).items() for n in tree.nodes
            if XSS in n.observation]
    assert hits, "the fixture env answers 'wait' with markup"
    task, node = hits[0]
    at = open_tree(run=runs["main"], task=task, node=str(node.id))
    assert not at.exception and at.subheader[0].value == f"Node {node.id}"
    assert any(XSS in text for text in code_texts(at))
    assert all("<script" not in text and "**bold**" not in text for text in markdown_texts(at))
    assert not at.get("html")


def test_only_the_selection_datasets_change_when_only_the_node_changes(db) -> None:
    """The same spec, element and rows (byte for byte: Streamlit leaves them in the browser's view,
    keeping the zoom); only the selected node's ring and path datasets change."""
    _, runs = db
    at = open_tree(run=runs["main"], task="goal-4")
    spec, rows, element = tree_chart_of(at)
    before = chart_datasets(at)
    assert "datasets" not in spec and set(before) == {"", "best", "match", "human", "labels", "path", "selected",
                                                      "splice_good", "splice_bad", "jump", "first_error"}
    assert len(before["selected"]) == 1 and before["path"].empty  # the root: no edge into it
    at.text_input(key="te_node").input("5").run()
    assert at.subheader[0].value == "Node 5"
    spec_now, rows_now, element_now = tree_chart_of(at)
    now = chart_datasets(at)
    assert (spec_now, element_now) == (spec, element) and rows_now.equals(rows)
    assert now[""] == before[""] and all(now[k].equals(before[k]) for k in (
        "best", "match", "human", "labels", "splice_good", "splice_bad", "jump", "first_error"))
    at5 = rows.set_index("id").loc[5]
    assert now["selected"][["x", "y"]].values.tolist() == [[at5["x"], at5["y"]]]
    assert not now["path"].empty and at5["x"] in now["path"]["x"].tolist()
    at.radio(key="te_measure").set_value("Q~ (MCTS mean)").run()
    assert tree_chart_of(at)[0] != spec


def test_depth_limit_collapse_and_search(db) -> None:
    path, runs = db
    tree = trees(path, runs["main"])["goal-4"]
    at = open_tree(run=runs["main"], task="goal-4")

    def shown() -> str:
        return next(c.value for c in at.caption if "shown)" in c.value)

    assert f"{len(tree.nodes)} nodes ({len(tree.nodes)} shown)" in shown()
    depth_key = next(s.key for s in at.slider if s.key and s.key.startswith("te_depth_"))
    at.slider(key=depth_key).set_value(1).run()
    assert f"({1 + len(tree.root.children)} shown)" in shown()
    at.slider(key=depth_key).set_value(at.slider(key=depth_key).max).run()
    at.button(key="te_collapse").click().run()  # on the root: everything below folds away
    assert "(1 shown)" in shown()
    assert any("Collapsed below nodes 0" in c.value for c in at.caption)
    at.button(key="te_expand_all").click().run()
    assert f"({len(tree.nodes)} shown)" in shown()
    at.text_input(key="te_search").input("wait").run()
    waits = [n.id for n in tree.nodes if n.action and "wait" in n.action.command]
    assert any(f"{len(waits)} nodes match the search" in c.value for c in at.caption)
    rows = tree_chart_of(at)[1].set_index("id")
    rings = chart_datasets(at)["match"]
    assert sorted(map(tuple, rings[["x", "y"]].values.tolist())) == sorted(
        (rows.loc[w, "x"], rows.loc[w, "y"]) for w in waits)


def test_missing_database_says_no_runs_yet(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ORCHARD_DB", str(tmp_path / "none" / "orchard.db"))
    at = app().run()
    assert not at.exception
    assert any("No runs yet" in i.value and "make run" in i.value for i in at.info)
    assert not (tmp_path / "none").exists()


def test_foreign_database_shows_one_line_error(monkeypatch, foreign_db: Path) -> None:
    monkeypatch.setenv("ORCHARD_DB", str(foreign_db))
    for page in (None, TREE_PAGE):
        at = app().run()
        if page:
            at.switch_page(page).run()
        assert not at.exception
        assert at.error and "cannot be opened" in at.error[0].value
        (message,) = [c.value for c in at.code if "not Orchard's" in c.value]
        assert "\n" not in message and "Traceback" not in message


def test_a_folder_or_a_damaged_database_is_explained_on_every_page(monkeypatch, tmp_path: Path) -> None:
    from doubles import damaged_store

    folder = tmp_path / "folder.db"
    folder.mkdir()
    damaged = damaged_store(tmp_path / "damaged.db", "pairs")
    for path, says in ((folder, "a folder"), (damaged, "table(s) pairs missing")):
        monkeypatch.setenv("ORCHARD_DB", str(path))
        for page in (None, TREE_PAGE, "views/pairs.py", "views/refinement.py", "views/training.py"):
            at = app().run()
            if page:
                at.switch_page(page).run()
            assert not at.exception, (path, page)
            assert at.error and "cannot be opened" in at.error[0].value, (path, page)
            assert any(says in c.value for c in at.code), (path, page)


def test_colour_by_outcome_draws_each_nodes_own_end(db) -> None:
    path, runs = db
    tree = trees(path, runs["main"])["goal-4"]
    at = open_tree(run=runs["main"], task="goal-4")
    at.radio(key="te_measure").set_value("Outcome").run()
    assert not at.exception
    spec, rows, _ = tree_chart_of(at)
    nodes = next(layer for layer in spec["layer"] if layer.get("name") == "nodes")
    assert nodes["encoding"]["color"]["field"] == "outcome"
    want = {"success": "success", "failure": "failure", "depth_limit": "failure", "stopped": "failure",
            "format_error": "format error", None: "open"}
    assert rows.set_index("id")["outcome"].to_dict() == {n.id: want[n.terminal] for n in tree.nodes}
