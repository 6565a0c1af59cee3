"""Team curation in a real browser: `streamlit run` on a fixture store with users, headless Chromium,
one browser context (its own cookies and Streamlit session) per person. Two curators log in and each
sees their own queue, a viewer cannot save, a maintainer settles the curators' disagreement, and
logging out ends the session in the store. Needs /usr/bin/chromium and playwright (as test_browser)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from dash_fixtures import build_store
from test_browser import ARGS, CHROMIUM, dashboard_server, settle

from engine import auth
from engine.store import Store

PASSWORD = "correct horse battery"
pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp_path = tmp_path_factory.mktemp("team")
    db = tmp_path / "orchard.db"
    build_store(db)
    with Store(db) as store:
        for name, role in (("ann", "curator"), ("bob", "curator"), ("vic", "viewer"), ("mia", "maintainer")):
            auth.add_user(store, name, role, PASSWORD)
        store.set_required_reviews(2)
    with dashboard_server(db, tmp_path) as url:
        yield url, db


def log_in(page: Any, url: str, path: str, user: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{url}/{path}")
    expect(page.get_by_role("button", name="Log in")).to_be_visible(timeout=30_000)
    page.get_by_role("textbox", name="User name").fill(user)
    page.get_by_role("textbox", name="Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_text(f"Logged in as {user}")).to_be_visible(timeout=15_000)
    settle(page)


def held(db: Path, who: str) -> list[str]:
    with Store(db) as store:
        return [i for i, _ in store.held("pair", who)]


def test_two_curators_a_viewer_and_a_maintainer(server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, db = server
    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            people = {name: browser.new_context(viewport={"width": 1400, "height": 2000}).new_page()
                      for name in ("ann", "bob", "vic", "mia")}
            ann, bob, vic, mia = people.values()

            # Two curators, each their own queue: nobody else's items on either page.
            for name, page in (("ann", ann), ("bob", bob)):
                log_in(page, url, "review", name)
                page.get_by_role("button", name="Get up to 5 items").click()
                expect(page.get_by_text("You hold 5 item(s) now.")).to_be_visible(timeout=15_000)
                settle(page)
            mine, theirs = held(db, "ann"), held(db, "bob")
            assert len(mine) == 5 and len(theirs) == 5 and not set(mine) & set(theirs)
            for page, own, other in ((ann, mine, theirs), (bob, theirs, mine)):
                for item in own:
                    expect(page.get_by_text(f"pair {item} · yours until", exact=False)).to_be_visible()
                for item in other:
                    expect(page.get_by_text(f"pair {item} · yours until", exact=False)).to_have_count(0)
            shots.append(tmp_path / "review_ann.png")
            ann.screenshot(path=shots[-1], full_page=True)

            # They disagree on one pair: ann approves it, bob (after giving his back) rejects it.
            first = mine[0]
            ann.locator(f".st-key-rq_approve_{first} button").click()
            expect(ann.get_by_text(f"Saved your review of pair {first}: approved.")).to_be_visible(timeout=15_000)
            bob.get_by_role("button", name="Give my items back").click()
            expect(bob.get_by_text("Gave 5 item(s) back to the queue.")).to_be_visible(timeout=15_000)
            bob.get_by_role("button", name="Get up to 5 items").click()
            expect(bob.get_by_text(f"pair {first} · yours until", exact=False)).to_be_visible(timeout=15_000)
            bob.locator(f".st-key-rq_reject_{first} button").click()
            expect(bob.get_by_text(f"Saved your review of pair {first}: rejected.")).to_be_visible(timeout=15_000)

            # A viewer reads but cannot save.
            log_in(vic, url, "pairs", "vic")
            expect(vic.get_by_text("Read only: your role (viewer) may not curate.")).to_be_visible()
            expect(vic.get_by_role("button", name="Approve & next")).to_be_disabled()
            expect(vic.get_by_role("button", name="Reject", exact=True)).to_be_disabled()
            shots.append(tmp_path / "pairs_viewer.png")
            vic.screenshot(path=shots[-1], full_page=True)

            # A maintainer settles the disagreement.
            log_in(mia, url, "review", "mia")
            expect(mia.get_by_text(f"pair {first}: ann approved, bob rejected")).to_be_visible()
            shots.append(tmp_path / "review_maintainer.png")
            mia.screenshot(path=shots[-1], full_page=True)
            mia.locator(f".st-key-rq_settle_no_{first} button").click()
            expect(mia.get_by_text(f"Settled pair {first}: rejected.")).to_be_visible(timeout=15_000)
            with Store(db) as store:
                final = store.final_labels("pair", [first])[first]
                assert (final.label, final.reason) == ("rejected", "settled by mia")
                assert store.pair(first).status == "rejected"

            # Logging out ends the session: in the store, and the page asks for a login again.
            with Store(db) as store:
                live = store.con.execute("SELECT COUNT(*) FROM sessions WHERE user_name='ann' AND ended_at IS NULL")
                assert live.fetchone()[0] == 1
            ann.get_by_role("button", name="Log out").click()
            expect(ann.get_by_role("button", name="Log in")).to_be_visible(timeout=15_000)
            expect(ann.get_by_text(re.compile("Read only: log in"))).to_be_visible()
            with Store(db) as store:
                live = store.con.execute("SELECT COUNT(*) FROM sessions WHERE user_name='ann' AND ended_at IS NULL")
                assert live.fetchone()[0] == 0
            ann.reload()
            expect(ann.get_by_role("button", name="Log in")).to_be_visible(timeout=30_000)
        finally:
            browser.close()
    print("screenshots:", *shots, sep="\n  ")
