"""A scripted expert for the booking site that reads the observation text, like a model would.

It decides from the current page alone (not from a fixed command list), so it can finish a task from
any state a search reaches, and it exercises the same observation format and commands as a policy.
Given a task's meta with a wrong value, it makes the wrong booking (how tests check the grader).
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from engine.envs.web_site import booking as b

_ELEMENT = re.compile(r'^\[(\d+)\] (\S+) "(.*?)"(?: value="(.*?)")?(?: options: .*)?$')


def elements(observation: str) -> list[tuple[int, str, str, str | None]]:
    """(id, kind, label, value) of every element line of an observation."""
    out = []
    for line in observation.splitlines():
        m = _ELEMENT.match(line)
        if m:
            out.append((int(m[1]), m[2], m[3], m[4]))
    return out


def page_url(observation: str) -> urllib.parse.SplitResult:
    m = re.search(r"^URL: (\S+)$", observation, re.MULTILINE)
    return urllib.parse.urlsplit(m[1] if m else "")


def expert_command(meta: dict[str, Any], observation: str) -> str | None:
    """The next command towards booking `meta` (None: the booking is confirmed)."""
    els = elements(observation)
    url = page_url(observation)
    q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
    r = b.restaurants()[meta["restaurant"]]
    who = meta["user"]
    want = {"Date": b.date_label(meta["date"]), "Time": b.time_label(meta["time"]),
            "Party size": b.party_label(int(meta["party"]))}

    def find(kind: str, label: str) -> tuple[int, str | None] | None:
        return next(((i, v) for i, k, lab, v in els if k == kind and lab.strip() == label), None)

    def fix_pickers() -> str | None:
        for label, value in want.items():
            el = find("select", label)
            if el and el[1] != value:
                return f"TYPE [{el[0]}] [{value}]"
        return None

    if url.path.startswith("/confirmation/"):
        return None
    if url.path == "/":
        box = find("textbox", "Restaurant, cuisine or area")
        if box and box[1] != r.name:
            return f"TYPE [{box[0]}] [{r.name}]"
        step = fix_pickers()
        if step:
            return step
        go = find("button", "Let's go")
        return f"CLICK [{go[0]}]" if go else "GOTO [/]"
    if url.path == "/search":
        link = find("link", r.name)
        return f"CLICK [{link[0]}]" if link else "GOTO [/]"
    if url.path == f"/r/{r.slug}":
        step = fix_pickers()
        if step:
            return step
        searched = (q.get("date"), q.get("time"), q.get("party")) == (meta["date"], meta["time"], str(meta["party"]))
        slot = find("link", want["Time"])
        if searched and slot:
            return f"CLICK [{slot[0]}]"
        find_table = find("button", "Find a table")
        return f"CLICK [{find_table[0]}]" if find_table else f"GOTO [/r/{r.slug}]"
    if url.path == "/book" and q.get("r") == r.slug and (q.get("date"), q.get("time"), q.get("party")) == (
            meta["date"], meta["time"], str(meta["party"])):
        for label, value in (("First name", who["first"]), ("Last name", who["last"]),
                             ("Phone number", who["phone"]), ("Email", who["email"])):
            el = find("textbox", label)
            if el and el[1] != value:
                return f"TYPE [{el[0]}] [{value}]"
        done = find("button", "Complete reservation")
        return f"CLICK [{done[0]}]" if done else "GOTO [/]"
    return f"GOTO [/r/{r.slug}]"
