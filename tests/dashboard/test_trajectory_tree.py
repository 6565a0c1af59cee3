"""The Trajectories page draws a revision's good and bad path on their tree: shared prefix, split,
t' ringed, each path node coloured by its turn's loss flag, node ids in customdata (the click-through
to the Tree explorer is tested in a real browser, test_browser.py)."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from dash_fixtures import APP, JUDGE_BAD
from streamlit.testing.v1 import AppTest

from dashboard.figures import paths_figure
from engine.store import Store


@pytest.fixture()
def revision(store_db, monkeypatch):
    path, runs = store_db
    monkeypatch.setenv("ORCHARD_DB", str(path))
    with Store(path) as store:
        sample = next(s for s in store.samples(kind="revision")
                      if any(j["answer"] == JUDGE_BAD for j in s.source["judgements"]))
        tree = store.load_tree(sample.source["tree_id"])
    return runs, sample, tree


def traces(fig: go.Figure) -> dict[str, object]:
    return {t.name: t for t in fig.data}


def test_both_paths_their_split_t_prime_and_loss_colours(revision) -> None:
    _, sample, tree = revision
    src = sample.source
    losses = {t.node: t.loss for t in sample.turns if t.node is not None}
    fig = paths_figure(tree, src["good_path"], src["bad_path"], src["t_prime_node"], losses)
    go.Figure(fig.to_dict())  # valid plotly
    by_name = traces(fig)
    assert {"good path", "bad path"} <= set(by_name)
    assert list(by_name[f"t' (node {src['t_prime_node']})"].customdata) == [src["t_prime_node"]]
    coloured = {}
    for label, flag in (("trained (loss)", True), ("unspecified (trained)", None), ("no loss (bad step)", False)):
        for v in getattr(by_name.get(label), "customdata", None) or ():
            coloured[v] = flag
    assert coloured == {v: f for v, f in losses.items() if v in {*src["good_path"], *src["bad_path"]}}
    assert False in coloured.values(), "the bad steps to t' carry no loss"
    off = set(src["bad_path"]) - set(losses)  # bad steps after t' are not in the sample
    if off:
        assert set(by_name["not in the sample"].customdata) >= off
    split = next(i for i, (g, b) in enumerate(zip(src["good_path"], src["bad_path"])) if g != b)
    if split:
        ancestor = src["good_path"][split - 1]
        assert list(by_name[f"split (node {ancestor})"].customdata) == [ancestor]


def test_the_page_draws_the_paths_on_the_tree(revision) -> None:
    runs, sample, _ = revision
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/trajectories.py")
    at.query_params.update(run=runs["main"], task=sample.task.id, sample=sample.id)
    at.run()
    assert not at.exception
    (chart,) = at.get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    names = {t.get("name") for t in spec["data"]}
    assert f"t' (node {sample.source['t_prime_node']})" in names and "no loss (bad step)" in names
