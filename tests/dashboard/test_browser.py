"""Real-browser tests: `streamlit run` on a fixture store, headless Chromium: a real click on a node in the
Tree explorer, and approving preference pairs (by click and by keyboard shortcut) on the curation pages.

Needs the Debian `chromium` package (/usr/bin/chromium) and the `playwright` Python package (no
browser download: we launch the system Chromium). Screenshots of each page land in pytest's tmp folder
for each test (paths printed; see them with `pytest -s`); the viewport is tall because Streamlit
scrolls inside the page, which full-page screenshots do not follow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dash_fixtures import APP, JUDGE_BAD, ROOT, build_store

from engine.store import Store

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]  # a real browser: `make test-slow`



def _bench():
    """bench/dashboard.py as a module: its synthetic trees, and the page scripts that find the Tree
    explorer's Vega view and its node marks (shared, so the bench and these tests read the same)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_dashboard", ROOT / "bench" / "dashboard.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


BENCH = _bench()
MARKER_XY = BENCH.MARKER_OF  # (node id) -> its marker's page position, or null when it is not drawn
REVEAL_XY = BENCH.REVEAL_OF  # the same, after scrolling the marker into view
MARKER_COUNT = BENCH.MARKERS  # the node marks drawn
DOMAINS = BENCH.DOMAINS  # the tree chart's zoom: [x lo, x hi, y lo, y hi]
PLOT = '[data-testid="stVegaLiteChart"] >> nth=-1'  # the tree (a run overview, when drawn, comes first)


# Streamlit is idle: no "running" icon, no element left stale (greyed) by the last rerun.
IDLE = """() => !document.querySelector('[data-testid="stStatusWidgetRunningIcon"], [data-stale="true"]')"""


