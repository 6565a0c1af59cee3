"""A human branch from the Tree explorer in a real browser (issue 28): at the selected node an
unreadable action is refused at the field and queues nothing, a good one is queued as a job, and once
the job's body has run the new node is drawn on the tree with the human-authored square.

The tree is a TextCraft one grown with the canned instant generator of bench/search_overhead.py (no
model), so the dashboard's own checks (the env restored and stepped) run on the real env; the job's
body is run here with that generator (the run's model is not a loadable one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash_fixtures import bench_dashboard
from test_browser import ARGS, CHROMIUM, dashboard_server, settle

from bench.search_overhead import InstantGenerator
from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.jobs.kinds import load_job
from engine.progress import MemoryReporter
from engine.search.runner import new_run
from engine.search.steer import run_steer
from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]

VIEW = bench_dashboard().VEGA_VIEW
HUMAN_MARKS = """() => { """ + VIEW + """ const v = orchardViewWith('human_marks');
  return v ? orchardMark(v, 'human_marks').length : 0 }"""


def test_a_human_action_is_refused_or_queued_at_the_field_and_drawn_on_the_tree(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = tmp_path / "orchard.db"
    make_env = env_factory("textcraft")
    task = make_env().tasks("train")[0]
    with Store(db) as store:
        run_id, _ = new_run(store, "textcraft", [task], InstantGenerator(),
                            SearchConfig(simulations=2, k=2, depth_limit=4, critic=False), "steer-browser",
                            make_env=make_env)
        tree = store.load_tree(store.tree_id(run_id, task.id))
    taken = {tree.nodes[c].action.command for c in tree.root.children if tree.nodes[c].action}
    command = next(c for c in ("inventory", "get 1 oak log", "get 2 cobblestone") if c not in taken)
    with dashboard_server(db, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.goto(f"{url}/tree?run={run_id}&task={task.id}&node=0")
            page.get_by_text("Steer the search at this node").click()
            field = page.get_by_label("Action: a command, or a whole composite action (THOUGHT: / ACTION: / ...)")
            field.fill("THOUGHT: <b>no command</b>")
            page.get_by_role("button", name="Add branch").click()
            expect(page.get_by_text("no ACTION section", exact=False)).to_be_visible()
            with Store(db, readonly=True) as store:
                assert not store.jobs()

            if not field.is_visible():  # the expander closed with the rerun
                page.get_by_text("Steer the search at this node").click()
            field.fill(command)
            page.get_by_role("button", name="Add branch").click()
            expect(page.get_by_text("Queued job", exact=False)).to_be_visible()
            with Store(db, readonly=True) as store:
                (job,) = [j for j in store.jobs() if j.kind == "add_action"]
            assert job.config["action"] == command

            with Store(db) as store:  # the worker's part, with the canned generator
                run_steer(store, load_job(job.kind, job.config), MemoryReporter(), generator=InstantGenerator())
                new = next(n for n in store.load_tree(store.tree_id(run_id, task.id)).nodes if n.author == "human")
            page.goto(f"{url}/tree?run={run_id}&task={task.id}&node={new.id}")
            page.wait_for_function(f"() => ({HUMAN_MARKS})() === 1", timeout=60_000)
            expect(page.get_by_text("HUMAN-AUTHORED: a person", exact=False)).to_be_visible()
            settle(page)
            page.screenshot(path=tmp_path / "human_branch.png")
            print("screenshot:", tmp_path / "human_branch.png")
        finally:
            browser.close()
