"""Real browser (headless Chromium) checks of issue 31's "How it is checked" not covered elsewhere: a
paired difference beside the baseline, an unvisited success leaf not painted as a failure, Swap then
Approve & next deciding the swapped pair before its neighbour, and a refinement build run as a job from
the Refinement page. Launch pattern: tests/dashboard/test_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv
from test_browser import BENCH, CHROMIUM, browser_page, dashboard_server, fixture_server, settle
from test_distill import solved_tree
from test_pairs import add

from dashboard import tree_chart
from engine.evaluate import EvalConfig, evaluate_and_store
from engine.store import Store

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]  # a real browser: `make test-slow`

# The texts of every data grid's cells on the page (the grid draws on a canvas; its accessible table
# inside the canvas holds the visible cells' texts).
GRID_TEXT = """() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"] [role="gridcell"]'))
  .map(c => c.textContent)"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """The fixture store's dashboard (tests/dashboard/dash_fixtures.py), for the curation test."""
    yield from fixture_server(tmp_path_factory, "truth")


def test_a_model_beside_its_baseline_shows_the_paired_difference(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    db = tmp_path / "orchard.db"
    tasks = SnapshotLineEnv().tasks()[:4]
    with Store(db) as store:
        for model, p_right in (("/models/base", 0.5), ("/models/trained", 0.9)):
            evaluate_and_store(store, ScriptedGenerator(p_right=p_right), "line", "train", tasks,
                               EvalConfig(max_steps=4, bootstrap=100), model=model, make_env=SnapshotLineEnv)
    with dashboard_server(db, tmp_path) as url, browser_page(1500, 2200) as page:
        page.goto(f"{url}/evaluation")
        expect(page.get_by_role("heading", name="Compare models")).to_be_visible(timeout=30_000)
        settle(page)
        expect(page.get_by_text("Not comparable with the baseline")).to_have_count(0)  # same settings
        paired = re.compile(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\] \(4 tasks\)")
        page.wait_for_function(f"() => ({GRID_TEXT})().some(t => t.endsWith('(4 tasks)'))", timeout=30_000)
        cells = page.evaluate(GRID_TEXT)
        assert "baseline" in cells and any(paired.fullmatch(c.strip()) for c in cells), cells
        settle(page)
        page.screenshot(path=tmp_path / "evaluation_paired.png", full_page=True)


def test_an_unvisited_success_leaf_is_not_painted_as_a_failure(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    tree, (_, _, _, d) = solved_tree()
    leaf = add(tree, d, "right", N=0, value_sum=0.0, reward=1.0, terminal="success")  # expanded, never visited
    db = tmp_path / "orchard.db"
    run_id, _ = BENCH.write_run(db, tree, name="unvisited")
    fill = "(id) => { " + BENCH.VEGA_VIEW + """ const v = orchardView();
      const it = v && orchardNodes(v).find(it => Number(it.datum.id) === id); return it ? it.fill : null }"""
    success = tree_chart.OUTCOME_COLORS["success"]
    with dashboard_server(db, tmp_path) as url, browser_page(1500, 1400) as page:
        page.goto(f"{url}/tree?run={run_id}&task={tree.task.id}")
        expect(page.get_by_role("heading", name="Node 0")).to_be_visible(timeout=30_000)
        page.wait_for_function(fill, arg=leaf, timeout=30_000)
        by_q = page.evaluate(fill, leaf)
        assert by_q.lower() == tree_chart.NO_VALUE_COLOR  # "—": no estimate, neutral grey, not a low Q red
        page.get_by_text("Outcome", exact=True).click()
        page.wait_for_function(f"(id) => ({fill})(id) === '{success}'", arg=leaf, timeout=30_000)
        settle(page)
        page.screenshot(path=tmp_path / "unvisited_success.png", full_page=True)


def test_swap_then_approve_and_next_decides_the_swapped_pair_before_its_neighbour(server, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    url, db, runs = server
    with Store(db) as store:
        queues: dict[str, list[str]] = {}
        for pair in store.pairs(run_id=runs["main"], kind="step", status="pending", order="tree"):
            queues.setdefault(pair.task_id, []).append(pair.id)
    task, queue = max(queues.items(), key=lambda kv: len(kv[1]))
    assert len(queue) >= 3, queues
    with browser_page(1500, 2200) as page:
        page.goto(f"{url}/pairs?run={runs['main']}&task={task}&pair={queue[0]}")
        expect(page.get_by_role("heading", name="Preference pairs")).to_be_visible(timeout=30_000)
        settle(page)
        page.get_by_role("button", name="Swap chosen / rejected").click()
        expect(page.get_by_text(f"Swapped chosen and rejected of pair {queue[0]}.")).to_be_visible(timeout=15_000)
        settle(page)
        assert f"pair={queue[0]}" in page.url  # the cursor stays on the swapped pair
        page.get_by_role("button", name="Approve & next").click()
        expect(page.get_by_text(f"Approved pair {queue[0]}.")).to_be_visible(timeout=15_000)
        page.wait_for_url(re.compile(f"pair={queue[1]}"), timeout=15_000)  # its neighbour, not one past it
        with Store(db) as store:
            assert store.pair(queue[0]).status == "approved"
            assert [store.pair(i).status for i in queue[1:3]] == ["pending", "pending"]


def test_a_refinement_build_runs_as_a_job_from_the_page(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    db = tmp_path / "orchard.db"
    Store(db).close()
    with dashboard_server(db, tmp_path) as url, browser_page(1500, 2200) as page:
        page.goto(f"{url}/refinement")
        expect(page.get_by_role("heading", name="Refinement data")).to_be_visible(timeout=30_000)
        settle(page)
        assert page.get_by_role("textbox", name="Model").input_value() == "offline"
        count = page.get_by_role("spinbutton", name="Count")
        count.fill("3")
        count.press("Tab")
        page.locator("[data-testid='stFormSubmitButton'] button").click()
        # The job runs in its own process; the page follows it and shows its rows when it lands.
        expect(page.get_by_text(re.compile(r"^3 refinement samples"))).to_be_visible(timeout=120_000)
        settle(page)
        page.screenshot(path=tmp_path / "refinement_built.png", full_page=True)
    with Store(db) as store:
        [job] = [j for j in store.jobs() if j.kind == "refine"]
        assert job.state == "succeeded" and job.config["model"] == "offline" and job.config["n"] == 3
        assert len(store.samples(kind="refine")) == 3
