"""Logins, roles and the review queue on the dashboard pages (AppTest), on a private copy of the
fixture store with four users: two curators, a viewer and a maintainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit as st
from dash_fixtures import APP, copy_store
from streamlit.testing.v1 import AppTest

from engine import auth
from engine.store import Store

PAIRS = "views/pairs.py"
REVIEW = "views/review.py"
TRAINING = "views/training.py"
PASSWORD = "correct horse battery"
USERS = {"ann": "curator", "bob": "curator", "vic": "viewer", "mia": "maintainer"}


@pytest.fixture()
def db(store_db, tmp_path: Path, monkeypatch) -> Path:
    source, _ = store_db
    path = copy_store(source, tmp_path / "orchard.db")
    monkeypatch.setenv("ORCHARD_DB", str(path))
    with Store(path) as store:
        for name, role in USERS.items():
            auth.add_user(store, name, role, PASSWORD)
    return path


@pytest.fixture()
def exposed():
    """The dashboard as if started with --server.address 0.0.0.0."""
    before = st.get_option("server.address")
    st.config.set_option("server.address", "0.0.0.0")
    yield
    st.config.set_option("server.address", before)


def open_page(page: str, user: str | None = None, password: str = PASSWORD) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(page).run()
    if user is not None:
        log_in(at, user, password)
    assert not at.exception
    return at


def log_in(at: AppTest, user: str, password: str = PASSWORD) -> None:
    at.text_input(key="auth_name").input(user)
    at.text_input(key="auth_password").input(password)
    next(b for b in at.button if b.label == "Log in").click().run()


def texts(at: AppTest) -> str:
    kinds = ("markdown", "caption", "text", "info", "warning", "error", "success", "code")
    return "\n".join(str(e.value) for kind in kinds for e in getattr(at, kind))


def history_who(path: Path, pair_id: str) -> list[str]:
    with Store(path) as store:
        return [h.who for h in store.pair_history(pair_id)]


def test_with_users_a_page_asks_for_a_login_and_no_name_can_be_typed(db) -> None:
    at = open_page(PAIRS)
    assert "Read only: log in" in texts(at)
    assert not any(t.key == "who" for t in at.text_input)  # the curator is never free text
    assert at.button(key="pp_approve").disabled and at.button(key="pp_approve_next").disabled


def test_a_wrong_password_is_one_line_and_lets_nobody_in(db) -> None:
    at = open_page(PAIRS, "ann", password="wrong password!")
    assert "wrong user name or password" in texts(at)
    assert at.button(key="pp_approve").disabled


def test_a_curator_saves_under_their_login(db) -> None:
    at = open_page(PAIRS, "ann")
    assert "Logged in as" in texts(at) and at.session_state["auth_token"]
    pair_id = at.query_params["pair"][0] if isinstance(at.query_params["pair"], list) else at.query_params["pair"]
    at.button(key="pp_approve").click().run()
    assert history_who(db, pair_id)[-1] == "ann"


def test_a_viewer_cannot_save(db) -> None:
    at = open_page(PAIRS, "vic")
    assert "your role (viewer) may not curate" in texts(at)
    assert all(at.button(key=k).disabled for k in ("pp_approve", "pp_reject", "pp_swap", "pp_approve_next"))
    at = open_page(REVIEW, "vic")
    assert "may not curate" in texts(at) and not any(b.key == "rq_claim" for b in at.button)


def test_a_write_checks_the_session_again_when_it_is_made(db) -> None:
    """The page was drawn for a logged-in curator; the session ends before the click: refused."""
    at = open_page(PAIRS, "ann")
    pair_id = at.query_params["pair"]
    before = history_who(db, pair_id)
    with Store(db) as store:
        store.con.execute("UPDATE sessions SET expires_at = 0")
    at.button(key="pp_approve").click().run()
    assert history_who(db, pair_id) == before
    assert "log in first" in texts(at)


def test_beyond_loopback_without_users_nothing_can_be_written(store_db, tmp_path, monkeypatch, exposed) -> None:
    path = copy_store(store_db[0], tmp_path / "orchard.db")
    monkeypatch.setenv("ORCHARD_DB", str(path))
    at = open_page(PAIRS)
    assert at.button(key="pp_approve").disabled and "listens beyond loopback" in texts(at)
    assert not any(t.key == "who" for t in at.text_input)


def test_logging_out_ends_the_session_in_the_store(db) -> None:
    at = open_page(PAIRS, "ann")
    token = at.session_state["auth_token"]
    with Store(db) as store:
        assert store.session_user(token).name == "ann"
    at.button(key="auth_logout").click().run()
    with Store(db) as store:
        assert store.session_user(token) is None
    assert "Logged out" in texts(at) and at.button(key="pp_approve").disabled


def test_an_expired_session_is_ended_and_says_so(db) -> None:
    at = open_page(PAIRS, "ann")
    with Store(db) as store:
        store.con.execute("UPDATE sessions SET expires_at = 0")
    at.run()
    assert "Your session has ended" in texts(at)
    assert at.button(key="pp_approve").disabled


def test_only_a_maintainer_launches_training(db) -> None:
    at = open_page(TRAINING, "ann")
    assert "may not launch jobs" in texts(at)
    at = open_page(TRAINING, "mia")
    assert "may not launch jobs" not in texts(at)


def held(path: Path, who: str) -> list[str]:
    with Store(path) as store:
        return [i for i, _ in store.held("pair", who)]


def test_two_curators_get_their_own_queues_and_a_maintainer_settles_their_disagreement(db) -> None:
    with Store(db) as store:
        store.set_required_reviews(2)
    ann, bob = open_page(REVIEW, "ann"), open_page(REVIEW, "bob")
    ann.button(key="rq_claim").click().run()
    bob.button(key="rq_claim").click().run()
    mine, theirs = held(db, "ann"), held(db, "bob")
    assert len(mine) == 5 and len(theirs) == 5 and not set(mine) & set(theirs)
    first = mine[0]
    ann.button(key=f"rq_approve_{first}").click().run()
    assert "Saved your review" in texts(ann)
    bob.button(key="rq_release").click().run()  # bob gives his back, then gets the half-reviewed one too
    bob.button(key="rq_claim").click().run()
    assert first in held(db, "bob")
    bob.button(key=f"rq_reject_{first}").click().run()
    viewer = open_page(REVIEW, "vic")
    assert f"pair {first}: ann approved, bob rejected" in texts(viewer)
    assert not any(b.key and b.key.startswith("rq_settle") for b in viewer.button)  # a viewer cannot settle
    assert "may not curate" in texts(viewer)
    mia = open_page(REVIEW, "mia")
    mia.button(key=f"rq_settle_no_{first}").click().run()
    with Store(db) as store:
        final = store.final_labels("pair", [first])[first]
        assert (final.label, final.reason) == ("rejected", "settled by mia")
        assert store.disagreements("pair") == []
    assert "Cohen" in str(mia.dataframe[1].value.columns.tolist())


def test_a_review_under_an_expired_lease_is_refused_with_the_reason(db) -> None:
    at = open_page(REVIEW, "ann")
    at.button(key="rq_claim").click().run()
    item = held(db, "ann")[0]
    with Store(db) as store:
        store.con.execute("UPDATE leases SET expires_at = taken_at - 1, taken_at = taken_at - 601")
    # The page still shows the button from its last run; the save is refused and says why.
    at.button(key=f"rq_approve_{item}").click().run()
    assert "your lease on pair" in texts(at) and "(10 min after it was handed to you): not saved" in texts(at)
    with Store(db) as store:
        assert store.decisions("pair") == []


def test_a_maintainer_manages_users_and_a_curator_cannot(db) -> None:
    at = open_page(REVIEW, "ann")
    assert not any(t.key == "rq_user_name" for t in at.text_input)
    at = open_page(REVIEW, "mia")
    at.text_input(key="rq_user_name").input("zoe")
    at.selectbox(key="rq_user_role").select("viewer")
    at.text_input(key="rq_user_password").input(PASSWORD)
    next(b for b in at.button if b.label == "Add user").click().run()
    assert "Added user zoe" in texts(at)
    at.selectbox(key="rq_user_remove").select("ann")
    at.button(key="rq_user_remove_btn").click().run()
    with Store(db) as store:
        assert {u.name: u.role for u in store.users()} == {"bob": "curator", "mia": "maintainer", "vic": "viewer",
                                                            "zoe": "viewer"}


def test_the_queue_hands_out_samples_too(db) -> None:
    at = open_page(REVIEW, "ann")
    at.selectbox(key="rq_kind").select("Samples (refinement, revisions, SFT)").run()
    at.button(key="rq_claim").click().run()
    assert not at.exception
    with Store(db) as store:
        items = [i for i, _ in store.held("sample", "ann")]
    assert items and any(b.key == f"rq_approve_{items[0]}" for b in at.button)
    at.button(key=f"rq_approve_{items[0]}").click().run()
    assert "Saved your review of sample" in texts(at)


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("", False), (None, False), ("192.168.1.5", False), ("example.org", False),
])
def test_which_addresses_count_as_loopback(address, loopback) -> None:
    from dashboard.auth import is_loopback

    assert is_loopback(address) is loopback


@pytest.mark.parametrize("stored", ["two", "99"])
def test_a_tampered_review_setting_is_one_line_and_its_form_still_sets_it_again(db, stored) -> None:
    with Store(db) as store:
        store.con.execute("UPDATE curation_settings SET value=? WHERE key='required_reviews'", (stored,))
        if not store.con.execute("SELECT 1 FROM curation_settings WHERE key='required_reviews'").fetchone():
            store.con.execute("INSERT INTO curation_settings (key, value) VALUES ('required_reviews', ?)", (stored,))
        store.con.commit()
    mia = open_page(REVIEW, "mia")
    assert "is not a whole number from 1 to 20" in texts(mia)
    assert any(e.label == "Users" for e in mia.expander)  # the rest of the maintainer's tools stay
    mia.number_input(key="rq_required").set_value(3).run()
    mia.button(key="rq_required_save").click().run()
    assert not mia.exception
    with Store(db) as store:
        assert store.required_reviews() == 3
    assert "needs 3 independent review(s)" in texts(mia)
