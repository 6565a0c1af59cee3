"""The booking site without a browser: tasks, grader, option matching, URL policy, observation bounds,
and the site's HTTP behaviour (POST -> redirect -> GET, sessions apart)."""

from __future__ import annotations

import http.client
import re
import urllib.parse
import urllib.request

import pytest

from engine.envs.base import EnvError
from engine.envs.web import WebEnv, _match_option, bypass_rule, url_problem
from engine.envs.web_dom import render
from engine.envs.web_site import booking
from engine.envs.web_site.server import BookingServer


def test_tasks_are_generated_deterministically_with_agent_q_wording():
    train, test = booking.tasks("train"), booking.tasks("test")
    assert len(train) + len(test) == booking.N_TASKS and len(test) == booking.N_TASKS // booking.TEST_EVERY
    assert len({t.id for t in train + test}) == booking.N_TASKS
    booking._tasks.cache_clear()
    assert [t.goal for t in booking.tasks("train")] == [t.goal for t in train]  # regenerated identically
    pattern = re.compile(r"^Book .+ for \d+ on June \d{1,2} at \d{1,2}:\d\d[ap]m as \w+ \w+ "
                         r"\(email \S+@example\.com, phone 555-\d{4}\)\.$")
    for t in train + test:
        assert pattern.match(t.goal), t.goal
        m = t.meta
        r = booking.restaurants()[m["restaurant"]]
        assert r.name in t.goal and m["time"] in r.slots() and m["date"] in booking.all_dates()
        assert f"June {int(m['date'][-2:])} " in t.goal and f" for {m['party']} on " in t.goal
    assert booking.task(test[2].id) == test[2]
    with pytest.raises(EnvError, match="unknown web task id"):
        booking.task("train-9999")
    with pytest.raises(EnvError, match="unknown web split"):
        booking.tasks("dev")


def _booking(meta: dict, **changes) -> dict:
    who = meta["user"]
    out = {"restaurant": meta["restaurant"], "date": meta["date"], "time": meta["time"], "party": str(meta["party"]),
           "first": who["first"], "last": who["last"], "email": who["email"], "phone": who["phone"], "confirmed": True}
    out.update(changes)
    return out


def test_grader_checks_the_four_criteria_separately():
    meta = booking.tasks()[0].meta
    assert booking.grade(meta, _booking(meta)) == dict.fromkeys(booking.CRITERIA, True)
    # case and phone punctuation do not matter; content does
    loose = _booking(meta, first=meta["user"]["first"].upper(), phone="(" + meta["user"]["phone"] + ")")
    assert all(booking.grade(meta, loose).values())
    wrong_party = booking.grade(meta, _booking(meta, party=str(int(meta["party"]) + 1)))
    assert wrong_party == {"date_time": True, "party_size": False, "user_info": True, "completed": True}
    assert booking.progress(wrong_party) == 0.75
    other_time = next(t for t in booking.restaurants()[meta["restaurant"]].slots() if t != meta["time"])
    assert not booking.grade(meta, _booking(meta, time=other_time))["date_time"]
    assert not booking.grade(meta, _booking(meta, email="someone@else.com"))["user_info"]
    assert not booking.grade(meta, _booking(meta, confirmed=False))["completed"]
    other_place = next(s for s in booking.restaurants() if s != meta["restaurant"])
    assert not any(booking.grade(meta, _booking(meta, restaurant=other_place)).values())
    assert booking.progress(booking.grade(meta, {})) == 0.0


def test_select_options_match_by_label_words():
    dates = [(d, booking.date_label(d)) for d in booking.all_dates()]
    assert _match_option("June 1", dates) == "2025-06-01"  # not June 10..19
    assert _match_option("Tue, June 17", dates) == "2025-06-17"
    assert _match_option("2025-06-17", dates) == "2025-06-17"
    times = [(t, booking.time_label(t)) for t in booking.all_times()]
    assert _match_option("7:00pm", times) == "19:00"
    assert _match_option("7:00 P.M.", times) == "19:00"
    assert _match_option("7", times) is None  # ambiguous: 7:00 and 7:30
    party = [(str(n), booking.party_label(n)) for n in booking.PARTY_SIZES]
    assert _match_option("2", party) == "2" and _match_option("1 person", party) == "1"
    assert _match_option("", party) is None


