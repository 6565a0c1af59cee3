"""Rows and links that are not as Orchard writes them (a shared database edited by hand or by another
version, a link typed or pasted): every page still shows them as text and in one line, never as
Markdown, never as a traceback. The fields here are the ones that normally hold a fixed value (a run's
or a sample's status, a node's terminal, an iteration's counts, a run's settings), which
test_markup.py's free-text payloads do not reach."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from dash_fixtures import open_app
from markdown_it import MarkdownIt
from markup_fixture import build_markup_store
from streamlit.testing.v1 import AppTest

X = "zqx **zqxbold** <b>zqxhtml</b> [zqxlink](javascript:alert(1))"
MARKDOWN = MarkdownIt("commonmark", {"html": True})
MARKUP = re.compile(r"<strong>zqxbold|<b>zqxhtml|<a ")
PLAIN = {"code", "text", "json", "selectbox", "multiselect", "text_area", "text_input", "arrow_data_frame",
         "arrow_vega_lite_chart", "vega_lite_chart", "plotly_chart"}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("tampered") / "orchard.db"
    return path, build_markup_store(path)


def _strings(msg) -> list[str]:
    out: list[str] = []
    for _, value in msg.ListFields():
        items = [value] if isinstance(value, str) or hasattr(value, "ListFields") else (
            [] if isinstance(value, int | float | bool | bytes) or hasattr(value, "keys") else list(value))
        for v in items:
            out.extend(_strings(v) if hasattr(v, "ListFields") else [v] if isinstance(v, str) else [])
    return out


def _shown(node) -> list[tuple[str, str]]:
    proto = getattr(node, "proto", None)
    here = [(node.type, v) for v in _strings(proto)] if proto is not None and hasattr(proto, "ListFields") else []
    return here + [pair for child in getattr(node, "children", {}).values() for pair in _shown(child)]


def _page(base: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch, page: str, sql: Sequence[tuple[str, tuple]],
          typed: str | None = None, **params: str) -> AppTest:
    """The page over a copy of the base store with `sql` applied; no exception and no markup from the
    tampered values (every string of a Markdown-rendering element rendered the worst way)."""
    folder = tmp_path / "copy"
    shutil.copytree(base[0].parent, folder)
    con = sqlite3.connect(folder / "orchard.db")
    for statement, args in sql:
        con.execute(statement, args)
    con.commit()
    con.close()
    monkeypatch.setenv("ORCHARD_DB", str(folder / "orchard.db"))
    at = open_app(page, **params)
    if typed is not None:
        at.text_input(key="te_node").set_value(typed).run()
    assert not at.exception, [e.value for e in at.exception]
    for kind, value in _shown(at._tree):
        if "zqx" in value and kind not in PLAIN:
            assert not MARKUP.search(MARKDOWN.render(value)), (page, kind, value[:200])
    return at


def _first_tree(path: Path, run: str) -> tuple[int, str, int]:
    con = sqlite3.connect(path)
    tree_id, task = con.execute("SELECT id, task_id FROM trees WHERE run_id=? ORDER BY position", (run,)).fetchone()
    terminal = con.execute("SELECT node_id FROM nodes WHERE tree_id=? AND terminal IS NOT NULL ORDER BY node_id",
                           (tree_id,)).fetchone()[0]
    con.close()
    return tree_id, task, terminal


def test_tree_explorer_with_a_tampered_run_node_and_link(base, tmp_path, monkeypatch) -> None:
    run = base[1]["run"]
    tree_id, task, terminal = _first_tree(base[0], run)
    sql = [("UPDATE runs SET status=?, config=json_set(config, '$.alpha', 'abc', '$.k', 'x')", (X,)),
           ("UPDATE nodes SET terminal=? WHERE tree_id=? AND node_id=?", (X, tree_id, terminal))]
    at = _page(base, tmp_path, monkeypatch, "views/tree_explorer.py", sql, run=run, task=task, node="²",
               max_nodes="²")  # "²".isdigit() is true, int("²") raises
    assert any("not in this tree" in str(w.value) for w in at.warning)  # the root is shown instead
    _page(base, tmp_path / "b", monkeypatch, "views/tree_explorer.py", sql, run=run, task=task, node=str(terminal))
    at = _page(base, tmp_path / "c", monkeypatch, "views/tree_explorer.py", [], typed=X, run=run, task=task, node="0")
    assert any("No node" in str(w.value) for w in at.warning)


def test_an_unreadable_node_is_one_line_on_the_page(base, tmp_path, monkeypatch) -> None:
    run = base[1]["run"]
    tree_id, task, _ = _first_tree(base[0], run)
    at = _page(base, tmp_path, monkeypatch, "views/tree_explorer.py",
               [("UPDATE nodes SET action='{bad' WHERE tree_id=? AND node_id=1", (tree_id,))], run=run, task=task,
               node="1")
    assert [e.value for e in at.error] == ["The database holds something this page cannot read."]
    assert any(f"tree {tree_id}, node 1: unreadable" in c.value for c in at.code)


def test_data_pages_with_tampered_statuses_paths_and_trees(base, tmp_path, monkeypatch) -> None:
    _page(base, tmp_path / "t", monkeypatch, "views/trajectories.py", [
        ("UPDATE samples SET status=? WHERE kind='revision'", (X,)),
        (("UPDATE samples SET source=json_set(source, '$.tree_id', 99999, '$.good_path', json('[\"x\", 1]'), "
          "'$.judgements', 5) WHERE kind='revision'"), ())])
    _page(base, tmp_path / "p", monkeypatch, "views/pairs.py", [("UPDATE pairs SET status=?", (X,))])
    _page(base, tmp_path / "r", monkeypatch, "views/refinement.py", [("UPDATE samples SET status=? WHERE kind='refine'",
                                                                      (X,))])


def test_evaluation_and_runs_pages_with_tampered_records(base, tmp_path, monkeypatch) -> None:
    data = json.dumps({"curation": {"final": X, "uncurated_used": "1", "uncurated_left_out": 0}, "config": {}})
    _page(base, tmp_path / "e", monkeypatch, "views/evaluation.py", [
        ("UPDATE evaluations SET mode='beam'", ()),
        ("INSERT INTO iterations (loop_id, idx, method, data, created_at) VALUES ('L1', 0, 'dpo', ?, ?)",
         (data, time.time()))])
    _page(base, tmp_path / "r", monkeypatch, "views/runs.py",  # a model option this version no longer reads
          [("UPDATE runs SET status='interrupted', model='vllm:/m?zz=1'", ())])
