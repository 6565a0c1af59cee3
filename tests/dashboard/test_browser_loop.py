"""The loop as a user drives it in headless Chromium, from an empty database: a bad task range refused at
its field, a search started from the Runs page's form and followed live to its end, pairs built from the
Preference pairs page, an evaluation launched from the Evaluation page — real jobs on TextCraft with a
random-weights model. Screenshots of each step land in pytest's tmp folder (paths printed, `pytest -s`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dash_fixtures import APP, ROOT
from test_browser import ARGS, CHROMIUM, free_port, settle, wait_healthy

from engine.store import Store

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)")
SUCCEEDED = re.compile(r"state\s+succeeded")


@pytest.fixture()
def empty_server(tmp_path: Path):
    db = tmp_path / "orchard.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ORCHARD_DB": str(db), "ORCHARD_HOME": str(tmp_path / "home")}
    with open(tmp_path / "streamlit.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
             "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(url, proc)
            yield url, db
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_search_pairs_and_evaluation_launched_and_followed_from_the_pages(empty_server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright
    from tiny_model_fixture import build_tiny_model

    url, db = empty_server
    model = str(build_tiny_model(tmp_path / "model").resolve())
    shots: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2600})

            def shot(name: str) -> None:
                settle(page)
                shots.append(tmp_path / f"{name}.png")
                page.screenshot(path=shots[-1], full_page=True)

            page.goto(url)
            expect(page.get_by_text("No runs yet")).to_be_visible(timeout=30_000)
            page.get_by_label("Tasks", exact=True).fill("5:2")
            page.get_by_role("button", name="Queue the search").click()
            expect(page.get_by_text("bad task range")).to_be_visible(timeout=30_000)
            assert not db.exists()  # refused at the field: nothing written
            shot("runs_bad_range")

            page.get_by_label("Tasks", exact=True).fill("0:2")
            page.locator(".st-key-rs_model input").fill(model)
            page.get_by_label("Name", exact=True).fill("browser-search")
            for label, value in (("simulations", "2"), ("k", "2"), ("depth limit", "2"), ("max tokens", "8")):
                page.get_by_label(label, exact=True).fill(value)
            page.keyboard.press("Tab")
            settle(page)
            page.get_by_role("button", name="Queue the search").click()
            # No reload: the live panel follows the job, and the page rereads the store when it ends.
            expect(page.get_by_text(SUCCEEDED).first).to_be_visible(timeout=180_000)
            expect(page.get_by_text(re.compile(r"searched\s+finished"))).to_be_visible(timeout=30_000)
            shot("runs_searched")
            with Store(db, readonly=True) as store:
                (run,) = store.runs()
                assert run.name == "browser-search" and run.simulations == 4

            page.goto(f"{url}/pairs?run={run.id}")
            expect(page.get_by_role("heading", name="Preference pairs")).to_be_visible(timeout=30_000)
            page.get_by_role("button", name="Build pairs").click()
            expect(page.get_by_text(SUCCEEDED).first).to_be_visible(timeout=120_000)
            shot("pairs_built")

            page.goto(f"{url}/evaluation")
            expect(page.get_by_role("heading", name="Evaluation")).to_be_visible(timeout=30_000)
            page.get_by_text("Launch an evaluation").click()
            page.locator(".st-key-ev_model input").fill(model)
            page.get_by_label("Tasks", exact=True).fill("0:1")
            page.get_by_label("max steps", exact=True).fill("2")
            page.get_by_label("max tokens", exact=True).fill("8")
            page.keyboard.press("Tab")  # the last field's value is committed before the submit
            settle(page)  # no rerun in flight: a click then is never swallowed by one
            page.get_by_role("button", name="Launch the evaluation").click()
            expect(page.get_by_text(SUCCEEDED).first).to_be_visible(timeout=180_000)
            expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
            shot("evaluation")
            with Store(db, readonly=True) as store:
                assert [j.kind for j in store.jobs()] == ["search", "pairs", "eval"]
                assert all(j.state == "succeeded" for j in store.jobs())
                assert len(store.evaluations()) == 1
        finally:
            browser.close()
    print("screenshots:", *shots, sep="\n  ")