def test_only_the_site_origin_unless_allow_listed():
    site = "http://127.0.0.1:8080"
    for ok in ("http://127.0.0.1:8080/x", "HTTP://127.0.0.1:8080", "http://127.0.0.1:8080/a?b#c"):
        assert url_problem(ok, [site]) is None, ok
    # other loopback ports (the dashboard, serve-env, a model server) and other schemes of the same host
    for bad in ("http://127.0.0.1:8081/", "https://127.0.0.1:8080/", "http://localhost:8080/", "http://[::1]:8080/",
                "http://127.0.0.1/", "https://example.com/", "http://10.0.0.1/"):
        assert "is not the site's origin and not in the allow-list" in url_problem(bad, [site]), bad
    assert "http://127.0.0.1:8081 is not the site's origin" in url_problem("http://127.0.0.1:8081/", [site])
    assert "scheme" in url_problem("file:///etc/passwd", [site])
    assert "scheme" in url_problem("javascript:alert(1)", [site])
    assert "not a valid URL" in url_problem("http://127.0.0.1:99999/", [site])
    assert url_problem("https://Example.COM/a", [site, "example.com"]) is None  # a host: any port
    assert url_problem("http://example.com:8443/", [site, "example.com"]) is None
    assert "not the site's origin" in url_problem("https://evil.example.com.attacker.net/", [site, "example.com"])
    assert url_problem("http://[::1]:9/", [site, "http://[::1]:9"]) is None  # an origin: that port only
    assert "not the site's origin" in url_problem("http://[::1]:10/", [site, "http://[::1]:9"])
    assert url_problem("https://shop.test/x", ["https://shop.test:443/"]) is None
    assert WebEnv("example.com, shop.test").allow == ("example.com", "shop.test")
    assert WebEnv("http://127.0.0.1:9000,example.org").allow == ("http://127.0.0.1:9000", "example.org")
    assert [bypass_rule(a) for a in ("Example.org", "http://127.0.0.1:9000", "https://shop.test/")] == [
        "example.org", "http://127.0.0.1:9000", "https://shop.test:443"]
    for bad in ("http://example.com/path", "ftp://example.com", "example.com:80", "a b"):
        with pytest.raises(EnvError, match="is not a host name or an origin"):
            WebEnv(bad)


def test_render_bounds_hostile_observation_data():
    huge = "A" * 1_000_000
    label = "\x00\x1b[31m" + huge
    data = {"title": huge, "url": "http://127.0.0.1/" + huge,
            "items": [{"id": i, "kind": "button", "label": label, "value": huge} for i in range(5000)]
            + [{"id": None, "kind": "text", "label": "<script>alert(1)</script>"}],
            "truncated": True, "scroll": [0, 10_000]}
    text = render(data, 3000)
    assert len(text) <= 3000
    assert "\x00" not in text and "\x1b" not in text
    assert max(len(line) for line in text.splitlines()) < 500
    assert "(page truncated" in text


def _fetch(url: str, sid: str, data: dict | None = None) -> tuple[int, str, str]:
    """(status, location, body) without following redirects."""
    parts = urllib.parse.urlsplit(url)
    con = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    body = urllib.parse.urlencode(data) if data is not None else None
    headers = {"Cookie": f"sid={sid}"}
    if body is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    con.request("POST" if data is not None else "GET", parts.path + ("?" + parts.query if parts.query else ""),
                body=body, headers=headers)
    resp = con.getresponse()
    out = (resp.status, resp.getheader("Location") or "", resp.read().decode())
    con.close()
    return out


def test_site_posts_redirect_to_reproducible_pages_and_sessions_stay_apart():
    server = BookingServer()
    try:
        meta = booking.tasks()[1].meta
        form = {"r": meta["restaurant"], "date": meta["date"], "time": meta["time"], "party": str(meta["party"]),
                "first": "Ann", "last": "", "phone": "12", "email": "nope"}
        status, location, _ = _fetch(server.url + "/reserve", "s1", form)
        assert status == 303 and location.startswith("/book?")
        status, _, page = _fetch(server.url + location, "s1")
        assert status == 200 and "Please enter last name, a valid email, a phone number" in page
        assert 'value="Ann"' in page  # the typed values survive the redirect
        form.update(last="Lee", phone="555-0100", email="ann@example.com", first="<b>Ann</b>")
        status, location, _ = _fetch(server.url + "/reserve", "s1", form)
        assert (status, location) == (303, "/confirmation/R-0001")
        page = _fetch(server.url + location, "s1")[2]
        assert "Reservation confirmed" in page and "&lt;b&gt;Ann&lt;/b&gt;" in page and "<b>Ann" not in page
        assert _fetch(server.url + location, "s2")[0] == 404  # another session sees nothing
        assert len(server.sessions.get("s1")["reservations"]) == 1 and server.sessions.get("s2")["reservations"] == []
        assert _fetch(server.url + "/search?q=coconi", "s2")[2].count('class="slot"') >= 2
        with urllib.request.urlopen(server.url + "/static/style.css", timeout=10) as r:
            assert r.headers["Content-Type"] == "text/css"
    finally:
        server.close()
