"""DNS rebinding (issue 25, item 3): a page of another origin whose name is re-resolved to 127.0.0.1
reaches a loopback-bound dashboard with its own name in the Host header. Two locks: Streamlit's
`server.allowedHosts` (dashboard/.streamlit/config.toml) refuses the WebSocket of any other name, and
the app grants the single local user only to a session opened by a loopback name (dashboard.auth),
so even with the first lock off (`--server.allowedHosts '*'`) such a page is read only.

The real server is started from another directory (its config is the one beside app.py); the
browser test maps the name with Chromium's resolver rules, as a rebinding DNS server would.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from dash_fixtures import ROOT

from dashboard.auth import is_loopback_host

CHROMIUM = Path("/usr/bin/chromium")
REBOUND = "rebind.test"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1:8501", True), ("127.0.0.1", True), ("localhost:8501", True), ("LOCALHOST", True),
    ("[::1]:8501", True), ("127.0.0.2:80", True),
    ("rebind.test:8501", False), ("localhost.rebind.test", False), ("127.0.0.1.rebind.test:8501", False),
    ("0.0.0.0:8501", False), ("192.168.1.5:8501", False), ("", False), (None, False), ("[::1", False),
    ("127.0.0.1:99999", False), ("user@127.0.0.1", False), ("127.0.0.1/x", False),
])
def test_which_host_headers_name_loopback(host: str | None, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@contextlib.contextmanager
def dashboard(tmp_path: Path, *flags: str) -> Iterator[int]:
    """The dashboard (an empty database, no users) started from `tmp_path`, not the repository (its
    Streamlit config is the one beside app.py); yields its port once it answers."""
    from test_browser import dashboard_server

    env = {"ORCHARD_HOME": str(tmp_path / "home"),  # this tree's engine, whatever the working directory
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with dashboard_server(tmp_path / "orchard.db", tmp_path, env=env, flags=flags, cwd=tmp_path) as url:
        yield int(url.rsplit(":", 1)[1])


def upgrade_status(port: int, host: str) -> str:
    """The status line the server answers to a browser's WebSocket upgrade sent with `host`."""
    request = (f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               "Sec-WebSocket-Protocol: streamlit\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request.encode())
        return s.recv(4096).decode(errors="replace").splitlines()[0]


@pytest.mark.slow
def test_the_websocket_of_a_rebound_name_is_refused(tmp_path: Path) -> None:
    with dashboard(tmp_path) as port:
        assert " 101 " in upgrade_status(port, f"127.0.0.1:{port}")
        assert " 101 " in upgrade_status(port, f"localhost:{port}")
        refused = upgrade_status(port, f"{REBOUND}:{port}")
        assert " 101 " not in refused, refused


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)")
def test_a_rebound_page_is_read_only_even_where_its_websocket_is_accepted(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--no-first-run", f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]
    with dashboard(tmp_path, "--server.allowedHosts", "*") as port, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            page = browser.new_page()
            page.goto(f"http://{REBOUND}:{port}/")
            expect(page.get_by_role("heading", name="Runs")).to_be_visible(timeout=60_000)
            expect(page.get_by_text(f"this page was opened as {REBOUND}")).to_be_visible()
            page.get_by_role("button", name="Queue the search").click()
            expect(page.get_by_text("log in first")).to_be_visible()
            page.goto(f"http://127.0.0.1:{port}/")  # the same server by its loopback name: the local user
            expect(page.get_by_role("heading", name="Runs")).to_be_visible(timeout=60_000)
            expect(page.get_by_text("User name")).to_have_count(0)  # no login form: the local user
            expect(page.get_by_text("this page was opened as")).to_have_count(0)
        finally:
            browser.close()
    assert not (tmp_path / "orchard.db").exists() or _no_jobs(tmp_path / "orchard.db")


def _no_jobs(db: Path) -> bool:
    from engine.store import Store

    with Store(db, readonly=True) as store:
        return store.jobs() == []
