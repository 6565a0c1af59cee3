"""The live Loop view in headless Chromium: with a loop job running, the Evaluation page shows the
iteration's stage and its own progress, and — without a reload — the next progress row and a record
that lands while the page is open (the Loop section's fragment re-reads the store every 2 s)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_browser import ARGS, CHROMIUM, dashboard_server, settle
from test_loop_live import progress, record

from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]  # a real browser: `make test-slow`


def test_the_loop_view_follows_a_running_loop_without_a_reload(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = tmp_path / "orchard.db"
    with Store(db) as store:
        record(store, 0, "tiny")
        record(store, 1, "/models/loop-l/iter-1", run_id="r1", solved_in_search=2, samples=3, train={"steps": 2},
               gate={"promoted": True, "why": "no gate"})
        job = store.create_job("iterate", {"iterate": {"name": "loop-l", "method": "exit"}}, "cpu", name="loop-l")
        store.claim_next_job("cpu")  # no pid: the page's poll leaves it running for its first minute
        store.update_job_progress(job.id, progress(2, "search", "search", 57, 128, "simulations", solved=3))
    with dashboard_server(db, tmp_path, {"ORCHARD_HOME": str(tmp_path / "home")}) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2400})
            page.goto(f"{url}/evaluation")
            loop = page.locator(".stProgress").filter(has_text="iteration 2 of 3")
            expect(loop).to_contain_text("search: 57/128 simulations", timeout=30_000)
            expect(page.get_by_text("2 records; job")).to_be_visible()
            settle(page)
            page.screenshot(path=tmp_path / "01_search.png", full_page=True)
            with Store(db) as store:
                record(store, 2, "/models/loop-l/iter-2", run_id="r2", solved_in_search=1, samples=2,
                       train={"steps": 2}, gate={"promoted": True, "why": "no gate"})
                store.update_job_progress(job.id, progress(3, "train", "sft", 4, 10, "steps"))
            loop = page.locator(".stProgress").filter(has_text="iteration 3 of 3")
            expect(loop).to_contain_text("sft: 4/10 steps", timeout=15_000)  # the fragment's next refresh
            expect(page.get_by_text("3 records; job")).to_be_visible(timeout=15_000)
            settle(page)
            page.screenshot(path=tmp_path / "02_record_landed.png", full_page=True)
            print(f"screenshots in {tmp_path}")
        finally:
            browser.close()
