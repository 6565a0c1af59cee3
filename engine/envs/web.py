"""A real browser env (Agent Q's web setting): headless Chromium via Playwright on a local booking site.

Observations are the page reduced to interactive and text elements with stable ids (`web_dom`);
commands are Agent Q's: CLICK [id], TYPE [id] [text], SUBMIT [id], CLEAR [id], SCROLL [UP|DOWN],
GOTO [url], ASK_USER_HELP. A bad command is an observation saying why (`info["ok"]` False), never an
exception: a search must survive anything a model writes.

Safety: page JavaScript is off by default (our site needs none; a hostile page's scripts never run,
cannot loop forever or open dialogs). Only the env's own site origin (scheme, host and port) is
reachable, plus origins or hosts listed explicitly (`web:http://127.0.0.1:8000,example.org`). Three
layers, because Playwright's route never sees the hops of a redirect the browser follows: (1) the
route checks every request it sees; (2) the context's proxy is a local refuser that answers 403 to
everything, and only the allowed origins bypass it, so a redirect hop (or anything else) to another
origin fails in the network stack, outside hosts are never resolved or contacted; the browser's own
background traffic (update checks, accounts) goes to the refuser too; (3) redirect hops and the
page's URL are checked after each navigation. What was refused is in `info["blocked"]`.
One Chromium, one site server and one refuser are shared by every env of the process; each env has
its own browser context (cookies, proxy rules) and site session.

The episode ends when a reservation is confirmed; the grader scores it on Agent Q's four criteria
(reward 1 only when all hold). Progress is the latched share of criteria met so far (the draft in the
URL and the details form counts before completion). The terminal step carries a small JPEG of the
page in `info["screenshot"]`. Restore: `snapshot()` keeps URL, form values, scroll and the session's
reservations (a page here is a function of those); `ReplayWebEnv` has no snapshot (replay from reset).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import socket
import threading
import urllib.parse
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.envs.base import EnvBase, EnvError, Step, TaskSpec
from engine.envs.web_dom import (
    MAX_CONTROLS,
    MAX_LABEL,
    MAX_OPTIONS,
    MAX_TEXT,
    MAX_VISIT,
    OBSERVE_JS,
    SET_CONTROLS_JS,
    clean,
    render,
)
from engine.envs.web_site import booking
from engine.envs.web_site.server import BookingServer

if TYPE_CHECKING:
    from playwright.sync_api import ProxySettings, ViewportSize

CHROMIUM = os.environ.get("ORCHARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT: ViewportSize = {"width": 800, "height": 600}
MAX_OBS_CHARS = 6000
TIMEOUT_MS = 5000
DEFAULT_PORTS = {"http": 80, "https": 443}
JPEG_QUALITY = 50

DESCRIPTION = """Web: a real browser on Tablefinder, a restaurant-booking site. Each observation lists the page's
interactive elements as [id] kind "label" value="..." (ids are stable while the page stays) and its text.
Commands (one per step):
- CLICK [id]: click a link or button.
- TYPE [id] [text]: put text into a text field (replacing what it holds), or choose an option of a select
  by its label, e.g. TYPE [5] [June 17] or TYPE [6] [7:00 PM].
