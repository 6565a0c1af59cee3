"""The web env in a real headless Chromium: an expert books through the Env API, wrong bookings are
graded wrong, bad commands are observations, snapshots equal replays, hostile pages stay bounded text,
only loopback is reachable, and a small MCTS run stores DOM observations and the final screenshot.

One browser for the module (starting Chromium costs about a second).
"""

from __future__ import annotations

import functools
import random
import re
import socket
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from envtools import start_serve_env

from engine.actions import CompositeAction
from engine.config import SearchConfig
from engine.envs import web
from engine.envs.check import check_env
from engine.envs.registry import env_factory
from engine.envs.web import ReplayWebEnv, WebEnv
from engine.envs.web_site import booking
from engine.envs.web_site.expert import elements, expert_command
from engine.llm.base import Completion, SampleRequest
from engine.search.runner import new_run
from engine.store import Store
from engine.tree_nodes import SearchTree, Simulation

pytestmark = pytest.mark.skipif(not Path(web.CHROMIUM).exists(),
                                reason=f"needs Chromium at {web.CHROMIUM} (apt-get install chromium)")
JPEG = b"\xff\xd8\xff"


class _Site(BaseHTTPRequestHandler):
    """A loopback site that records every request it gets. /to-NAME redirects (302) to the URL in
    `targets[NAME]`; /links is a page with an image and a link that redirect; anything else is a page
    naming the site."""

    name = ""
    targets: ClassVar[dict[str, str]] = {}
    hits: ClassVar[list[str]] = []

    def log_message(self, *args) -> None:
        return

    def do_GET(self) -> None:
        self.hits.append(self.path)
        path = self.path.partition("?")[0]
        if path.startswith("/to-"):
            self.send_response(302)
            self.send_header("Location", self.targets[path[4:]])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        inner = ('<img src="/to-b?img" alt="pic"><a href="/to-b">to b</a>' if path == "/links" else "")
        body = f"<html><head><title>Site {self.name}</title></head><body><p>page {self.name}</p>{inner}</body></html>"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _site(name: str, targets: dict[str, str] | None = None):
    handler = type(f"Site{name}", (_Site,), {"name": name, "targets": targets or {}, "hits": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler, f"http://127.0.0.1:{server.server_address[1]}"


class _Sink:
    """A loopback socket that records the first bytes of every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hits: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.hits.append(conn.recv(300))
                except OSError:
                    self.hits.append(b"(connected)")


@pytest.fixture(scope="module")
def outside():
    """The 'outside world': this module's browser resolves every host name to this loopback sink, so
    any connection to an outside host (a page's, a redirect's, or the browser's own background
    traffic) shows up here, and never leaves the machine."""
    sink = _Sink()
    web.shutdown()  # a browser started by another module would not have the rule
    rule = f"--host-resolver-rules=MAP * 127.0.0.1:{sink.port}, EXCLUDE localhost, EXCLUDE 127.0.0.1"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(web, "CHROMIUM_ARGS", [*web.CHROMIUM_ARGS, rule])
        yield sink
    sink.sock.close()


@pytest.fixture(scope="module")
def env(outside):
    e = WebEnv()
    yield e
    web.shutdown()


def run_expert(env, meta: dict, task_id: str, limit: int = 30):
    """Drive `env` with the expert for `meta` (which may differ from the task's); the last Step."""
    obs, step = env.reset(task_id), None
    for _ in range(limit):
        command = expert_command(meta, obs)
        if command is None:
            break
        step = env.step(command)
        assert step.info["ok"], (command, step.observation)
        obs = step.observation
        if step.done:
            return step
    raise AssertionError(f"the expert did not finish: {obs}")


@pytest.mark.slow
def test_expert_books_sample_tasks_in_the_real_browser(env):
    for task in (booking.tasks("train")[7], booking.tasks("test")[3]):
        step = run_expert(env, task.meta, task.id)
        assert (step.reward, step.done, step.progress) == (1.0, True, 1.0)
        assert step.info["criteria"] == dict.fromkeys(booking.CRITERIA, True)
        assert "Reservation confirmed" in step.observation
        (made,) = env.reservations()
        assert (made["restaurant"], made["date"], made["time"]) == (task.meta["restaurant"], task.meta["date"],
                                                                   task.meta["time"])
        shot = step.info["screenshot"]
        assert shot.startswith(JPEG) and 5_000 < len(shot) < 100_000
        over = env.step("CLICK [1]")
        assert over.done and over.reward == 0.0 and "already" in over.observation


@pytest.mark.parametrize("wrong", ["party", "time", "user"])
def test_wrong_bookings_are_graded_wrong(env, wrong):
    task = booking.tasks("train")[2]
    meta = dict(task.meta)
    if wrong == "party":
        meta["party"] = task.meta["party"] % 8 + 1
    elif wrong == "time":
        slots = booking.restaurants()[meta["restaurant"]].slots()
        meta["time"] = slots[(slots.index(meta["time"]) + 1) % len(slots)]
    else:
        meta["user"] = {**meta["user"], "email": "someone.else@example.com"}
    step = run_expert(env, meta, task.id)
    assert step.done and step.reward == 0.0
    expected = {"party": "party_size", "time": "date_time", "user": "user_info"}[wrong]
    assert [c for c, ok in step.info["criteria"].items() if not ok] == [expected]
    assert step.progress == 0.75
    assert step.info["screenshot"].startswith(JPEG)


def test_progress_is_latched_and_bad_commands_are_clear_observations(env):
    task = booking.tasks("train")[4]
    obs = env.reset(task.id)
    assert obs.startswith("Page: Home · Tablefinder\nURL: http://127.0.0.1:")
    ids = {label: i for i, _, label, _ in elements(obs)}
    for command, says in [
        ("CLICK [999]", "no element [999]"),
        ("TYPE [x] [hi]", "give an element id"),
        ("FLY [3]", "unknown command"),
        ("SCROLL [SIDEWAYS]", "SCROLL [UP]"),
        (f"CLICK [{ids['Date']}]", "is a select"),
        (f"TYPE [{ids['Date']}] [July 4]", "No single option"),
        (f"TYPE [{ids['Tablefinder']}] [x]", "not a text field"),
        ("GOTO [https://example.com/]", "GOTO refused: https://example.com is not the site's origin"),
        ("GOTO [file:///etc/passwd]", "GOTO refused: the file scheme"),
    ]:
        step = env.step(command)
        assert not step.info["ok"] and says in step.observation, (command, step.observation[:200])
        assert "Page: Home" in step.observation  # the page is still shown after the message
    step = env.step("ASK_USER_HELP")
    assert step.info["ok"] and task.meta["user"]["email"] in step.observation
    # walk to the restaurant page with the right date/time/party: progress 0.5, latched after leaving
    step = env.step(f"GOTO [/r/{task.meta['restaurant']}?date={task.meta['date']}&time={task.meta['time']}"
                    f"&party={task.meta['party']}]")
    assert step.info["ok"] and step.progress == 0.5
    step = env.step("GOTO [/]")
    assert step.progress == 0.5 and step.info["criteria"]["date_time"] is False


def _expert_commands(task) -> list[str]:
    """The expert's booking commands for `task`, found by driving a separate env."""
    commands: list[str] = []
    with WebEnv() as driver:
        obs = driver.reset(task.id)
        while (command := expert_command(task.meta, obs)) is not None and len(commands) < 30:
            commands.append(command)
            step = driver.step(command)
            obs = step.observation
            if step.done:
                break
    return commands


@pytest.mark.parametrize("cls", [WebEnv, ReplayWebEnv])
@pytest.mark.slow
def test_the_env_contract_holds_in_the_real_browser(env, cls):
    """check_env on expert bookings: determinism, replay == snapshot (URL, form values, scroll, site
    session), no aliasing, the step after the confirmation, close."""
    env.reset(booking.tasks()[0].id)  # the module's env keeps the browser up meanwhile
    checked = check_env(cls(), commands=_expert_commands, max_tasks=2 if cls is WebEnv else 1, max_steps=30)
    assert "step-after-done" in checked and "close" in checked
    assert ("snapshot-not-aliased" in checked) == (cls is WebEnv)


@pytest.mark.slow
def test_close_releases_the_page_and_the_last_one_stops_the_browser(env):
    task = booking.tasks()[0]
    env.reset(task.id)
    other = WebEnv()
    other.reset(task.id)
    rt = web._RUNTIME
    other.close()
    other.close()
    assert other._page is None and web._RUNTIME is rt and rt.browser.is_connected()  # env still holds one
    env.close()
    assert web._RUNTIME is None and not rt.browser.is_connected()
    assert env.reset(task.id).startswith("Page: Home")  # a closed env starts again on reset


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        return


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory):
    """A loopback server with a hostile page: scripts, huge attributes, external requests, ~5 MB."""
    root = tmp_path_factory.mktemp("hostile")
    big_attr = "B" * 300_000
    rows = "".join(f"<p>row {i} " + "w" * 80 + "</p>" for i in range(50_000))
    (root / "hostile.html").write_text(
        "<html><head><title>Hostile <script>alert(1)</script></title>"
        "<script>document.title = 'PWNED'; document.body.innerHTML = 'PWNED';</script></head><body>"
        '<p>Literal: &lt;script&gt;alert("xss")&lt;/script&gt; **bold** [link](http://example.com)</p>'
        f'<div data-x="{big_attr}"><button aria-label="{big_attr}">ok</button>'
        f'<input type="text" value="{big_attr}" aria-label="field"></div>'
        '<img src="http://example.com/tracker.png"><script>while (true) {}</script>'
        f"<p>{'X' * 1_000_000}</p>{rows}</body></html>", encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietFiles, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", (root / "hostile.html").stat().st_size
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def hostile_step(env, hostile_site):
    """The step that opened the hostile page (its origin allow-listed), and a screenshot of it (loading
    5 MB once)."""
    listed = WebEnv(allow=hostile_site[0])
    listed.reset(booking.tasks()[0].id)
    step = listed.step(f"GOTO [{hostile_site[0]}/hostile.html]")
    yield step, listed.screenshot()
    listed.close()


@pytest.mark.slow
def test_hostile_page_is_bounded_text(hostile_site, hostile_step):
    assert hostile_site[1] > 5_000_000
    step = hostile_step[0]
    obs = step.observation
    assert step.info["ok"], obs[:300]
    assert len(obs) <= web.MAX_OBS_CHARS
    assert max(len(line) for line in obs.splitlines()) < 500
    assert "PWNED" not in obs and "while (true)" not in obs  # scripts never ran and are never read
    assert "Page: Hostile <script>alert(1)</script>" in obs  # the title's markup is text, kept as text
    assert 'Literal: <script>alert("xss")</script> **bold** [link](http://example.com)' in obs
    assert "(page truncated" in obs
    assert "example.com" in step.info["blocked"]  # the tracker image was never fetched


def test_redirects_and_other_origins_are_blocked(env, outside):
    """Two real loopback sites: A is allow-listed, B is not. A redirects to itself (fine), to B and to
    an outside host name (blocked: hop by hop, not only the first request). Neither B nor the outside
    world (every host name resolves to `outside` in this module) ever gets a connection, from a page
    or from the browser itself."""
    b_server, b, b_url = _site("B")
    a_server, a, a_url = _site("A")
    a.targets = {"self": "/plain", "b": f"{b_url}/secret", "out": "http://outside.example/steal", "a-then-b": "/to-b"}
    listed = WebEnv(allow=a_url)
    try:
        listed.reset(booking.tasks()[0].id)
        step = listed.step(f"GOTO [{a_url}/to-self]")
        assert step.info["ok"] and "page A" in step.observation and step.info["url"] == f"{a_url}/plain"
        assert "blocked" not in step.info
        for path, refused in (("/to-b", b_url), ("/to-a-then-b", b_url), ("/to-out", "outside.example")):
            step = listed.step(f"GOTO [{a_url}{path}]")
            assert not step.info["ok"] and step.observation.startswith(f"GOTO blocked: {a_url}{path} redirects")
            assert step.info["blocked"] == [refused], (path, step.info)
            assert "page B" not in step.observation and "page outside" not in step.observation
        step = listed.step(f"GOTO [{a_url}/links]")  # an image on A that redirects to B
        assert step.info["ok"] and "page A" in step.observation and step.info["blocked"] == [b_url], step
        link = next(i for i, kind, label, _ in elements(step.observation) if label == "to b")
        step = listed.step(f"CLICK [{link}]")  # a link on A that redirects to B
        assert step.info["blocked"] == [b_url] and "page B" not in step.observation
        assert f"Blocked (not the site's origin, not allow-listed): {b_url}." in step.observation
        assert step.observation.endswith(f"Page: (no page)\nURL: \ntext \"{web.NO_PAGE}\"")
        shown = step.observation.split("\n\n", 1)[1]
        snap = listed.snapshot()  # the error page restores (a search may return to this node)
        listed.step("GOTO [/to-self]")
        listed.restore(snap)
        assert listed._observe() == shown
        assert listed.step("GOTO [/]").info["url"] == listed.start_url  # relative to the site, not the error page
        step = listed.step(f"GOTO [{b_url}/secret]")  # another loopback port: refused before any request
        assert not step.info["ok"] and f"GOTO refused: {b_url} is not the site's origin" in step.observation
        env.reset(booking.tasks()[0].id)
        step = env.step(f"GOTO [{a_url}/plain]")  # the default env allows its own site only
        assert not step.info["ok"] and f"GOTO refused: {a_url} is not the site's origin" in step.observation
        assert b.hits == [] and outside.hits == []
        assert "/to-b?img" in a.hits and "/plain" in a.hits
    finally:
        listed.close()
        for server in (a_server, b_server):
            server.shutdown()
            server.server_close()


def test_hostile_observation_and_screenshot_are_shown_as_text_and_image(env, hostile_step, tmp_path, monkeypatch):
    """The tree inspector shows a stored hostile observation only as plain text (st.text), and a terminal node's
    screenshot as an image."""
    from streamlit.testing.v1 import AppTest

    task = booking.tasks()[0]
    step, shot = hostile_step
    tree = SearchTree.new(task, env.reset(task.id))
    leaf = tree.add_child(tree.root, observation=step.observation, action=CompositeAction("t", "GOTO [x]"),
                          reward=0.0, progress=0.0, terminal="failure", screenshot=shot)
    tree.backpropagate([leaf.id], 0.0)
    tree.simulations.append(Simulation((leaf.id,), 0.0))
    db = tmp_path / "ui.db"
    with Store(db) as store:
        run_id = store.create_run("hostile", "web", "none", {}, [task])
        (tree_id, _), = store.tree_ids(run_id)
        store.save_simulation(tree_id, tree, tree.simulations[0], 0)
    monkeypatch.setenv("ORCHARD_DB", str(db))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py"), default_timeout=60)
    at.run()
    at.switch_page("views/tree_explorer.py")
    at.query_params.update(run=run_id, task=task.id, node=str(leaf.id))
    at.run()
    assert not at.exception
    assert step.observation in [t.value for t in at.text]
    shown = [e.value for kind in ("markdown", "caption", "title", "subheader", "info", "warning") for e in getattr(at, kind)]
    assert not any("alert(" in text for text in shown)
    assert shot.startswith(JPEG) and len(at.get("image")) == 1


@pytest.mark.slow
def test_mcts_run_stores_dom_observations_and_the_final_screenshot(tmp_path):
    """A sure policy (its K samples agree, so the tree is a chain) searched deep enough to reach the
    confirmation page; then a noisy policy with a small budget (the tree branches)."""
    sure, noisy = booking.tasks("train")[1], booking.tasks("train")[3]
    policy = WebPolicy({sure.goal: (sure.meta, 1.0), noisy.goal: (noisy.meta, 0.5)})
    with Store(tmp_path / "web.db") as store:
        deep, stats = new_run(store, "web", [sure], policy, SearchConfig(simulations=13, k=2, depth_limit=13),
                              "web-deep")
        assert stats.simulations == 13 and stats.restores > 0
        small, _ = new_run(store, "web", [noisy], policy, SearchConfig(simulations=4, k=3, depth_limit=3, seed=1),
                           "web-small")
        trees = [(tid, store.load_tree(tid)) for run in (deep, small) for tid, _ in store.tree_ids(run)]
        for tree_id, tree in trees:
            assert tree is not None and not tree.check_invariants()
            assert tree.root.observation.startswith("Page: Home · Tablefinder")
            stepped = [n for n in tree.nodes[1:] if n.action is not None]
            assert len(stepped) >= 4
            assert all(re.search(r"^URL: http://127\.0\.0\.1:\d+/", n.observation, re.MULTILINE) for n in stepped)
            assert store.node_screenshot(tree_id, 0) is None
        tree_id, tree = trees[0]
        (done,) = [n for n in tree.nodes if n.terminal is not None]
        assert done.terminal == "success" and done.reward == 1.0 and "Reservation confirmed" in done.observation
        assert store.node_screenshot(tree_id, done.id).startswith(JPEG)
        assert len(trees[1][1].root.children) > 1
        # Every stepped terminal leaf keeps its final page (depth-limit and STOP leaves too), no other node.
        small_id, small_tree = trees[1]
        leaves = [n for n in small_tree.nodes if n.terminal not in (None, "format_error")]
        assert {n.terminal for n in leaves} - {"success", "failure"}, "the small search should hit its depth limit"
        assert all(store.node_screenshot(small_id, n.id).startswith(JPEG) for n in leaves)
        assert all(store.node_screenshot(small_id, n.id) is None for n in small_tree.nodes if n.terminal is None)


@pytest.mark.slow
def test_serve_env_web_answers_every_request_from_the_browser_thread():
    """`orchard serve-env web`: Playwright's browser belongs to the thread that started it, and each
    connection is served in a new thread; requests on two connections (and on a third, after the
    first instance is closed) all reach a working page."""
    proc, url = start_serve_env("web")
    try:
        with httpx.Client(timeout=60) as first:
            idx = first.post(f"{url}/create").json()["id"]
            reset = first.post(f"{url}/reset", json={"id": idx, "data_idx": 0}).json()
            assert reset["env_observation"].startswith("Page: Home · Tablefinder")
            assert reset["observation"] == f"Your goal: {reset['goal'].rstrip('.')}\n{reset['env_observation']}"
        with httpx.Client(timeout=60) as second:  # a new connection: a new server thread
            for command in ("GOTO [/]", "SCROLL [DOWN]"):
                step = second.post(f"{url}/step", json={"id": idx, "action": command})
                assert step.status_code == 200 and step.json()["info"]["ok"], step.text[:300]
                assert "Page: Home · Tablefinder" in step.json()["observation"]
            assert second.get(f"{url}/observation", params={"id": idx}).json() == step.json()["observation"]
            assert second.post(f"{url}/close", json={"id": idx}).json() == {"closed": True}
        with httpx.Client(timeout=60) as third:
            again = third.post(f"{url}/create").json()["id"]
            reset = third.post(f"{url}/reset", json={"id": again, "data_idx": 1}).json()
            assert reset["env_observation"].startswith("Page: Home · Tablefinder"), reset
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_registry_builds_the_web_env_without_starting_a_browser():
    made = env_factory("web:example.org")()
    assert isinstance(made, WebEnv) and made.allow == ("example.org",) and made._page is None
    assert "CLICK [id]" in made.describe() and made.tasks("test")


class WebPolicy:
    """A Generator double: the expert's command with probability p (per request seed), else a random
    element command from the observation; the critic prefers the expert's command."""

    name = "web-policy"

    def __init__(self, by_goal: dict[str, tuple[dict, float]]) -> None:
        self.by_goal = by_goal  # goal -> (task meta, probability of the expert's command)

    def _meta_and_obs(self, content: str) -> tuple[dict, float, str]:
        meta, p = next(v for g, v in self.by_goal.items() if g in content)
        match = re.search(r"OBSERVATION: (.*)\n\n(?:CANDIDATES:|Step \d+:)", content, re.DOTALL)
        return meta, p, match[1] if match else ""

    def _act(self, content: str, rng: random.Random) -> Completion:
        meta, p, obs = self._meta_and_obs(content)
        command = expert_command(meta, obs) or "SCROLL [DOWN]"
        if rng.random() > p:
            els = elements(obs) or [(1, "link", "", None)]
            i, kind, _, _ = rng.choice(els)
            command = f"TYPE [{i}] [hello]" if kind == "textbox" else f"CLICK [{i}]"
        text = f"THOUGHT: next step.\nACTION: {command}\nEXPLANATION: books the table.\nSTATUS: CONTINUE"
        return Completion(text=text, logprob=-1.0, n_tokens=10)

    def _critic(self, content: str) -> Completion:
        meta, _, obs = self._meta_and_obs(content)
        want = expert_command(meta, obs)
        listed = re.findall(r"^\[(\d+)\] ACTION: (.*?) \| EXPLANATION", content, re.MULTILINE)
        best = next((i for i, c in listed if c == want), "1")
        return Completion(text=f"REASON: closest to the booking.\nBEST: {best}", n_tokens=5)

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        out = []
        for req in requests:
            content = req.prompt[-1]["content"]
            rng = random.Random(req.params.seed)
            if "CANDIDATES:" in content:
                out.append([self._critic(content) for _ in range(req.n)])
            else:
                out.append([self._act(content, rng) for _ in range(req.n)])
        return out

    def logprobs(self, prompts, completions):
        return [None for _ in completions]


def test_a_page_read_after_it_navigated_is_judged_by_the_url_it_was_read_at(env):
    """_observe checks the page's URL, then reads it: a click's redirect may land on Chromium's error page (or
    another origin) in between. What was read is judged by the URL it was read at (the race a fresh clone hit:
    the error page shown as a page of 127.0.0.1)."""
    env.reset(booking.tasks()[0].id)
    site = env.start_url

    class Moved:  # the URL is the site's when checked; the document read is elsewhere
        def __init__(self, page, read_at):
            self.page, self.read_at = page, read_at

        url = property(lambda self: site)

        def wait_for_load_state(self, *a, **k):
            return None

        def evaluate(self, script, args):
            return {**self.page.evaluate(script, args), "title": "127.0.0.1", "url": self.read_at}

    real = env._page
    try:
        env._page = Moved(real, "chrome-error://chromewebdata/")
        assert env._observe().endswith(f"Page: (no page)\nURL: \ntext \"{web.NO_PAGE}\"")
        env._page = Moved(real, "http://127.0.0.1:9/elsewhere")
        assert "outside the allowed origins; it was not read" in env._observe()
    finally:
        env._page = real
