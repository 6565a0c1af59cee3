"""Real browser (headless Chromium): on the Preference pairs page, "Why this pair" opens on a pair two runs
built alike and shows its provenance and both sources (issue 28 item 4). Launch pattern:
tests/dashboard/test_browser.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import build_store
from test_browser import ARGS, CHROMIUM, dashboard_server, settle
from test_pair_provenance_page import search_again

from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]  # a real browser: `make test-slow`


def test_open_why_this_pair_in_the_browser(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = tmp_path / "orchard.db"
    runs = build_store(db)
    again = search_again(db)
    with Store(db) as store:
        pair = store.pairs(run_id=again, kind="step")[0]
    assert [s["run_id"] for s in pair.sources] == [runs["main"], again]
    dialogs: list[str] = []
    with dashboard_server(db, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))  # an alert() would be XSS
            page.goto(f"{url}/pairs?run={again}&pair={pair.id}")
            expect(page.get_by_role("heading", name="Preference pairs")).to_be_visible(timeout=30_000)
            settle(page)
            why = page.get_by_text("Why this pair (2 sources)")
            expect(why).to_be_visible()
            expect(page.get_by_text("2 builds made this pair", exact=False)).to_be_hidden()  # closed at first
            why.click()
            expect(page.get_by_text("2 builds made this pair", exact=False)).to_be_visible(timeout=15_000)
            expect(page.get_by_text(f"Built from run {runs['main']}", exact=False)).to_be_visible()
            settle(page)
            shot = tmp_path / "why_this_pair.png"
            page.screenshot(path=shot, full_page=True)
            assert not dialogs, f"page script ran: {dialogs}"
        finally:
            browser.close()
    print("screenshot:", shot)
