"""Every dashboard page through AppTest on an empty store and on a store holding one 3000-node tree
(issue 31's "AppTest for every page"; the demo store's pages: tests/test_demo.py): no page raises or
shows an error box, and the pages that need runs say so on the empty store instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import APP, bench_dashboard, synthetic_tree
from streamlit.testing.v1 import AppTest

from engine.store import Store

pytestmark = pytest.mark.slow  # about 30 s of page runs: `make test-slow`

PAGES = ["views/runs.py", "views/tree_explorer.py", "views/trajectories.py", "views/pairs.py",
         "views/refinement.py", "views/review.py", "views/training.py", "views/evaluation.py"]


def every_page(monkeypatch: pytest.MonkeyPatch, db: Path) -> dict[str, AppTest]:
    """Each page, run once on `db`: page -> its AppTest after the run."""
    monkeypatch.setenv("ORCHARD_DB", str(db))
    out = {}
    for page in PAGES:
        at = AppTest.from_file(str(APP), default_timeout=60).run()
        at.switch_page(page)
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not [e.value for e in at.error], (page, [e.value for e in at.error])
        out[page] = at
    return out


def test_every_page_on_an_empty_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    db = tmp_path / "orchard.db"
    Store(db).close()
    pages = every_page(monkeypatch, db)
    words = " ".join(str(e.value) for e in pages["views/tree_explorer.py"].info)
    assert "no runs" in words.lower() or "search" in words.lower(), words


def test_every_page_on_a_3000_node_tree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    db = tmp_path / "orchard.db"
    tree = synthetic_tree(3000)
    run_id, _ = bench_dashboard().write_run(db, tree, name="big")
    pages = every_page(monkeypatch, db)
    explorer = pages["views/tree_explorer.py"]
    assert any(h.value == "Node 0" for h in [*explorer.subheader, *explorer.header]), "the tree's root is not shown"
    runs = " ".join(str(df.value.to_dict()) for df in pages["views/runs.py"].dataframe)
    assert run_id in runs or "big" in runs
