"""The loop as a user drives it in headless Chromium, from an empty database: a bad task range refused at
its field; a search started from the Runs page's form, its tree watched growing live in the Tree explorer
(keeping the zoom) and followed to its end; pairs built on the Preference pairs page and five approved
with the keyboard; a DPO job launched from the Training page on them and followed to its end; the trained
model and the one it started from evaluated from the Evaluation page and compared side by side. Real jobs
on TextCraft with the shipped tiny model (`tiny`, the only one that writes parseable actions: a
random-weights build's tree stops at its first format errors). Screenshots of each step land in pytest's
tmp folder (paths printed, `pytest -s`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_browser import ARGS, CHROMIUM, DOMAINS, MARKER_COUNT, PLOT, dashboard_server, settle

from engine.store import Store, StoreError

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]  # a real browser: `make test-slow`
SUCCEEDED = re.compile(r"state\s+succeeded")


def succeeded(kind: str) -> re.Pattern:
    """A job panel's line for a finished job of `kind` (not a stale panel of the page's last job)."""
    return re.compile(rf"· {kind} on \S+ · state\s+succeeded")


SIMULATIONS = 60  # per task, two tasks, depth 8: the trees grow for a few live redraws
APPROVED = 5
# The tree's node count in the Tree explorer's caption ("N nodes (M shown) · ...").
NODE_COUNT = r"""() => { const c = Array.from(document.querySelectorAll('[data-testid=stCaptionContainer]'))
  .map(e => e.innerText.match(/^(\d+) nodes \(/)).find(m => m); return c ? Number(c[1]) : 0 }"""


@pytest.fixture()
def empty_server(tmp_path: Path):
    db = tmp_path / "orchard.db"
    with dashboard_server(db, tmp_path, {"ORCHARD_HOME": str(tmp_path / "home")}) as url:
        yield url, db


@pytest.mark.slow
def test_the_loop_driven_from_the_pages(empty_server, tmp_path: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    url, db = empty_server
    shots: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2600})

            def shot(name: str) -> None:
                settle(page)
                shots.append(tmp_path / f"{len(shots) + 1:02d}_{name}.png")
                page.screenshot(path=shots[-1], full_page=True)

            # --- a search from the Runs page's form ---------------------------------------------------
            page.goto(url)
            expect(page.get_by_text("No runs yet")).to_be_visible(timeout=30_000)
            page.get_by_label("Tasks", exact=True).fill("5:2")
            page.get_by_role("button", name="Queue the search").click()
            expect(page.get_by_text("bad task range")).to_be_visible(timeout=30_000)
            assert not db.exists()  # refused at the field: nothing written
            shot("runs_bad_range")

            page.get_by_label("Tasks", exact=True).fill("0:2")
            page.locator(".st-key-rs_model input").fill("tiny")
            page.get_by_label("Name", exact=True).fill("browser-search")
            for label, value in (("simulations", str(SIMULATIONS)), ("k", "2"), ("depth limit", "8"),
                                 ("max tokens", "64")):
                page.get_by_label(label, exact=True).fill(value)
            page.keyboard.press("Tab")
            settle(page)
            page.get_by_role("button", name="Queue the search").click()
            run_id = None
            for _ in range(240):  # the run exists once the job's process has loaded the model
                page.wait_for_timeout(500)
                if db.exists():
                    try:
                        with Store(db, readonly=True) as store:
                            run_id = next((r.id for r in store.runs() if r.status == "running"), None)
                    except StoreError:  # the job's process is still creating the store (schema not yet written)
                        continue
                if run_id:
                    break
            assert run_id, "the search did not start"

            # --- its tree grows in the Tree explorer, no reload, keeping the zoom ---------------------
            page.goto(f"{url}/tree?run={run_id}")
            expect(page.get_by_text("Live: the search is running", exact=False)).to_be_visible(timeout=60_000)
            page.wait_for_function(MARKER_COUNT, timeout=30_000)
            first = page.evaluate(NODE_COUNT)
            full, kept = page.evaluate(DOMAINS), None
            for _ in range(10):  # a redraw may land before Streamlit has taken up the zoom: try again
                box = page.locator(PLOT).bounding_box()
                if box is not None:
                    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 3)
                    page.mouse.wheel(0, -300)  # bind: "scales": zoom in
                    page.wait_for_timeout(1000)
                    settle(page)
                    domains = page.evaluate(DOMAINS)
                    if domains and domains[1] - domains[0] < 0.9 * (full[1] - full[0]):
                        kept = domains
                        break
                page.wait_for_timeout(300)
            assert kept, "the zoom was not taken up"
            page.wait_for_function(f"([n]) => ({NODE_COUNT})() > n", arg=[first], timeout=90_000)
            grown = page.evaluate(NODE_COUNT)
            settle(page)
            assert page.evaluate(DOMAINS) == pytest.approx(kept), "a redraw with new nodes lost the zoom"
            shot("tree_live")
            expect(page.get_by_text("run finished · ", exact=False)).to_be_visible(timeout=180_000)
            with Store(db, readonly=True) as store:
                (run,) = store.runs()
                assert run.name == "browser-search" and run.simulations == 2 * SIMULATIONS
                tree_id = store.tree_ids(run.id)[0][0]
                final = len(store.load_tree(tree_id).nodes)
            assert first < grown <= final, (first, grown, final)
            page.goto(url)
            expect(page.get_by_text(SUCCEEDED).first).to_be_visible(timeout=60_000)
            expect(page.get_by_text(re.compile(r"searched\s+finished"))).to_be_visible(timeout=30_000)
            shot("runs_searched")

            # --- pairs built, five approved with the keyboard ----------------------------------------
            page.goto(f"{url}/pairs?run={run.id}")
            expect(page.get_by_role("heading", name="Preference pairs")).to_be_visible(timeout=30_000)
            name = page.get_by_role("textbox", name="Your name")
            name.fill("browser-tester")
            name.press("Enter")
            settle(page)
            page.get_by_role("button", name="Build pairs").click()
            expect(page.get_by_text(succeeded("pairs")).first).to_be_visible(timeout=120_000)
            with Store(db, readonly=True) as store:
                queue = [q.id for q in store.pairs(run_id=run.id, kind="step", order="tree")]
            assert len(queue) > APPROVED, f"{len(queue)} step pairs"
            page.wait_for_url(re.compile(f"pair={queue[0]}"), timeout=30_000)
            shot("pairs_built")
            for i in range(APPROVED):
                settle(page)  # a key press during a rerun could be lost
                page.get_by_role("heading", name="Preference pairs").click()  # focus off any field
                page.keyboard.press("a")  # "Approve & next"
                expect(page.get_by_text(f"Approved pair {queue[i]}.")).to_be_visible(timeout=30_000)
                page.wait_for_url(re.compile(f"pair={queue[i + 1]}"), timeout=30_000)
            expect(page.get_by_text(f"{APPROVED} approved", exact=False).first).to_be_visible(timeout=30_000)
            shot("pairs_approved")
            with Store(db, readonly=True) as store:
                approved = [q for q in store.pairs(run_id=run.id) if q.status == "approved"]
            assert sorted(q.id for q in approved) == sorted(queue[:APPROVED])
            assert {q.updated_by for q in approved} == {"browser-tester"}

            # --- DPO on the approved pairs from the Training page -------------------------------------
            page.goto(f"{url}/training")
            expect(page.get_by_role("heading", name="Training", exact=True)).to_be_visible(timeout=30_000)
            settle(page)  # the defaults: step pairs -> DPO, CPU quick, from tiny, every run
            # The plan before Launch: the approved pairs, their steps, and (so few rows) a confirmation first.
            expect(page.get_by_text(f"Would train on {APPROVED} pairs → {APPROVED} rows", exact=False)).to_be_visible(
                timeout=30_000)
            expect(page.get_by_role("button", name="Launch", exact=True)).to_be_disabled()
            page.get_by_text(f"Train on {APPROVED} rows anyway").click()
            settle(page)
            page.get_by_role("button", name="Launch", exact=True).click()
            expect(page.get_by_text(re.compile(r"Launched job \w+ \(dpo"))).to_be_visible(timeout=30_000)
            expect(page.get_by_text(succeeded("dpo")).first).to_be_visible(timeout=240_000)
            shot("training_succeeded")
            with Store(db, readonly=True) as store:
                (dpo,) = [j for j in store.jobs() if j.kind == "dpo"]
                (model,) = store.models()
            assert dpo.state == "succeeded" and dpo.config["train"]["kinds"] == ["step"]
            trained = model.path

            # --- the trained model and its start evaluated, then compared -----------------------------
            page.goto(f"{url}/evaluation")
            expect(page.get_by_role("heading", name="Evaluation")).to_be_visible(timeout=30_000)
            for which in (trained, "tiny"):
                settle(page)
                field = page.locator(".st-key-ev_model input")
                if not field.is_visible():  # the expander stays open after the first launch
                    page.get_by_text("Launch an evaluation").click()
                if which == trained:  # the form proposes the newest trained model
                    expect(field).to_have_value(trained, timeout=30_000)
                field.fill(which)
                page.get_by_label("Tasks", exact=True).fill("0:1")
                page.get_by_label("max steps", exact=True).fill("2")
                page.get_by_label("max tokens", exact=True).fill("8")
                page.keyboard.press("Tab")  # the last field's value is committed before the submit
                settle(page)  # no rerun in flight: a click then is never swallowed by one
                page.get_by_role("button", name="Launch the evaluation").click()
                expect(page.get_by_text(re.compile(r"Queued job \w+: evaluate"))).to_be_visible(timeout=30_000)
                for _ in range(360):
                    with Store(db, readonly=True) as store:
                        evals = [j for j in store.jobs() if j.kind == "eval"]
                    if evals and evals[-1].final:
                        break
                    page.wait_for_timeout(500)
                assert evals[-1].state == "succeeded", evals[-1].error
                expect(page.get_by_text(succeeded("eval")).first).to_be_visible(timeout=60_000)
            labels = ("tiny", Path(trained).name)
            bars = """() => { const gd = document.querySelector('.st-key-ev_chart .js-plotly-plot');
              return gd && gd._fullData ? gd._fullData.flatMap(t => Array.from(t.x || [])).map(String) : [] }"""
            try:  # one bar per model, side by side
                page.wait_for_function(f"([names]) => {{ const xs = ({bars})();"
                                       " return names.every(n => xs.some(x => x.startsWith(n + ' · '))) }",
                                       arg=[list(labels)], timeout=60_000)
            except PlaywrightTimeout:
                raise AssertionError(f"bars {page.evaluate(bars)}, expected {labels}") from None
            shot("evaluation_compared")
            with Store(db, readonly=True) as store:
                assert [j.kind for j in store.jobs()] == ["search", "pairs", "dpo", "eval", "eval"]
                assert all(j.state == "succeeded" for j in store.jobs())
                assert sorted(e["model"] for e in store.evaluations()) == sorted([trained, "tiny"])
        except BaseException:
            shots.append(tmp_path / "failed.png")
            page.screenshot(path=shots[-1], full_page=True)
            raise
        finally:
            browser.close()
            print("screenshots:", *shots, sep="\n  ")
