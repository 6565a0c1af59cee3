"""The launch forms check who may launch BEFORE they probe anything (issue 25, item 1): with users
defined, an anonymous visitor or a viewer who names an "internal service" as the env server or the
model server makes the dashboard send it nothing, and a model folder that exists is refused with
the same words as one that does not; a maintainer's probe error says the status and the length of
a refused reply, never its text."""
# ruff: noqa: F811 - `db` is test_team_pages' fixture (the fixture store with a viewer and a maintainer)

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from canned_http import canned_server
from dash_fixtures import APP
from streamlit.testing.v1 import AppTest
from test_team_pages import db, log_in  # noqa: F401 - users vic (viewer) and mia (maintainer)

from engine.store import Store

EVALUATION = "views/evaluation.py"
SECRET = "TOP-SECRET-ADMIN-PAGE"


@pytest.fixture()
def internal() -> Iterator[tuple[str, list[str]]]:
    """The "internal service": a loopback server that counts the requests it gets and answers a
    body nobody outside should read."""
    seen: list[str] = []

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        seen.append(f"{method} {path}")
        return 500, f'{{"detail": "{SECRET}"}}'.encode()

    with canned_server(answer) as url:
        yield url, seen


@pytest.fixture()
def listener() -> Iterator[tuple[str, list[object]]]:
    """HOST:PORT of a TCP listener that counts the connections made to it (the Ray probe's connect)."""
    accepted: list[object] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        s.settimeout(0.1)
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = s.accept()
                except OSError:
                    continue
                accepted.append(conn)
                conn.close()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        yield f"127.0.0.1:{s.getsockname()[1]}", accepted
        stop.set()
        thread.join(2)


def open_page(page: str | None = None, user: str | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    if page is not None:
        at.switch_page(page).run()
    if user is not None:
        log_in(at, user)
    assert not at.exception, at.exception
    return at


def shown(at: AppTest) -> str:
    kinds = ("markdown", "caption", "text", "info", "warning", "error", "success", "code")
    return "\n".join(str(e.value) for kind in kinds for e in getattr(at, kind)).replace("\\", "")


def new_search(at: AppTest, env_arg: str = "", model: str = "tiny", ray: str | None = None) -> None:
    if env_arg:
        at.selectbox(key="rs_env").select("agentgym")
        at.text_input(key="rs_env_arg").set_value(env_arg)
    at.text_input(key="rs_model").set_value(model)
    if ray is not None:
        at.checkbox(key="rs_ray").check()
        at.text_input(key="rs_ray_address").set_value(ray)
    next(b for b in at.button if b.label == "Queue the search").click()
    at.run()


def new_evaluation(at: AppTest, env_arg: str = "", model: str = "tiny") -> None:
    if env_arg:
        at.selectbox(key="ev_env_new").select("agentgym")
        at.text_input(key="ev_env_arg").set_value(env_arg)
    at.text_input(key="ev_model").set_value(model)
    next(b for b in at.button if b.label == "Launch the evaluation").click()
    at.run()


@pytest.mark.parametrize("user", [None, "vic"])
def test_a_visitor_without_the_right_makes_the_runs_form_probe_nothing(db, internal, listener, user) -> None:
    url, seen = internal
    at = open_page(user=user)
    new_search(at, env_arg=f"{url}/internal/admin", model=f"openai:{url}/v1#m", ray=listener[0])
    assert seen == [] and listener[1] == []  # not one request, not one connection
    text = shown(at)
    assert SECRET not in text
    assert "not queued" in text and ("log in" in text or "viewer" in text), text
    with Store(db) as store:
        assert store.jobs() == []


@pytest.mark.parametrize("user", [None, "vic"])
def test_a_visitor_without_the_right_makes_the_evaluation_form_probe_nothing(db, internal, user) -> None:
    url, seen = internal
    at = open_page(EVALUATION, user=user)
    new_evaluation(at, env_arg=f"{url}/internal/admin", model=f"openai:{url}/v1#m")
    assert seen == []
    text = shown(at)
    assert SECRET not in text and "not queued" in text, text


def test_a_model_folder_that_exists_is_refused_as_one_that_does_not(db, tmp_path: Path) -> None:
    """No file-existence oracle: the anonymous visitor reads the same words for both folders."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    answers = []
    for model in (str(folder), str(tmp_path / "missing")):
        at = open_page()
        new_search(at, model=model)
        answers.append("\n".join(e.value for e in at.error))
    assert answers[0] == answers[1] and "log in" in answers[0]


def test_a_maintainers_probe_error_names_the_status_not_the_reply(db, internal) -> None:
    url, seen = internal
    at = open_page(user="mia")
    new_search(at, env_arg=f"{url}/internal/admin")
    assert seen  # the maintainer's probe did reach the server
    text = shown(at)
    assert SECRET not in text
    assert "HTTP 500" in text and "not shown" in text, text
    at = open_page(EVALUATION, user="mia")
    new_evaluation(at, env_arg=f"{url}/internal/admin")
    text = shown(at)
    assert SECRET not in text and "HTTP 500" in text, text


@pytest.mark.parametrize("user", [None, "vic"])
def test_the_training_plan_checks_no_model_folder_for_a_visitor_without_the_right(db, tmp_path: Path, user) -> None:
    """The Training page's plan (rows, epochs, steps) reads the chosen model folder: it is computed only
    for a user who may launch, so a visitor learns nothing of which folders exist."""
    from engine.store import ModelRecord

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with Store(db) as store:
        store.save_model(ModelRecord(path=str(folder), name="m", kind="fixture"))
    at = open_page("views/training.py", user=user)
    at.selectbox(key="tr_model").set_value(str(folder)).run()
    text = shown(at)
    assert "Would train on" not in text and "No plan" not in text, text
    assert at.button(key="tr_launch").disabled
    at = open_page("views/training.py", user="mia")  # a maintainer sees the plan
    assert "Would train on" in shown(at) or "No plan" in shown(at)
