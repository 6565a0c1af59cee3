"""The booking site's domain: restaurants, picker options, generated tasks and the grader.

Kept free of HTTP and browser code so that tasks and grading are testable on their own and the same
grader scores a live browser episode and a stored reservation. The four criteria are the ones Agent Q's
judge checks (date/time, party size, user info, reservation completed); progress is their share.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.envs.base import EnvError, TaskSpec

HERE = Path(__file__).resolve().parent
YEAR, MONTH = 2025, 6  # every date on the site is in June 2025 (deterministic weekdays)
SLOT_MINUTES = 30
PARTY_SIZES = tuple(range(1, 11))
N_TASKS = 150
TEST_EVERY = 5  # task i is a test task when i % TEST_EVERY == TEST_EVERY - 1
SPLITS = ("train", "test")
CRITERIA = ("date_time", "party_size", "user_info", "completed")
FIRST = ("Jane", "Omar", "Priya", "Lucas", "Mei", "Samuel", "Ana", "Kofi", "Elena", "Noah", "Aiko", "Diego")
LAST = ("Doe", "Haddad", "Sharma", "Martin", "Chen", "Okafor", "Silva", "Mensah", "Rossi", "Kim", "Tanaka", "Lopez")


@dataclass(frozen=True)
class Restaurant:
    slug: str
    name: str
    cuisine: str
    area: str
    price: str
    open: str  # "HH:MM", first bookable slot
    close: str  # "HH:MM", last bookable slot
    blurb: str

    def slots(self) -> list[str]:
        return [t for t in all_times() if self.open <= t <= self.close]


@lru_cache(maxsize=1)
def restaurants() -> MappingProxyType:
    """slug -> Restaurant, in file order."""
    rows = json.loads((HERE / "restaurants.json").read_text(encoding="utf-8"))
    return MappingProxyType({r["slug"]: Restaurant(**r) for r in rows})


def all_dates() -> list[str]:
    return [dt.date(YEAR, MONTH, d).isoformat() for d in range(1, 31)]


def all_times() -> list[str]:
    return [f"{m // 60:02d}:{m % 60:02d}" for m in range(17 * 60, 22 * 60 + 1, SLOT_MINUTES)]


def date_label(iso: str) -> str:
    """'2025-06-17' -> 'Tue, June 17'."""
    d = dt.date.fromisoformat(iso)
    return f"{d:%a}, {d:%B} {d.day}"


def time_label(hhmm: str) -> str:
    """'19:00' -> '7:00 PM'."""
    h, m = (int(x) for x in hhmm.split(":"))
    return f"{(h - 1) % 12 + 1}:{m:02d} {'AM' if h < 12 else 'PM'}"


def party_label(n: int) -> str:
    return f"{n} {'person' if n == 1 else 'people'}"


def digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def user(i: int) -> dict[str, str]:
    first, last = FIRST[i % len(FIRST)], LAST[(i * 7 + 3) % len(LAST)]
    return {"first": first, "last": last, "email": f"{first}.{last}@example.com".lower(),
            "phone": f"555-01{(i * 37) % 100:02d}"}


def _task(i: int, split: str, task_id: str) -> TaskSpec:
    rng = random.Random(f"orchard-web-booking-{i}")  # seeded from the string: same in every process
    r = rng.choice(list(restaurants().values()))
    date = rng.choice(all_dates())
    time = rng.choice(r.slots())
    party = rng.choice(PARTY_SIZES[:8])
    who = user(rng.randrange(1000))
    day = dt.date.fromisoformat(date).day
    when = time_label(time).replace(" ", "").lower()  # "7:00pm", as Agent Q's tasks write it
    goal = (f"Book {r.name} for {party} on June {day} at {when} as {who['first']} {who['last']} "
            f"(email {who['email']}, phone {who['phone']}).")
    meta = {"restaurant": r.slug, "date": date, "time": time, "party": party, "user": who}
    return TaskSpec(id=task_id, goal=goal, split=split, meta=meta)


@lru_cache(maxsize=1)
def _tasks() -> MappingProxyType:
    by_split: dict[str, list[TaskSpec]] = {s: [] for s in SPLITS}
    for i in range(N_TASKS):
        split = "test" if i % TEST_EVERY == TEST_EVERY - 1 else "train"
        by_split[split].append(_task(i, split, f"{split}-{len(by_split[split])}"))
    return MappingProxyType({s: tuple(ts) for s, ts in by_split.items()})


def tasks(split: str = "train") -> list[TaskSpec]:
    if split not in SPLITS:
        raise EnvError(f"unknown web split {split!r} (known: {', '.join(SPLITS)})")
    return list(_tasks()[split])


def task(task_id: str) -> TaskSpec:
    split = task_id.partition("-")[0]
    for t in _tasks().get(split, ()):
        if t.id == task_id:
            return t
    sizes = ", ".join(f"{s}-0..{s}-{len(ts) - 1}" for s, ts in _tasks().items())
    raise EnvError(f"unknown web task id {task_id!r} (ids are {sizes})")


def grade(meta: dict[str, Any], booking: dict[str, Any]) -> dict[str, bool]:
    """The four criteria for a booking (a reservation, or a draft: fields missing so far are False).
    `completed` needs a confirmed reservation at the task's restaurant."""
    want_user = meta["user"]
    same_place = booking.get("restaurant") == meta["restaurant"]
    user_ok = (
        str(booking.get("first", "")).strip().lower() == want_user["first"].lower()
        and str(booking.get("last", "")).strip().lower() == want_user["last"].lower()
        and str(booking.get("email", "")).strip().lower() == want_user["email"].lower()
        and digits(str(booking.get("phone", ""))) == digits(want_user["phone"])
    )
    return {
        "date_time": same_place and booking.get("date") == meta["date"] and booking.get("time") == meta["time"],
        "party_size": same_place and str(booking.get("party")) == str(meta["party"]),
        "user_info": same_place and user_ok,
        "completed": same_place and bool(booking.get("confirmed")),
    }


def progress(criteria: dict[str, bool]) -> float:
    return sum(criteria[c] for c in CRITERIA) / len(CRITERIA)
