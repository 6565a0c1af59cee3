"""The Preference pairs page's "Why this pair" panel (issue 28 item 4) through Streamlit's AppTest: on a
copy of the fixture store plus a run that searched like the first one, so its pairs are the first run's
pairs with a second source."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import APP, XssLineEnv, copy_store
from doubles import ScriptedGenerator
from streamlit.testing.v1 import AppTest

from engine.config import SearchConfig
from engine.datasets.pairs import PairsConfig, build_pairs
from engine.datasets.samples import tree_refs
from engine.search.runner import new_run
from engine.store import Store

PAIRS = "views/pairs.py"


def search_again(path: Path) -> str:
    """A run searched exactly as the fixture store's run "main" (dash_fixtures.build_store), its pairs
    built and saved: every one of them is one of "main"'s, merged as a second source. Returns its id."""
    env = XssLineEnv()
    with Store(path) as store:
        again, _ = new_run(store, "line", env.tasks()[2:5], ScriptedGenerator(p_right=0.4, p_garbage=0.15),
                           SearchConfig(simulations=10, k=3, depth_limit=5, alpha=0.3), "main-again",
                           make_env=XssLineEnv)
        built = build_pairs(tree_refs(store, again, env.describe()),
                            PairsConfig(alpha=store.run(again).config.get("alpha", 0.5)))
        report = built.save(store, again)[0]
    assert built.pairs and report.merged == built.pairs
    return again


@pytest.fixture()
def merged_db(store_db, tmp_path: Path, monkeypatch) -> tuple[Path, dict[str, str]]:
    """A copy of the fixture store with `search_again`'s run as "again"."""
    source, runs = store_db
    path = copy_store(source, tmp_path / "orchard.db")
    monkeypatch.setenv("ORCHARD_DB", str(path))
    return path, {**runs, "again": search_again(path)}


def frame(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value)


def test_why_this_pair_shows_both_sides_provenance_and_every_source(merged_db) -> None:
    path, runs = merged_db
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(PAIRS)
    at.query_params["run"] = runs["again"]  # the run's pairs include those it is a second source of
    at.run()
    assert not at.exception
    pair_id = at.query_params["pair"]
    with Store(path, readonly=True) as store:
        pair = store.pair(pair_id)
        model = store.run(runs["again"]).model
    assert pair.run_id == runs["main"] and [s["run_id"] for s in pair.sources] == [runs["main"], runs["again"]]
    (why,) = [e for e in at.expander if e.label.startswith("Why this pair")]
    assert why.label == "Why this pair (2 sources)"
    assert "2 builds made this pair" in " ".join(c.value for c in at.caption)

    sides = frame(at, "Q~ (MCTS)")
    src = pair.provenance
    assert list(sides["side"]) == ["chosen", "rejected"]
    assert list(sides["node"]) == [pair.chosen_node, pair.rejected_node]
    assert list(sides["visits"]) == [src["visits_chosen"], src["visits_rejected"]]
    assert list(sides["Q~ (MCTS)"]) == [round(src["q_mcts_chosen"], 3), round(src["q_mcts_rejected"], 3)]
    assert list(sides["proposed by"]) == ["policy", "policy"]

    sources = frame(at, "source id")
    assert list(sources["run"]) == [runs["main"], runs["again"]]
    assert sources["source id"].iloc[0] == pair.id
    assert list(sources["model"])[1] == f"{model} / {model}"  # "again" was built with the run's settings
    text = " ".join(t.value for t in at.text)
    assert f"Built from run {runs['main']}" in text and "different commands" in text
    assert frame(at, "pair")["sources"].max() == 2  # the queue counts each pair's sources


def test_a_pair_stored_without_provenance_says_how_to_record_it(merged_db) -> None:
    path, runs = merged_db
    with Store(path) as store, store.transaction() as con:  # a store from before migration 9: no sources
        con.execute("DELETE FROM pair_sources")
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(PAIRS)
    at.query_params["run"] = runs["main"]
    at.run()
    assert not at.exception
    assert any(e.label == "Why this pair (0 sources)" for e in at.expander)
    assert any("rebuild the run's pairs" in i.value for i in at.info)
