"""Trees that read well, in a real browser (issue 31 item 3): a 3000-node tree is drawn whole, as wide as its
leaves, in a container that scrolls, with the markers of one depth apart; the run overview draws a tile per
tree and a click on one opens that tree; a revision's first error and splice are drawn on its tree.
Asserted on the Vega views' scenegraphs (what is drawn), with screenshots in pytest's tmp folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dash_fixtures import bench_dashboard, build_store, synthetic_tree
from test_browser import ARGS, CHROMIUM, MARKER_COUNT, dashboard_server, settle

from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]

VIEW = bench_dashboard().VEGA_VIEW
# The drawn items of the mark `name` in the Vega view drawing it: [{x, y}] in page px, or null before it is drawn.
ITEMS = """(name) => { """ + VIEW + """ const v = orchardViewWith(name + '_marks');
  if (!v) return null; return orchardMark(v, name + '_marks').map(it => orchardAt(v, it)) }"""
# The run overview's tiles: [{task, x, y}] in page px.
TILES = """() => { """ + VIEW + """ const v = orchardViewWith('tiles_marks'); if (!v) return null;
  return orchardMark(v, 'tiles_marks').map(it => ({task: it.datum.task, ...orchardAt(v, it)})) }"""
# The narrowest gap between neighbouring node markers of one depth, in px, and the tree's canvas width.
SPACING = """() => { """ + VIEW + """ const v = orchardView(); if (!v) return null;
  const rows = new Map(); for (const it of orchardNodes(v)) {
    const key = Math.round(it.y); if (!rows.has(key)) rows.set(key, []); rows.get(key).push(it.x); }
  let gap = Infinity; for (const xs of rows.values()) { xs.sort((a, b) => a - b);
    for (let i = 1; i < xs.length; i++) gap = Math.min(gap, xs[i] - xs[i - 1]); }
  return {gap, canvas: v.container().querySelector('canvas').getBoundingClientRect().width} }"""
SCROLLER = """() => { const s = document.querySelector('.st-key-te_scroll');
  return s ? {client: s.clientWidth, scroll: s.scrollWidth} : null }"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("trees")
    db = tmp / "orchard.db"
    runs = build_store(db)
    big = synthetic_tree(3000)
    big_run, _ = bench_dashboard().write_run(db, big, name="big")
    with dashboard_server(db, tmp) as url:
        yield url, db, runs, big_run, big


def test_a_3000_node_tree_is_drawn_whole_and_scrolls_with_its_markers_apart(server, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    url, _, _, big_run, big = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.goto(f"{url}/tree?run={big_run}")
            page.wait_for_function(f"() => ({MARKER_COUNT})() === {len(big.nodes)}", timeout=120_000)
            settle(page)
            page.screenshot(path=tmp_path / "big_tree.png")
            print("screenshot:", tmp_path / "big_tree.png")
            spacing = page.evaluate(SPACING)
            scroller = page.evaluate(SCROLLER)
            assert scroller is not None and scroller["scroll"] > scroller["client"] * 2  # it scrolls sideways
            assert spacing["canvas"] > scroller["client"] * 2
            assert spacing["gap"] >= 7, spacing  # no solid band of markers at any depth
            page.locator(".st-key-te_scroll").evaluate("s => { s.scrollLeft = s.scrollWidth / 2 }")
            page.wait_for_timeout(300)
            page.screenshot(path=tmp_path / "big_tree_scrolled.png")
        finally:
            browser.close()


def test_the_run_overview_opens_a_tree_and_a_revision_is_drawn_on_it(server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, db, runs, _, _ = server
    with Store(db) as store:
        sample = next(s for s in store.samples(kind="revision", run_id=runs["main"]) if s.source.get("error_found"))
        other = next(t for _, t in store.tree_ids(runs["main"]) if t != sample.task.id)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2000})
            page.goto(f"{url}/tree?run={runs['main']}&task={other}")
            page.wait_for_function(f"() => {{ const t = ({TILES})(); return t !== null && t.length === 3 }}",
                                   timeout=60_000)
            settle(page)
            tiles = {t["task"]: t for t in page.evaluate(TILES)}
            assert set(tiles) == {t for _, t in Store(db, readonly=True).tree_ids(runs["main"])}
            page.screenshot(path=tmp_path / "overview.png")
            print("screenshot:", tmp_path / "overview.png")
            tile = tiles[sample.task.id]
            page.mouse.click(tile["x"], tile["y"])  # a click on a tile opens that tree
            expect(page.get_by_role("combobox", name="Task")).to_have_value(
                re.compile(re.escape(sample.task.id)), timeout=30_000)
            page.wait_for_function(f"() => ({ITEMS})('first_error') && ({ITEMS})('first_error').length > 0",
                                   timeout=30_000)
            settle(page)
            page.screenshot(path=tmp_path / "revision.png")
            print("screenshot:", tmp_path / "revision.png")
            assert re.search(rf"task={re.escape(sample.task.id)}", page.url)
            drawn = {name: page.evaluate(ITEMS, name) for name in ("splice_good", "splice_bad", "jump", "first_error")}
            assert drawn["splice_good"] and drawn["splice_bad"] and len(drawn["jump"]) == 1, drawn
            revision = page.url.split("revision=")[1].split("&")[0] if "revision=" in page.url else None
            assert revision is not None
            with Store(db, readonly=True) as store:
                shown = store.sample(revision)
            t_node = shown.source["t_prime_node"]
            nodes = page.evaluate("""() => { """ + VIEW + """ const v = orchardView();
              return orchardNodes(v).map(it => ({id: Number(it.datum.id), ...orchardAt(v, it)})) }""")
            at = next(n for n in nodes if n["id"] == t_node)
            assert any(abs(r["x"] - at["x"]) < 1 and abs(r["y"] - at["y"]) < 1 for r in drawn["first_error"])
        finally:
            browser.close()
