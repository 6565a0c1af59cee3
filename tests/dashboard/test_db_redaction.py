"""The database's password is never on a page (issue 25, item 2): not in the "cannot be opened"
message and its database line, not in the Tree explorer's store line, for the URL's userinfo and
its `?password=` query alike."""

from __future__ import annotations

import socket

import pytest
from dash_fixtures import APP
from streamlit.testing.v1 import AppTest

SECRET = "hunter2xyz"


def everything(at: AppTest) -> str:
    kinds = ("markdown", "caption", "text", "info", "warning", "error", "success", "code")
    return "\n".join(str(e.value) for kind in kinds for e in getattr(at, kind))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("form", ["postgresql://ann:{s}@127.0.0.1:{p}/orchard",
                                  "postgresql://ann@127.0.0.1:{p}/orchard?password={s}&connect_timeout=2"])
def test_the_cannot_open_page_masks_the_password(monkeypatch, form: str) -> None:
    monkeypatch.setenv("ORCHARD_DB", form.format(s=SECRET, p=closed_port()))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    text = everything(at)
    assert "cannot be opened" in text and "***" in text, text
    assert SECRET not in text


@pytest.mark.parametrize("query", [False, True])
def test_the_tree_explorer_store_line_masks_the_password(store_db, pg_server, monkeypatch, query: bool) -> None:
    from pg_fixture import PgSchemas

    from engine.store.copy import copy_store

    schemas = PgSchemas(pg_server)
    try:
        url = schemas.new()  # the fixture's server trusts loopback: a password is accepted and ignored
        copy_store(store_db[0], url)
        user, rest = url.split("://", 1)[1].split("@", 1)
        shown = (f"postgresql://{user}@{rest}&password={SECRET}" if query
                 else f"postgresql://{user}:{SECRET}@{rest}")
        monkeypatch.setenv("ORCHARD_DB", shown)
        at = AppTest.from_file(str(APP), default_timeout=60).run()
        at.switch_page("views/tree_explorer.py").run()
        assert not at.exception, at.exception
        text = everything(at)
        assert "Database" in text and "***" in text, text
        assert SECRET not in text
    finally:
        schemas.drop()
