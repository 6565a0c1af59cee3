"""Logins with the real Argon2 parameters: an unknown user name costs what a known one does (no
user enumeration by timing), and after 5 wrong attempts the name, and the client, are refused even
with the right password until the lock passes (a clock injected), longer at each further lock."""

from __future__ import annotations

import statistics
import time

import pytest

from engine import auth
from engine.store import Store


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.db") as s:
        auth.add_user(s, "ann", "curator", "correct horse")
        yield s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _median_s(store, name: str, n: int = 3) -> float:
    times = []
    for _ in range(n):
        began = time.perf_counter()
        with pytest.raises(auth.AuthError, match="wrong user name or password"):
            auth.login(store, name, "wrong password", throttle=auth.LoginThrottle())
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def test_an_unknown_user_name_answers_as_slowly_as_a_known_one(store):
    auth._dummy_hash()  # made once per process, like the hasher itself
    known, unknown = _median_s(store, "ann"), _median_s(store, "nobody")
    assert known > 0.01, f"known user: {known * 1000:.2f} ms (is Argon2 really verifying?)"
    assert 1 / 3 < unknown / known < 3, f"unknown {unknown * 1000:.1f} ms vs known {known * 1000:.1f} ms"


def test_the_sixth_attempt_is_refused_even_with_the_right_password_until_the_lock_passes(store):
    clock = Clock()
    throttle = auth.LoginThrottle(clock)
    for _ in range(auth.MAX_FAILURES):
        clock.now += 60
        with pytest.raises(auth.AuthError, match="wrong user name or password"):
            auth.login(store, "ann", "guess", client="10.0.0.9", throttle=throttle)
    with pytest.raises(auth.AuthError, match="too many failed logins .* try again in 15 min"):
        auth.login(store, "ann", "correct horse", client="10.0.0.1", throttle=throttle)  # the name is locked
    with pytest.raises(auth.AuthError, match="too many failed logins"):
        auth.login(store, "bob", "x" * 8, client="10.0.0.9", throttle=throttle)  # and so is the client
    clock.now += auth.LOCK_S - 1
    with pytest.raises(auth.AuthError, match="too many failed logins"):
        auth.login(store, "ann", "correct horse", client="10.0.0.1", throttle=throttle)
    clock.now += 2
    assert store.session_user(auth.login(store, "ann", "correct horse", client="10.0.0.1", throttle=throttle))
    # Failures spread wider than the window never lock; a second lock lasts twice as long.
    for _ in range(2 * auth.MAX_FAILURES):
        with pytest.raises(auth.AuthError, match="wrong user name or password"):
            auth.login(store, "nobody", "guess", throttle=throttle)
        clock.now += auth.WINDOW_S / (auth.MAX_FAILURES - 1)
    clock.now += auth.WINDOW_S  # those failures are forgotten
    for lock in (1, 2):
        for _ in range(auth.MAX_FAILURES):
            with pytest.raises(auth.AuthError, match="wrong user name or password"):
                auth.login(store, "nobody", "guess", throttle=throttle)
        with pytest.raises(auth.AuthError, match=f"try again in {15 * lock} min"):
            auth.login(store, "nobody", "guess", throttle=throttle)
        clock.now += auth.LOCK_S * lock + 1
