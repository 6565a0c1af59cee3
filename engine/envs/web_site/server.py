"""The booking site's HTTP server: stdlib `http.server` on 127.0.0.1, one thread, many sessions.

Each env's browser context sends its own `sid` cookie, so many trees share one server without seeing
each other's reservations. Every page is a pure function of (URL, session's reservations); POSTs
redirect to GETs. That makes a page reproducible from its URL, which snapshots rely on.
"""

from __future__ import annotations

import copy
import html
import re
import threading
import urllib.parse
from functools import cache
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from string import Template
from typing import Any

from engine.envs.web_site import booking as b

MAX_BODY = 64 * 1024
FIELDS = ("first", "last", "phone", "email", "request")


@cache
def _template(name: str) -> Template:
    return Template((b.HERE / "templates" / f"{name}.html").read_text(encoding="utf-8"))


def _page(_title: str, _template_name: str, **values: Any) -> str:
    """Fill a template (values are escaped unless their key ends with _html) inside the base."""
    filled = {k.removesuffix("_html"): v if k.endswith("_html") else html.escape(str(v))
              for k, v in values.items()}
    body = _template(_template_name).substitute(filled)
    return _template("base").substitute(title=html.escape(_title), body=body)


def _options(pairs: list[tuple[str, str]], selected: str) -> str:
    return "".join(
        f'<option value="{html.escape(v)}"{" selected" if v == selected else ""}>{html.escape(label)}</option>'
        for v, label in pairs
    )


def _pickers(date: str, time: str, party: str) -> dict[str, str]:
    return {
        "date_options_html": _options([(d, b.date_label(d)) for d in b.all_dates()], date),
        "time_options_html": _options([(t, b.time_label(t)) for t in b.all_times()], time),
        "party_options_html": _options([(str(n), b.party_label(n)) for n in b.PARTY_SIZES], party),
    }


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]", "", text.lower().replace("'", ""))


def _slot_links(r: b.Restaurant, date: str, time: str, party: str) -> str:
    """Up to five bookable times nearest the requested one, as links to the details form."""
    slots = sorted(r.slots(), key=lambda s: (abs(_minutes(s) - _minutes(time)), s))[:5]
    links = []
    for s in sorted(slots):
        query = urllib.parse.urlencode({"r": r.slug, "date": date, "time": s, "party": party})
        links.append(f'<a class="slot" href="/book?{html.escape(query)}">{html.escape(b.time_label(s))}</a>')
    return " ".join(links)


def _minutes(hhmm: str) -> int:
    h, m = (int(x) for x in hhmm.split(":"))
    return 60 * h + m


