"""The Runs page's Resume asks for the stored model spec to be typed again before $OPENAI_API_KEY may
go to its server, also when the stored spec starts with a space (issue 25, item 4: the page checked
the raw text, the loader strips it)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from canned_http import canned_server
from dash_fixtures import APP
from streamlit.testing.v1 import AppTest

from engine.config import SearchConfig
from engine.envs.registry import env_factory
from engine.jobs.runner import JobRunner
from engine.store import Store


@pytest.mark.parametrize("pad", ["", " ", "\t"])
def test_resume_of_a_stored_openai_spec_needs_it_typed_again(tmp_path: Path, monkeypatch, pad: str) -> None:
    db = tmp_path / "orchard.db"
    monkeypatch.setenv("ORCHARD_DB", str(db))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setattr(JobRunner, "poll", lambda self, device=None: [])  # a queued job would stay queued
    headers: list[dict[str, str]] = []
    with canned_server(lambda method, path, body: (401, b"{}"), headers) as url:
        with Store(db) as store:
            run_id = store.create_run("shared", "textcraft", f"{pad}openai:{url}/v1#m", asdict(SearchConfig()),
                                      env_factory("textcraft")().tasks("train")[:1])
            store.set_run_status(run_id, "interrupted")
        at = AppTest.from_file(str(APP), default_timeout=60).run()
        assert not at.exception, at.exception
        next(b for b in at.button if b.label == "Resume").click()
        at.run()
        assert not at.exception
        assert "type the spec again" in "\n".join(e.value for e in at.error), [e.value for e in at.error]
        with Store(db, readonly=True) as store:
            assert store.jobs() == []  # nothing queued: no worker will send the key
        assert headers == []
