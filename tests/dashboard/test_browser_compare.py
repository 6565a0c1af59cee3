"""Real browser (headless Chromium): on the Evaluation page, putting an evaluation made under other settings
beside the baseline shows the banner naming each difference, and the bars carry their values (issue 31 A).
Launch pattern: tests/dashboard/test_browser.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv
from test_browser import ARGS, CHROMIUM, dashboard_server, settle

from engine.evaluate import EvalConfig, evaluate_and_store
from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]  # a real browser: `make test-slow`


def test_selecting_an_evaluation_under_other_settings_shows_the_banner(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = tmp_path / "orchard.db"
    with Store(db) as store:
        for model, config, n in (("/models/base", EvalConfig(max_steps=4, bootstrap=100), 4),
                                 ("/models/trained", EvalConfig(max_steps=6, bootstrap=100, constrained=True), 2)):
            evaluate_and_store(store, ScriptedGenerator(p_right=0.7), "line", "train", SnapshotLineEnv().tasks()[:n],
                               config, model=model, make_env=SnapshotLineEnv)
    with dashboard_server(db, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.goto(f"{url}/evaluation")
            expect(page.get_by_role("heading", name="Compare models")).to_be_visible(timeout=30_000)
            settle(page)
            expect(page.get_by_text("Not comparable with the baseline")).to_have_count(0)
            page.locator("[class*='st-key-ev_pick_'] input").click()
            page.get_by_role("option", name="trained · greedy").click()
            page.keyboard.press("Escape")
            banner = page.get_by_text("Not comparable with the baseline base")
            expect(banner).to_be_visible(timeout=30_000)
            for words in ("max_steps 4 vs 6", "constrained no vs yes", "tasks 4 vs 2"):
                expect(banner).to_contain_text(words)
            texts = """() => { const gd = document.querySelector('.st-key-ev_chart .js-plotly-plot');
              return gd && gd._fullData ? gd._fullData.flatMap(t => Array.from(t.text || [])).map(String) : [] }"""
            page.wait_for_function(f"() => ({texts})().length == 2", timeout=30_000)
            assert all("/" in t or "." in t for t in page.evaluate(texts))  # "k/n" or a mean on every bar
            settle(page)
            page.screenshot(path=tmp_path / "evaluation_banner.png", full_page=True)
        finally:
            browser.close()
    print("screenshot:", tmp_path / "evaluation_banner.png")