def settle(page: Any, pause_ms: int = 500) -> None:
    """Wait until the current rerun has finished drawing (before a screenshot)."""
    page.wait_for_timeout(pause_ms)
    page.wait_for_function(IDLE, timeout=30_000)
    page.wait_for_timeout(300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError("streamlit did not become healthy")


@contextlib.contextmanager
def dashboard_server(db: Path, log_dir: Path, env: dict[str, str] | None = None, flags: tuple[str, ...] = (),
                     cwd: Path = ROOT) -> Iterator[str]:
    """`streamlit run` of the dashboard on `db` (127.0.0.1, a free port; more `flags`, started in
    `cwd`), healthy; yields its URL and stops it after. Its output goes to `log_dir`/streamlit.log."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_dir / "streamlit.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
             "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             *flags],
            cwd=cwd, env={**os.environ, "ORCHARD_DB": str(db), **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(url, proc)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def browser_page(width: int = 1500, height: int = 2200) -> Iterator[Any]:
    """A page of a headless Debian Chromium (closed after), `width` x `height`."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def fixture_server(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[str, Path, dict[str, str]]]:
    """The dashboard on a fresh copy of the fixture store (dash_fixtures.build_store): (URL, db, runs)."""
    tmp_path = tmp_path_factory.mktemp(name)
    db = tmp_path / "orchard.db"
    runs = build_store(db)
    with dashboard_server(db, tmp_path) as url:
        yield url, db, runs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One server for the module (starting one costs seconds); the curation and training tests write."""
    yield from fixture_server(tmp_path_factory, "server")


def test_click_on_a_node_opens_it_in_the_inspector(server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright  # the [dev] extra installs it

    url, db, runs = server
    with Store(db) as store:
        tree = store.load_tree(store.tree_id(runs["main"], "goal-4"))
    target = max((n for n in tree.nodes if n.action is not None), key=lambda n: (n.depth, n.id))
    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.goto(url)
            expect(page.get_by_role("heading", name="Runs")).to_be_visible(timeout=30_000)
            expect(page.get_by_role("combobox", name="Run")).to_have_value(re.compile("fixture-run"), timeout=30_000)
            page.wait_for_timeout(500)  # the data grid draws on a canvas
            shots.append(tmp_path / "runs.png")
            page.screenshot(path=shots[-1], full_page=True)

            # Selecting the first row (the newest run) of the runs table opens it in the Tree explorer.
            grid = page.get_by_test_id("stDataFrame").bounding_box()
            page.mouse.click(grid["x"] + 15, grid["y"] + 35 + 17)  # row-selection cell of row 1
            expect(page.get_by_role("heading", name="Tree explorer")).to_be_visible(timeout=30_000)
            page.wait_for_url(re.compile(f"run={runs['main']}"), timeout=15_000)

            page.goto(f"{url}/tree?run={runs['main']}&task=goal-4")  # a shared link
            expect(page.get_by_role("heading", name="Node 0")).to_be_visible(timeout=30_000)
            page.wait_for_function(MARKER_COUNT, timeout=30_000)
            shots.append(tmp_path / "tree_explorer.png")
            page.screenshot(path=shots[-1], full_page=True)

            xy = page.evaluate(REVEAL_XY, target.id)
            assert xy is not None, f"node {target.id} is not in the plot"
            page.mouse.move(xy["x"], xy["y"])
            page.wait_for_timeout(300)
            page.mouse.click(xy["x"], xy["y"])
            expect(page.get_by_role("heading", name=f"Node {target.id}")).to_be_visible(timeout=15_000)
            assert f"node={target.id}" in page.url
            expect(page.get_by_text(target.observation).first).to_be_visible()
            shots.append(tmp_path / "tree_explorer_clicked.png")
            page.screenshot(path=shots[-1], full_page=True)

            # The path table is selectable too: its first row is the root. Measured once the rerun the
            # click started has drawn (under load the tables still move until then).
            settle(page)
            path_table = page.get_by_test_id("stDataFrame").nth(1).bounding_box()  # siblings, then path
            page.mouse.click(path_table["x"] + 15, path_table["y"] + 35 + 17)
            expect(page.get_by_role("heading", name="Node 0")).to_be_visible(timeout=15_000)
            assert "node=0" in page.url
        finally:
            browser.close()
    print("screenshots:", *shots, sep="\n  ")


def test_approve_pairs_in_the_browser_and_screenshot_the_data_pages(server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, db, runs = server
    with Store(db) as store:
        queue = [p.id for p in store.pairs(run_id=runs["main"], task_id="goal-4", kind="step")]
        revision = next(s for s in store.samples(kind="revision")
                        if any(j["answer"] == JUDGE_BAD for j in s.source["judgements"]))
        refine = next(s for s in store.samples(kind="refine") if s.task.id == "apprentice")
    shots, dialogs = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))  # an alert() would be XSS
            page.goto(f"{url}/pairs?run={runs['main']}&task=goal-4")
            expect(page.get_by_role("heading", name="Preference pairs")).to_be_visible(timeout=30_000)
            name = page.get_by_role("textbox", name="Your name")
            name.fill("browser-tester")
            name.press("Enter")
            settle(page)
            shots.append(tmp_path / "pairs.png")
            page.screenshot(path=shots[-1], full_page=True)

            page.get_by_role("button", name="Approve & next").click()
            expect(page.get_by_text(f"Approved pair {queue[0]}.")).to_be_visible(timeout=15_000)
            page.wait_for_url(re.compile(f"pair={queue[1]}"), timeout=15_000)
            page.get_by_role("heading", name="Preference pairs").click()  # focus off the name field
            page.keyboard.press("a")  # the "approve & next" shortcut
            expect(page.get_by_text(f"Approved pair {queue[1]}.")).to_be_visible(timeout=15_000)
            page.wait_for_url(re.compile(f"pair={queue[2]}"), timeout=15_000)
            with Store(db) as store:
                for pair_id in queue[:2]:
                    stored = store.pair(pair_id)
                    assert (stored.status, stored.updated_by) == ("approved", "browser-tester")
                assert store.pair(queue[2]).status == "pending"
            settle(page)
            shots.append(tmp_path / "pairs_approved.png")
            page.screenshot(path=shots[-1], full_page=True)

            page.goto(f"{url}/trajectories?run={runs['main']}&task={revision.task.id}&sample={revision.id}")
            spliced = page.get_by_role("heading", name="Spliced revision trajectory")
            expect(spliced).to_be_visible(timeout=30_000)
            expect(page.get_by_text("moving left goes away from the goal", exact=False).first).to_be_visible()
            settle(page)
            shots.append(tmp_path / "trajectories.png")
            page.screenshot(path=shots[-1], full_page=True)

            page.goto(f"{url}/refinement?sample={refine.id}")
            expect(page.get_by_role("heading", name="Trajectory", exact=True)).to_be_visible(timeout=30_000)
            expect(page.get_by_text("<script>alert(1)</script> **Nothing** happens.").first).to_be_visible()
            settle(page)
            shots.append(tmp_path / "refinement.png")
            page.screenshot(path=shots[-1], full_page=True)
            assert not dialogs, f"page script ran: {dialogs}"
        finally:
            browser.close()
    print("screenshots:", *shots, sep="\n  ")


def test_a_running_job_updates_live_and_is_cancelled_from_the_training_page(server, tmp_path: Path) -> None:
    """The Training page's progress redraws by itself (st.fragment run_every) while a real job
    process advances, and its Cancel button stops the process. Then the Evaluation page."""
    from doubles import ScriptedGenerator, SnapshotLineEnv
    from playwright.sync_api import expect, sync_playwright

    from engine.evaluate import EvalConfig, evaluate_and_store
    from engine.jobs.runner import JobRunner

    url, db, _ = server
    with Store(db) as store:
        evaluate_and_store(store, ScriptedGenerator(p_right=0.8), "line", "train", SnapshotLineEnv().tasks()[:3],
                           EvalConfig(mode="sampled", seeds=(0, 1), max_steps=6, bootstrap=100),
                           model="/models/scripted", make_env=SnapshotLineEnv)
        job = JobRunner(store).submit("probe", {"steps": 600, "seconds": 0.25}, device="cpu")
    step_text = re.compile(r"probe (\d+)/600")
    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.goto(f"{url}/training?job={job.id}")
            progress = page.get_by_text(step_text).first
            expect(progress).to_be_visible(timeout=30_000)
            first = int(step_text.search(progress.inner_text()).group(1))
            # No reload and no click: only the fragment's timer can bring a later step onto the page.
            page.wait_for_function(
                """([first]) => { const m = document.body.innerText.match(/probe (\\d+)\\/600/);
                                  return m && Number(m[1]) >= first + 8; }""", arg=[first], timeout=30_000)
            settle(page)
            shots.append(tmp_path / "training.png")
            page.screenshot(path=shots[-1], full_page=True)
            page.get_by_role("button", name="Cancel job").click()
            expect(page.get_by_text(f"Job {job.id} is cancelled.")).to_be_visible(timeout=30_000)
            with Store(db, readonly=True) as store:
                assert store.job(job.id).state == "cancelled"

            page.goto(f"{url}/evaluation")
            expect(page.get_by_role("heading", name="Evaluation")).to_be_visible(timeout=30_000)
            expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
            settle(page)
            shots.append(tmp_path / "evaluation.png")
            page.screenshot(path=shots[-1], full_page=True)
        finally:
            browser.close()
    print("screenshots:", *shots, sep="\n  ")


# --- the Tree explorer on a big tree, and following a running search -------------------------------------

HOVER_PAYLOAD = "<img src=x onerror=alert(1)> <b>zqbold</b> &amp; **zqbold**"


def synthetic_tree(n: int):
    """The benchmark's MCTS-shaped tree of about n nodes (bench/dashboard.py)."""
    return BENCH.synthetic_tree(n, seed=1), BENCH.write_run


@pytest.fixture(scope="module")
def big_server(tmp_path_factory: pytest.TempPathFactory):
    """A server on a store with a finished 10k-node run and a small run still 'running'."""
    tmp_path = tmp_path_factory.mktemp("big")
    db = tmp_path / "orchard.db"
    big, write_run = synthetic_tree(10_000)
    big_run, _ = write_run(db, big, name="big")
    small, _ = synthetic_tree(40)
    small.nodes[1].action = dataclasses.replace(small.nodes[1].action, command=HOVER_PAYLOAD)  # for the tooltip
    live_run, _ = write_run(db, small, name="live")
    with Store(db) as store:
        store.set_run_status(live_run, "running")
    with dashboard_server(db, tmp_path) as url:
        yield url, db, {"big": (big_run, big), "live": (live_run, small)}


@pytest.mark.slow
def test_a_10k_node_tree_is_drawn_in_part_and_a_click_selects_a_node(big_server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, _, runs = big_server
    run_id, tree = runs["big"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            started = time.perf_counter()
            page.goto(f"{url}/tree?run={run_id}&task={tree.task.id}")
            page.wait_for_function(MARKER_COUNT, timeout=60_000)
            drawn = time.perf_counter() - started
            markers = page.evaluate(MARKER_COUNT)
            assert 0 < markers <= 3000, f"{markers} markers drawn for a {len(tree.nodes)}-node tree"
            expect(page.get_by_text(f"{len(tree.nodes)} nodes ({markers} shown)", exact=False)).to_be_visible()
            target = max((n for n in tree.nodes[1:] if n.N), key=lambda n: (n.N, -n.id))  # drawn: most visited
            xy = page.evaluate(REVEAL_XY, target.id)  # the grown chart scrolls: bring the marker into view
            assert xy is not None, f"node {target.id} is not drawn"
            assert 0 <= xy["x"] < 1500 and 0 <= xy["y"] < 1400, f"node {target.id}'s marker is out of view: {xy}"
            page.mouse.move(xy["x"], xy["y"])
            page.mouse.click(xy["x"], xy["y"])
            expect(page.get_by_role("heading", name=f"Node {target.id}", exact=True)).to_be_visible(timeout=30_000)
            interactive = time.perf_counter() - started
            assert f"node={target.id}" in page.url
            expect(page.get_by_text(target.observation).first).to_be_visible()
            settle(page)
            page.screenshot(path=tmp_path / "tree_10k.png", full_page=True)
        finally:
            browser.close()
    print(f"10k-node tree: drawn {drawn:.2f} s, click answered {interactive:.2f} s after navigation")
    # Generous on a shared CI machine; bench/dashboard.py reports the figures against the 1 s goal.
    assert interactive < 45, f"navigation -> click answered took {interactive:.1f} s"


def test_hover_shows_an_action_as_text(big_server) -> None:
    """Vega's tooltip writes the escaped text (vega-tooltip's sanitize: & and <) into its box: the
    command shows literally, and no element or script comes of it."""
    from playwright.sync_api import sync_playwright

    url, _, runs = big_server
    run_id, tree = runs["live"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(f"{url}/tree?run={run_id}&task={tree.task.id}")
            page.wait_for_function(MARKER_COUNT, timeout=60_000)
            xy = page.evaluate(MARKER_XY, 1)
            page.mouse.move(xy["x"], xy["y"])
            tip = page.locator("#vg-tooltip-element")
            page.wait_for_function("() => { const e = document.getElementById('vg-tooltip-element');"
                                   " return e && e.classList.contains('visible') }", timeout=10_000)
            assert HOVER_PAYLOAD in tip.inner_text()
            assert tip.locator("img, b, script").count() == 0
            assert not dialogs
        finally:
            browser.close()


def test_the_tree_grows_live_keeping_the_selection_and_the_zoom(big_server, tmp_path: Path) -> None:
    """No reload and no click: the fragment's timer redraws (keeping the zoom while nothing changed) and
    brings the new nodes; the selected node and the search filter stay; when the run ends the page
    stops refreshing."""
    from dash_fixtures import grow_tree
    from playwright.sync_api import expect, sync_playwright

    url, db, runs = big_server
    run_id, tree = runs["live"]
    node = max(n.id for n in tree.nodes if n.action is not None)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.goto(f"{url}/tree?run={run_id}&task={tree.task.id}&node={node}")
            expect(page.get_by_role("heading", name=f"Node {node}", exact=True)).to_be_visible(timeout=60_000)
            expect(page.get_by_text("Live: the search is running", exact=False)).to_be_visible()
            search = page.get_by_role("textbox", name="Search actions")
            search.fill("live")
            search.press("Enter")
            expect(page.get_by_text("0 nodes match the search")).to_be_visible(timeout=30_000)
            page.wait_for_function(MARKER_COUNT, timeout=30_000)
            full = page.evaluate(DOMAINS)
            box = page.locator(PLOT).bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.wheel(0, -400)  # bind: "scales": zoom in
            page.wait_for_timeout(800)
            settle(page)  # the zoom is reported to Streamlit (a rerun), which keeps it across redraws
            zoomed = page.evaluate(DOMAINS)
            assert zoomed[1] - zoomed[0] < 0.9 * (full[1] - full[0]), (full, zoomed)
            stamp = page.get_by_text("Live: the search is running", exact=False).inner_text()
            page.wait_for_function(  # the timer redraws the fragment (its time stamp moves) ...
                "([s]) => { const e = Array.from(document.querySelectorAll('[data-testid=stCaptionContainer]'))"
                ".find(e => e.innerText.startsWith('Live:')); return e && e.innerText !== s }", arg=[stamp],
                timeout=30_000)
            settle(page)
            assert page.evaluate(DOMAINS) == pytest.approx(zoomed), "an unchanged redraw lost the zoom"

            new = grow_tree(db, run_id, tree.task.id, parent=node, n=3)
            expect(page.get_by_text(f"{len(tree.nodes) + 3} nodes (", exact=False)).to_be_visible(timeout=30_000)
            expect(page.get_by_text("3 nodes match the search")).to_be_visible(timeout=30_000)
            page.wait_for_function(f"([n]) => ({MARKER_COUNT})() === n", arg=[len(tree.nodes) + 3], timeout=30_000)
            assert page.evaluate(MARKER_XY, new[-1]) is not None
            expect(page.get_by_role("heading", name=f"Node {node}", exact=True)).to_be_visible()
            assert f"node={node}" in page.url
            # New rows in the same Vega view (the spec is constant); Streamlit keeps the reported zoom.
            settle(page)
            assert page.evaluate(DOMAINS) == pytest.approx(zoomed), "a redraw with new nodes lost the zoom"
            settle(page)
            page.screenshot(path=tmp_path / "tree_live.png", full_page=True)

            with Store(db) as store:
                store.set_run_status(run_id, "finished")
            expect(page.get_by_text("Live: the search is running", exact=False)).to_have_count(0, timeout=30_000)
            expect(page.get_by_text("run finished · ", exact=False)).to_be_visible()
        finally:
            browser.close()


def test_trajectories_tree_click_opens_the_tree_explorer_at_t_prime(server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, db, runs = server
    with Store(db) as store:
        sample = next(s for s in store.samples(kind="revision", run_id=runs["main"])
                      if any(j["answer"] == JUDGE_BAD for j in s.source["judgements"]))
    t_prime = sample.source["t_prime_node"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.goto(f"{url}/trajectories?run={runs['main']}&task={sample.task.id}&sample={sample.id}")
            page.wait_for_function("() => { const gd = document.querySelector('.js-plotly-plot');"
                                   " return gd && gd._fullData && gd._fullData.some(t => t.name.startsWith(\"t'\")) }",
                                   timeout=30_000)
            settle(page)
            page.screenshot(path=tmp_path / "trajectory_tree.png", full_page=True)
            xy = page.evaluate("""() => {
              const gd = document.querySelector('.js-plotly-plot');
              const tr = gd._fullData.find(t => t.name.startsWith("t'"));
              const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
              return {x: box.left + xa._offset + xa.l2p(tr.x[0]), y: box.top + ya._offset + ya.l2p(tr.y[0])};
            }""")
            page.mouse.move(xy["x"], xy["y"])
            page.wait_for_timeout(300)
            page.mouse.click(xy["x"], xy["y"])
            expect(page.get_by_role("heading", name="Tree explorer")).to_be_visible(timeout=30_000)
            expect(page.get_by_role("heading", name=f"Node {t_prime}", exact=True)).to_be_visible(timeout=30_000)
            assert f"node={t_prime}" in page.url and f"task={sample.task.id}" in page.url
        finally:
            browser.close()