- SUBMIT [id]: submit the form the element belongs to.
- CLEAR [id]: empty a text field.
- SCROLL [UP|DOWN]: scroll the page.
- GOTO [url]: open a URL of the site (e.g. GOTO [/] for the home page).
- ASK_USER_HELP: ask the user for details you are missing.
The task is done when a reservation is confirmed; it must match the request exactly (restaurant, date,
time, party size, and the user's name, email and phone)."""

NO_PAGE = "No page: the last navigation failed or was blocked. GOTO [/] opens the site's home page."
_ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?/?", re.IGNORECASE)
_ID = re.compile(r"^\[?\s*(\d+)\s*\]?\s*(.*)$", re.DOTALL)
_ASK = re.compile(r"^ask[_ ]?user[_ ]?help\b", re.IGNORECASE)


def origin(url: str) -> str | None:
    """'HTTP://Host:80/x' -> 'http://host' (scheme://host[:port], default ports dropped); None if not http(s)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not host:
        return None
    scheme = parts.scheme.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" if port in (None, DEFAULT_PORTS[scheme]) else f"{scheme}://{host}:{port}"


def url_problem(url: str, allowed: Sequence[str] = ()) -> str | None:
    """Why the browser may not open `url` (None: allowed). `allowed` holds origins
    ('http://127.0.0.1:8000': that scheme, host and port) and host names ('example.org': any port);
    nothing else is allowed, loopback included. Only http(s)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return f"{clean(url, 80)!r} is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return f"the {parts.scheme or 'missing'} scheme is not allowed (only http and https)"
    if not host:
        return "the URL has no host"
    here = origin(url)
    for entry in allowed:
        entry = entry.lower()
        if (here == origin(entry)) if "://" in entry else (host == entry.strip("[]")):
            return None
    return f"{clean(here, 80)} is not the site's origin and not in the allow-list"


def bypass_rule(entry: str) -> str:
    """An allow-list entry as a Chromium proxy-bypass rule ('http://h:p' stays an origin, 'h' any port)."""
    if "://" not in entry:
        return entry.lower()
    here = origin(entry) or entry
    scheme = here.partition("://")[0]
    return here if re.search(r":\d+$", here.partition("://")[2]) else f"{here}:{DEFAULT_PORTS[scheme]}"


class _Refuser:
    """A loopback 'proxy' that answers 403 to every connection: the browser's proxy for every origin
    that is not allowed, so those requests fail in the network stack (redirect hops included)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.refused = 0
        threading.Thread(target=self._serve, name="web-refuser", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                try:
                    conn.settimeout(1.0)
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass
            self.refused += 1

    def close(self) -> None:
        _quiet(self.sock.close)


class _Runtime:
    """Process-wide: one Playwright, one Chromium, one booking server; used from one thread."""

    def __init__(self) -> None:
        if not Path(CHROMIUM).exists():
            raise EnvError(f"the web env needs Chromium at {CHROMIUM} (apt-get install chromium, or set "
                           "ORCHARD_CHROMIUM)")
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise EnvError("the web env needs the playwright package (pip install playwright; no browser "
                           "download: it drives the system Chromium)") from None
        self.thread = threading.get_ident()
        self.server = BookingServer()
        self.refuser = _Refuser()
        self.pw = sync_playwright().start()
        try:
            self.browser = self.pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                                   proxy={"server": self.refuser.url, "bypass": "<-loopback>"})
        except Exception as e:  # noqa: BLE001 - any launch failure becomes one clear EnvError
            self.pw.stop()
            self.server.close()
            self.refuser.close()
            raise EnvError(f"could not start Chromium at {CHROMIUM}: {clean(e, 300)}") from None
        self.contexts: list[tuple[weakref.ref, Any]] = []

    def new_context(self, owner: ReplayWebEnv, javascript: bool, allowed: Sequence[str]) -> Any:
        if threading.get_ident() != self.thread:
            raise EnvError("the web env's browser belongs to the thread that started it; use envs from one thread")
        for ref, ctx in [c for c in self.contexts if c[0]() is None]:  # envs garbage-collected since
            self.contexts.remove((ref, ctx))
            _quiet(ctx.close)
        proxy: ProxySettings = {"server": self.refuser.url, "bypass": ",".join(bypass_rule(a) for a in allowed)}
        ctx = self.browser.new_context(viewport=VIEWPORT, java_script_enabled=javascript, proxy=proxy,
                                       service_workers="block", accept_downloads=False)
        self.contexts.append((weakref.ref(owner), ctx))
        return ctx

    def release(self, ctx: Any) -> None:
        self.contexts = [c for c in self.contexts if c[1] is not ctx]
        _quiet(ctx.close)

    def close(self) -> None:
        for _, ctx in self.contexts:
            _quiet(ctx.close)
        _quiet(self.browser.close)
        _quiet(self.pw.stop)
        self.server.close()
        self.refuser.close()


_RUNTIME: _Runtime | None = None


def runtime() -> _Runtime:
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = _Runtime()
        atexit.register(shutdown)
    return _RUNTIME


def shutdown() -> None:
    """Close the shared browser and server (at exit; tests may call it)."""
    global _RUNTIME
    if _RUNTIME is not None and threading.get_ident() == _RUNTIME.thread:
        _RUNTIME.close()
    _RUNTIME = None


def _quiet(fn: Any) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001, S110 - closing something already gone
        pass


@dataclass(frozen=True)
class WebState:
    """A snapshot: plain immutable data (the session's reservations as JSON text)."""

    task_id: str
    url: str
    controls: str  # JSON list of form control values in document order
    scroll_y: int
    session: str  # JSON of the site session
    progress: float
    done: bool


class ReplayWebEnv(EnvBase):
    """The web env without snapshots: search restores a state by replaying its commands from reset."""

    name = "web"
    thread_bound = True  # Playwright's sync API: the browser belongs to the thread that started it

    def __init__(self, allow: str | Sequence[str] = (), *, max_chars: int = MAX_OBS_CHARS,
                 javascript: bool = False) -> None:
        self.allow = tuple(h.strip() for h in (allow.split(",") if isinstance(allow, str) else allow) if h.strip())
        for entry in self.allow:
            if not (re.fullmatch(r"[A-Za-z0-9.-]+", entry) or _ORIGIN.fullmatch(entry)):
                raise EnvError(f"web allow-list entry {entry!r} is not a host name or an origin "
                               "(scheme://host[:port], no path)")
        self.max_chars = max_chars
        self.javascript = javascript
        self.attr = f"data-o{secrets.token_hex(4)}"
        self.sid = secrets.token_hex(8)
        self.blocked: list[str] = []  # requests refused since the last step (hosts shown in info)
        self._rt: _Runtime | None = None
        self._ctx: Any = None
        self._page: Any = None
        self._task: TaskSpec | None = None
        self._last: dict[str, Any] = {}
        self._kinds: dict[int, str] = {}
        self._progress = 0.0
        self._done = False

    # -- Env protocol -------------------------------------------------------------------------------

    def describe(self) -> str:
        return DESCRIPTION

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        return booking.tasks(split)

    def task(self, task_id: str) -> TaskSpec:
        return booking.task(task_id)

    @property
    def start_url(self) -> str:
        return runtime().server.url + "/"

    def allowed(self) -> tuple[str, ...]:
        """What the browser may open: the site's origin, then the allow-list."""
        return (runtime().server.url, *self.allow)

    def reset(self, task_id: str) -> str:
        task = self.task(task_id)
        page = self._ensure_page()
        runtime().server.sessions.drop(self.sid)
        self._task, self._progress, self._done = task, 0.0, False
        self._goto(page, self.start_url)
        self.blocked.clear()
        return self._observe()

    def step(self, command: str) -> Step:
        if self._task is None:
            raise EnvError("step() before reset(): call reset(task_id) first")
        if self._done:
            return Step("The reservation is already made; the episode is over.", 0.0, True, self._progress,
                        {"ok": False})
        self.blocked.clear()
        feedback, ok = self._command(str(command))
        page_text = self._observe()
        criteria, done = self._judge()
        self._progress = max(self._progress, booking.progress(criteria))
        info: dict[str, Any] = {"ok": ok, "criteria": criteria, "url": self._last.get("url", "")}
        if self.blocked:
            info["blocked"] = list(self.blocked[:10])
        reward = 0.0
        if done:
            self._done = True
            reward = 1.0 if all(criteria.values()) else 0.0
            info["screenshot"] = self.screenshot()
        if self.blocked:
            feedback = (f"{feedback} " if feedback else "") + (
                f"Blocked (not the site's origin, not allow-listed): {', '.join(self.blocked[:5])}.")
        observation = f"{clean(feedback, 400)}\n\n{page_text}" if feedback else page_text
        return Step(observation, reward, done, self._progress, info)

    # -- extras -----------------------------------------------------------------------------------------

    def screenshot(self) -> bytes | None:
        """A small JPEG of the viewport (None when the page cannot be captured)."""
        try:
            return self._page.screenshot(type="jpeg", quality=JPEG_QUALITY, timeout=TIMEOUT_MS)
        except Exception:  # noqa: BLE001 - a page that cannot be captured has no screenshot
            return None

    def reservations(self) -> list[dict[str, Any]]:
        """This env's confirmed reservations (the grader's input)."""
        return runtime().server.sessions.get(self.sid)["reservations"]

    def close(self) -> None:
        """Close this env's page and browser context and drop its site session; when no other env
        holds a context any more, stop the shared Chromium and booking server too (the next reset
        starts them again). Idempotent."""
        if self._ctx is not None and _RUNTIME is not None:
            _RUNTIME.release(self._ctx)
            _RUNTIME.server.sessions.drop(self.sid)
            if threading.get_ident() == _RUNTIME.thread and not any(r() is not None for r, _ in _RUNTIME.contexts):
                shutdown()
        self._ctx = self._page = self._task = None

    # -- browser ------------------------------------------------------------------------------------------

    def _ensure_page(self) -> Any:
        rt = runtime()
        if self._page is None or self._rt is not rt:  # first use, or the shared browser was restarted
            self._rt = rt
            self._ctx = rt.new_context(self, self.javascript, self.allowed())
            self._ctx.add_cookies([{"name": "sid", "value": self.sid, "url": rt.server.url}])
            self._ctx.route("**/*", self._route)
            self._ctx.on("request", self._on_request)
            self._page = self._ctx.new_page()
            self._page.set_default_timeout(TIMEOUT_MS)
            self._page.on("dialog", lambda d: _quiet(d.dismiss))
            self._page.on("popup", lambda p: _quiet(p.close))
        return self._page

    def _route(self, route: Any) -> None:
        url = route.request.url
        if url_problem(url, self.allowed()) is None:
            route.continue_()
        else:
            self._block(url)
            route.abort("blockedbyclient")

    def _on_request(self, request: Any) -> None:
        """Redirect hops never reach the route: report a refused one (the refuser proxy fails it)."""
        if request.redirected_from is not None and url_problem(request.url, self.allowed()) is not None:
            self._block(request.url)

    def _block(self, url: str) -> None:
        """Note a refused URL for info["blocked"]: its host, or its origin when the host is allowed."""
        host = urllib.parse.urlsplit(url).hostname or url
        shown = clean(origin(url) if host in (urllib.parse.urlsplit(a).hostname for a in self.allowed())
                      else host, 80)
        if shown not in self.blocked:
            self.blocked.append(shown)

    def _goto(self, page: Any, url: str) -> None:
        """page.goto. Leaving Chromium's error page (after a blocked or failed load), Chromium sometimes
        restarts the navigation and Playwright reports 'interrupted by another navigation': try again."""
        for attempt in range(3):
            try:
                page.goto(url, wait_until="load", timeout=2 * TIMEOUT_MS)
                return
            except Exception as e:
                if attempt == 2 or "interrupted by another navigation" not in str(e):
                    raise
                _quiet(lambda: page.wait_for_load_state("load", timeout=TIMEOUT_MS))

    def _not_shown(self, here: str) -> dict[str, Any] | None:
        """What the observation is instead of the page at URL `here`, when that page is not to be shown:
        Chromium's error page (a blocked or failed load) or a page of another origin; None otherwise."""
        if not here.startswith(("http:", "https:")):
            return {"title": "(no page)", "url": "", "items": [{"id": None, "kind": "text", "label": NO_PAGE}]}
        if url_problem(here, self.allowed()) is not None:
            self._block(here)  # the last line of defence: a page of another origin is never shown
            return {"title": "(blocked page)", "url": "", "items": [
                {"id": None, "kind": "text", "label": "This page is outside the allowed origins; it was not read."}]}
        return None

    def _observe(self) -> str:
        args = {"attr": self.attr, "budget": self.max_chars, "maxVisit": MAX_VISIT, "maxLabel": MAX_LABEL,
                "maxText": MAX_TEXT, "maxOptions": MAX_OPTIONS, "maxControls": MAX_CONTROLS}
        data: dict[str, Any] = self._not_shown(self._page.url) or {}
        for attempt in range(0 if data else 3):  # a navigation in flight destroys the context: wait and look again
            try:
                self._page.wait_for_load_state("load", timeout=2 * TIMEOUT_MS)
                data = self._page.evaluate(OBSERVE_JS, args)
                # The page may have navigated since its URL was checked (a click's redirect landing on the
                # error page): what was read is judged by the URL it was read at.
                if isinstance(data, dict):
                    data = self._not_shown(str(data.get("url", ""))) or data
                break
            except Exception as e:  # noqa: BLE001 - the page, not the search, is broken
                if attempt == 2:
                    data = {"title": "(unreadable page)", "url": self._page.url,
                            "items": [{"id": None, "kind": "text", "label": f"could not read the page: {e}"}]}
        self._last = data if isinstance(data, dict) else {}
        self._kinds = {int(i["id"]): str(i["kind"]) for i in self._last.get("items", []) if i.get("id") is not None}
        return render(self._last, self.max_chars)

    # -- commands ------------------------------------------------------------------------------------------

    def _command(self, command: str) -> tuple[str, bool]:
        text = command.strip()
        verb, _, rest = text.partition(" ")
        verb = verb.upper().strip(":")
        if _ASK.match(text):
            return self._ask(), True
        if verb in ("CLICK", "TYPE", "SUBMIT", "CLEAR"):
            match = _ID.match(rest.strip())
            if not match:
                return f"Could not execute '{clean(text, 120)}': give an element id, e.g. {verb} [3].", False
            eid, arg = int(match[1]), _unwrap(match[2])
            if eid not in self._kinds:
                return f"Could not execute '{clean(text, 120)}': there is no element [{eid}] on this page.", False
            return self._element(verb, eid, self._kinds[eid], arg)
        if verb == "SCROLL":
            way = _unwrap(rest).upper()
            if way not in ("UP", "DOWN"):
                return "Could not scroll: say SCROLL [UP] or SCROLL [DOWN].", False
            self._page.evaluate("(d) => window.scrollBy(0, d * Math.round(innerHeight * 0.8))", 1 if way == "DOWN" else -1)
            return f"Scrolled {way.lower()}.", True
        if verb == "GOTO":
            return self._goto_command(_unwrap(rest))
        return (f"Could not execute '{clean(text, 120)}': unknown command. Use CLICK [id], TYPE [id] [text], "
                "SUBMIT [id], CLEAR [id], SCROLL [UP|DOWN], GOTO [url] or ASK_USER_HELP."), False

    def _element(self, verb: str, eid: int, kind: str, arg: str) -> tuple[str, bool]:
        loc = self._page.locator(f'[{self.attr}="{eid}"]')
        try:
            if loc.count() != 1:
                return f"Element [{eid}] is no longer on the page.", False
            if verb == "CLICK":
                if kind == "select":
                    return f"[{eid}] is a select: choose an option with TYPE [{eid}] [option].", False
                loc.click(timeout=TIMEOUT_MS)
                return f"Clicked [{eid}].", True
            if verb == "SUBMIT":
                return self._submit(loc, eid)
            if kind == "select":
                if verb == "CLEAR":
                    return f"[{eid}] is a select: it cannot be cleared; choose an option with TYPE.", False
                return self._select(loc, eid, arg)
            if kind not in ("textbox", "editable") and not kind.startswith("input:"):
                return f"[{eid}] is a {kind}, not a text field: it cannot be typed into.", False
            loc.fill("" if verb == "CLEAR" else arg, timeout=TIMEOUT_MS)
            return (f"Cleared [{eid}]." if verb == "CLEAR" else f"Typed into [{eid}]."), True
        except Exception as e:  # noqa: BLE001 - Playwright's errors (timeouts, detached elements) are feedback
            return f"{verb} [{eid}] failed: {clean(str(e).splitlines()[0] if str(e) else type(e).__name__, 200)}", False

    def _select(self, loc: Any, eid: int, arg: str) -> tuple[str, bool]:
        options = loc.evaluate("(s) => Array.from(s.options).map(o => [o.value, o.textContent])")
        value = _match_option(arg, [(str(v), str(label)) for v, label in options])
        if value is None:
            shown = " | ".join(clean(label, 30) for _, label in options[:8])
            return f"No single option of [{eid}] matches {clean(arg, 60)!r} (options: {shown} …).", False
        loc.select_option(value=value, timeout=TIMEOUT_MS)
        return f"Selected {clean(dict(options).get(value, value), 60)!r} in [{eid}].", True

    def _submit(self, loc: Any, eid: int) -> tuple[str, bool]:
        """Click the form's submit button (Playwright then waits for the navigation)."""
        button = loc.evaluate(
            """(el, attr) => {
                 const f = el.tagName === 'FORM' ? el : el.form || el.closest('form');
                 if (!f) return null;
                 const b = f.querySelector('button:not([type]), button[type=submit], input[type=submit]');
                 if (!b) return '';
                 if (!b.hasAttribute(attr)) b.setAttribute(attr, 'submit');  // unlisted (hidden) button
                 return b.getAttribute(attr);
               }""",
            self.attr,
        )
        if button is None:
            return f"[{eid}] is not in a form: nothing to submit.", False
        if button == "":
            return f"The form of [{eid}] has no submit button; CLICK the element that sends it.", False
        self._page.locator(f'[{self.attr}="{button}"]').click(timeout=TIMEOUT_MS)
        return f"Submitted the form of [{eid}].", True

    def _goto_command(self, target: str) -> tuple[str, bool]:
        if not target:
            return "Could not go: say GOTO [url].", False
        here = self._page.url
        url = urllib.parse.urljoin(here if here.startswith(("http:", "https:")) else self.start_url, target)
        problem = url_problem(url, self.allowed())
        if problem:
            return f"GOTO refused: {problem}.", False
        try:
            self._goto(self._page, url)
        except Exception as e:  # noqa: BLE001 - a failed navigation is feedback
            if self.blocked:
                return f"GOTO blocked: {clean(url, 200)} redirects to a URL that is not allowed.", False
            return f"GOTO failed: {clean(str(e).splitlines()[0], 200)}", False
        return f"Opened {clean(url, 200)}.", True

    def _ask(self) -> str:
        assert self._task is not None
        who = self._task.meta["user"]
        return (f"The user says: I am {who['first']} {who['last']}, email {who['email']}, phone {who['phone']}. "
                f"My request: {self._task.goal}")

    # -- grading ----------------------------------------------------------------------------------------

    def _judge(self) -> tuple[dict[str, bool], bool]:
        """Criteria for the confirmed reservation (done), else for the draft the page shows."""
        assert self._task is not None
        made = self.reservations()
        if made:
            return booking.grade(self._task.meta, made[0]), True
        url = urllib.parse.urlsplit(self._last.get("url", ""))
        if f"{url.scheme}://{url.netloc}" != runtime().server.url:
            return booking.grade(self._task.meta, {}), False
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        draft: dict[str, Any] = {"date": q.get("date"), "time": q.get("time"), "party": q.get("party")}
        if url.path.startswith("/r/") and "date" in q:
            draft["restaurant"] = url.path[3:]
        elif url.path == "/book":
            draft["restaurant"] = q.get("r")
            draft.update(self._form_fields())
        return booking.grade(self._task.meta, draft), False

    def _form_fields(self) -> dict[str, str]:
        try:
            return self._page.evaluate(
                "() => Object.fromEntries(Array.from(document.querySelectorAll('form input[name]'))"
                ".map(e => [e.name, String(e.value).slice(0, 200)]))")
        except Exception:  # noqa: BLE001 - no readable form: no draft fields
            return {}


class WebEnv(ReplayWebEnv):
    """The web env with snapshots: URL + form values + scroll + the site session (see module doc)."""

    def snapshot(self) -> WebState:
        if self._task is None:
            raise EnvError("snapshot() before reset(): nothing to snapshot")
        y = (self._last.get("scroll") or [0])[0]
        return WebState(self._task.id, str(self._last.get("url", "")), json.dumps(self._last.get("controls", [])),
                        int(y), json.dumps(runtime().server.sessions.get(self.sid)), self._progress, self._done)

    def restore(self, state: WebState) -> None:
        task = self.task(state.task_id)
        page = self._ensure_page()
        runtime().server.sessions.put(self.sid, json.loads(state.session))
        self._goto(page, state.url or "about:blank")  # no URL: the error page of a blocked or failed load
        page.evaluate(SET_CONTROLS_JS, [json.loads(state.controls), state.scroll_y])
        self._task, self._progress, self._done = task, state.progress, state.done
        self.blocked.clear()
        self._observe()


def _unwrap(text: str) -> str:
    """'[June 17]' -> 'June 17'; '"x"' -> 'x'."""
    text = text.strip()
    if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
        text = text[1:-1].strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    return text


def _norm_option(text: str) -> str:
    text = " ".join(text.lower().replace(",", " ").split())
    return re.sub(r"(\d)\s*([ap])\.?\s*m\b\.?", r"\1 \2m", text)


def _match_option(wanted: str, options: list[tuple[str, str]]) -> str | None:
    """The value of the one option whose label or value is `wanted`, or contains it as whole words."""
    w = _norm_option(wanted)
    if not w:
        return None
    exact = [v for v, label in options if w in (_norm_option(label), _norm_option(v))]
    if len(exact) == 1:
        return exact[0]
    pattern = re.compile(r"(?<![a-z0-9])" + re.escape(w) + r"(?![a-z0-9])")
    words = [v for v, label in options if pattern.search(_norm_option(label))]
    return words[0] if len(words) == 1 else None
