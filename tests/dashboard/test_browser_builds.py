"""Data builds that explain themselves, in a real browser, end to end (issue 31 item 5): on a TextCraft run
of the shipped tiny model whose one-step tree cannot hold a success, the Trajectories page offers the run's own
model as the revisions judge, the build runs as a real job, and the page says why it made nothing, with
its counts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_browser import CHROMIUM, browser_page, dashboard_server, settle

from engine.cli import main
from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]


def test_a_revisions_build_that_made_nothing_says_why_in_the_browser(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    db = tmp_path / "orchard.db"
    # Depth 1: every TextCraft goal needs more than one step, so no leaf can be a success.
    assert main(["search", "--tasks", "0:1", "--simulations", "2", "--k", "2", "--depth", "1", "--name", "shallow",
                 "--db", str(db)]) == 0
    with Store(db) as store:
        run = store.run(store.find_run("shallow"))
    with dashboard_server(db, tmp_path) as url, browser_page(1500, 2000) as page:
        page.goto(f"{url}/trajectories?run={run.id}")
        judge = page.get_by_role("textbox", name="Judge model")
        expect(judge).to_be_visible(timeout=30_000)
        assert judge.input_value() == run.model  # the run's own policy, not the newest trained model
        page.get_by_role("button", name="Build revisions").click()
        why = page.get_by_test_id("stAlertContentWarning").get_by_text(
            re.compile("no revision trajectories: none of the 1 trees has a success leaf"))
        expect(why).to_be_visible(timeout=180_000)
        expect(page.get_by_text(re.compile("success leaves 0")).first).to_be_visible()
        settle(page)
        page.screenshot(path=tmp_path / "revisions_nothing.png", full_page=True)
    with Store(db) as store:
        (job,) = [j for j in store.jobs() if j.kind == "revisions"]
        assert job.state == "succeeded" and job.config["model"] == run.model
        assert store.samples(run_id=run.id, kind="revision") == []
