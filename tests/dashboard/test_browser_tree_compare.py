"""Two trees of one task side by side in a real browser (issue 28 item 3): a link with `compare=RUN`
opens the comparison under the tree (caption, the two trees drawn side by side, aligned table, per-depth
success chart); choosing "none"
in the sidebar closes it and drops the parameter from the URL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dash_fixtures import bench_dashboard
from test_browser import ARGS, CHROMIUM, dashboard_server, settle
from test_tree_compare import tree_of, two_runs

from engine.search.compare_trees import compare_trees

# every drawn tree chart (a Vega view with the "nodes" mark): the sorted node ids it draws
TREES = """() => { """ + bench_dashboard().VEGA_VIEW + """
  return [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map(orchardViewOf)
    .filter(v => v && orchardMark(v, 'nodes_marks'))
    .map(v => orchardNodes(v).map(it => Number(it.datum.id)).sort((x, y) => x - y)) }"""

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]


def test_a_link_opens_two_trees_side_by_side_and_none_closes_them(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = tmp_path / "orchard.db"
    a, b, task = two_runs(db)
    ta, tb = tree_of(db, a), tree_of(db, b)
    parting = compare_trees(ta, tb, 0.5, 0.3).first_parting
    assert parting is not None  # the steady and the wandering policy's best paths differ
    with dashboard_server(db, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.goto(f"{url}/tree?run={a}&task={task}&compare={b}")
            heading = page.get_by_role("heading", name="Compared with another run")
            expect(heading).to_be_visible(timeout=60_000)
            expect(page.get_by_text(f"B is run {b}", exact=False)).to_be_visible()
            expect(page.get_by_text(f"the best paths first part at depth {parting}", exact=False)).to_be_visible()
            expect(page.locator(".js-plotly-plot")).to_have_count(1)
            expect(page.locator("[data-testid='stDataFrame']").last).to_be_visible()
            settle(page)
            page.wait_for_function(f"() => ({TREES})().length === 3", timeout=30_000)
            explorer, drawn_a, drawn_b = page.evaluate(TREES)  # the explorer's tree, then A's and B's
            assert explorer == drawn_a == list(range(len(ta.nodes))) and drawn_b == list(range(len(tb.nodes)))
            page.locator(".js-plotly-plot").scroll_into_view_if_needed()
            settle(page)
            page.screenshot(path=tmp_path / "trees_side_by_side.png")
            print("screenshot:", tmp_path / "trees_side_by_side.png")

            page.get_by_role("combobox", name="Compare with another run").click()
            page.get_by_role("option", name="none").click()
            expect(heading).to_have_count(0, timeout=30_000)
            expect(page).not_to_have_url(re.compile("compare="))
        finally:
            browser.close()