class Sessions:
    """sid -> {"reservations": [...]}; guarded by a lock (the server answers in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, Any]] = {}

    def get(self, sid: str) -> dict[str, Any]:
        """A deep copy: callers may keep it as a snapshot."""
        with self._lock:
            return copy.deepcopy(self._data.get(sid, {"reservations": []}))

    def put(self, sid: str, state: dict[str, Any]) -> None:
        with self._lock:
            self._data[sid] = copy.deepcopy(state)

    def drop(self, sid: str) -> None:
        with self._lock:
            self._data.pop(sid, None)

    def reserve(self, sid: str, reservation: dict[str, Any]) -> str:
        with self._lock:
            state = self._data.setdefault(sid, {"reservations": []})
            rid = f"R-{len(state['reservations']) + 1:04d}"  # deterministic: replays reproduce URLs
            state["reservations"].append({**reservation, "id": rid, "confirmed": True})
            return rid


class BookingServer:
    """The site on a free loopback port, served from a daemon thread until `close()`."""

    def __init__(self) -> None:
        self.sessions = Sessions()
        handler = type("Handler", (_Handler,), {"sessions": self.sessions})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="booking-site", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    sessions: Sessions
    server_version = "Tablefinder/1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    # --- plumbing ---------------------------------------------------------------------------------

    def _sid(self) -> str:
        morsel = SimpleCookie(self.headers.get("Cookie", "")).get("sid")
        return morsel.value if morsel else "anonymous"

    def _send(self, status: int, body: str, content_type: str = "text/html; charset=utf-8") -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def _redirect(self, location: str) -> None:
        self.send_response(303)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _not_found(self, message: str) -> None:
        self._send(404, _page("Not found", "not_found", message=message))

    # --- routes -----------------------------------------------------------------------------------

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        if url.path == "/":
            self._home()
        elif url.path == "/search":
            self._search(q)
        elif url.path.startswith("/r/"):
            self._restaurant(url.path[3:], q)
        elif url.path == "/book":
            self._book(q)
        elif url.path.startswith("/confirmation/"):
            self._confirmation(url.path.rsplit("/", 1)[1])
        elif url.path == "/static/style.css":
            self._send(200, (b.HERE / "static" / "style.css").read_text(encoding="utf-8"), "text/css")
        else:
            self._not_found(f"There is no page at {url.path}.")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if urllib.parse.urlsplit(self.path).path != "/reserve" or length > MAX_BODY:
            self._not_found("That form cannot be sent here.")
            return
        form = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(length).decode("utf-8", "replace")).items()}
        self._reserve(form)

    def _choice(self, q: dict[str, str]) -> tuple[str, str, str]:
        date = q["date"] if q.get("date") in b.all_dates() else b.all_dates()[0]
        time = q["time"] if q.get("time") in b.all_times() else "19:00"
        party = q["party"] if q.get("party") in {str(n) for n in b.PARTY_SIZES} else "2"
        return date, time, party

    def _home(self) -> None:
        popular = "".join(
            f'<li><a href="/r/{r.slug}">{html.escape(r.name)}</a> · {html.escape(r.cuisine)}</li>'
            for r in list(b.restaurants().values())[:4]
        )
        self._send(200, _page("Home", "home", popular_html=popular, **_pickers(b.all_dates()[0], "19:00", "2")))

    def _search(self, q: dict[str, str]) -> None:
        date, time, party = self._choice(q)
        words = _norm(q.get("q", "")).split()
        found = [r for r in b.restaurants().values()
                 if all(w in _norm(f"{r.name} {r.cuisine} {r.area}") for w in words)]
        query = urllib.parse.urlencode({"date": date, "time": time, "party": party})
        results = "".join(
            f'<li><a href="/r/{r.slug}?{html.escape(query)}">{html.escape(r.name)}</a> '
            f"<span>{html.escape(r.cuisine)} · {html.escape(r.area)} · {html.escape(r.price)}</span><br>"
            f"{_slot_links(r, date, time, party)}</li>"
            for r in found
        )
        summary = (f"{len(found)} restaurants for {b.party_label(int(party))} on {b.date_label(date)} "
                   f"around {b.time_label(time)}")
        heading = f"Results for “{q.get('q', '')}”" if q.get("q") else "All restaurants"
        self._send(200, _page("Search", "search", heading=heading, summary=summary, q=q.get("q", ""),
                              date=date, time=time, party=party,
                              results_html=results or "<li>No restaurants match your search.</li>"))

    def _restaurant(self, slug: str, q: dict[str, str]) -> None:
        r = b.restaurants().get(slug)
        if r is None:
            self._not_found(f"No restaurant called {slug!r}.")
            return
        date, time, party = self._choice(q)
        chosen = bool(q.get("date") or q.get("time") or q.get("party"))
        availability = (f"Available times on {b.date_label(date)} for {b.party_label(int(party))}:" if chosen
                        else "Choose a party size, date and time, then find a table.")
        slots = _slot_links(r, date, time, party) if chosen else ""
        self._send(200, _page(r.name, "restaurant", name=r.name, cuisine=r.cuisine, area=r.area, price=r.price,
                              blurb=r.blurb, slug=r.slug, availability=availability, slots_html=slots,
                              **_pickers(date, time, party)))

    def _book(self, q: dict[str, str]) -> None:
        r = b.restaurants().get(q.get("r", ""))
        if r is None or q.get("date") not in b.all_dates() or q.get("time") not in r.slots() \
                or q.get("party") not in {str(n) for n in b.PARTY_SIZES}:
            self._not_found("That table is not available: choose a restaurant, date, time and party size again.")
            return
        when = f"{b.date_label(q['date'])} at {b.time_label(q['time'])}"
        self._send(200, _page("Details", "book", name=r.name, when=when, party_text=b.party_label(int(q["party"])),
                              slug=r.slug, date=q["date"], time=q["time"], party=q["party"],
                              error=q.get("error", ""), **{f: q.get(f, "") for f in FIELDS}))

    def _reserve(self, form: dict[str, str]) -> None:
        keep = {k: form.get(k, "") for k in ("r", "date", "time", "party")}
        problems = [label for key, label in (("first", "first name"), ("last", "last name"),
                                             ("phone", "phone number"), ("email", "email")) if not form.get(key, "").strip()]
        if form.get("email", "").strip() and "@" not in form["email"]:
            problems.append("a valid email")
        if form.get("phone", "").strip() and len(b.digits(form["phone"])) < 7:
            problems.append("a phone number with at least 7 digits")
        r = b.restaurants().get(keep["r"])
        if r is None or keep["date"] not in b.all_dates() or keep["time"] not in r.slots():
            self._not_found("That table is not available any more.")
            return
        if problems:
            query = {**keep, **{f: form.get(f, "") for f in FIELDS}, "error": "Please enter " + ", ".join(problems) + "."}
            self._redirect("/book?" + urllib.parse.urlencode(query))
            return
        reservation = {"restaurant": r.slug, "date": keep["date"], "time": keep["time"], "party": keep["party"],
                       **{f: form.get(f, "").strip() for f in FIELDS}}
        rid = self.sessions.reserve(self._sid(), reservation)
        self._redirect(f"/confirmation/{rid}")

    def _confirmation(self, rid: str) -> None:
        found = [x for x in self.sessions.get(self._sid())["reservations"] if x["id"] == rid]
        if not found:
            self._not_found(f"No reservation {rid!r} in this session.")
            return
        x = found[0]
        r = b.restaurants()[x["restaurant"]]
        self._send(200, _page("Confirmed", "confirmation", rid=rid, name=r.name, date=b.date_label(x["date"]),
                              time=b.time_label(x["time"]), party=b.party_label(int(x["party"])),
                              who=f"{x['first']} {x['last']}", email=x["email"], phone=x["phone"]))
