"""'Search here' from the Tree explorer in a real browser, end to end (issue 28): a TextCraft search with the
shipped tiny model, then at the root the page queues N more simulations as a job, a real worker process
loads the run's model and runs them, and the tree on the open page grows without a reload."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_browser import CHROMIUM, MARKER_COUNT, browser_page, dashboard_server, settle

from engine.cli import main
from engine.jobs.runner import JobRunner
from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]


def test_search_here_grows_the_open_tree_live(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    db = tmp_path / "orchard.db"
    assert main(["search", "--tasks", "0:1", "--simulations", "2", "--k", "2", "--name", "here", "--db", str(db)]) == 0
    with Store(db) as store:
        run_id = store.find_run("here")
        ((tree_id, task),) = store.tree_ids(run_id)
        before = store.load_tree(tree_id)
    with dashboard_server(db, tmp_path) as url, browser_page(1500, 1400) as page:
        page.goto(f"{url}/tree?run={run_id}&task={task}&node=0")
        page.wait_for_function(f"() => ({MARKER_COUNT})() === {len(before.nodes)}", timeout=60_000)
        page.get_by_text("Steer the search at this node").click()
        n = page.get_by_label("Simulations N")
        n.fill("3")
        n.press("Tab")
        page.get_by_role("button", name="Search here").click()
        expect(page.get_by_text("Queued job", exact=False)).to_be_visible(timeout=30_000)
        # No reload: only the page's own follow-up of the job can draw the new nodes.
        page.wait_for_function(f"() => ({MARKER_COUNT})() > {len(before.nodes)}", timeout=240_000)
        settle(page)
        page.screenshot(path=tmp_path / "search_here.png")
    with Store(db) as store:
        (job,) = [j for j in store.jobs() if j.kind == "search_here"]
        done = JobRunner(store).wait(job.id, timeout=240)
        assert done.state == "succeeded", Path(done.log_path).read_text()[-2000:]
        after = store.load_tree(tree_id)
    assert len(after.nodes) > len(before.nodes) and after.root.N == before.root.N + 3
    assert after.check_invariants() == []
