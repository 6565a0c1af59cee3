"""Database secrets in every form libpq accepts (issue 25, item 9): masked wherever a location is
shown, and kept off a job worker's command line (they travel in its environment)."""

from __future__ import annotations

import pytest

from engine.jobs.runner import worker_command
from engine.store import Store, StoreError, credentials, postgres

SECRET = "hunter2xyz"

# (location, what a page or message shows)
FORMS = [
    (f"postgresql://ann:{SECRET}@db.example:5432/orchard?sslmode=require",
     "postgresql://ann:***@db.example:5432/orchard?sslmode=require"),
    (f"postgresql://ann@db.example/orchard?password={SECRET}&sslmode=require",
     "postgresql://ann@db.example/orchard?password=***&sslmode=require"),
    (f"postgres://ann@db.example/orchard?sslmode=require&PassWord={SECRET}",
     "postgres://ann@db.example/orchard?sslmode=require&PassWord=***"),
    (f"postgresql://ann@db.example/orchard?pass%77ord={SECRET}", "postgresql://ann@db.example/orchard?pass%77ord=***"),
    (f"postgresql://ann@db.example/orchard?sslpassword={SECRET}", "postgresql://ann@db.example/orchard?sslpassword=***"),
    (f"postgresql://ann:{SECRET}@h1:5432,h2:5433/orchard", "postgresql://ann:***@h1:5432,h2:5433/orchard"),
    (f"host=db.example user=ann password={SECRET} dbname=orchard", "host=db.example user=ann password=*** dbname=orchard"),
    (f"host=db.example password = '{SECRET} with\\' quote' dbname=orchard", "host=db.example password = *** dbname=orchard"),
    (f"host=db.example sslpassword={SECRET}", "host=db.example sslpassword=***"),
]


@pytest.mark.parametrize(("location", "shown"), FORMS)
def test_every_credential_form_is_masked(location: str, shown: str) -> None:
    assert credentials.redact(location) == shown
    assert postgres.redact(location) == shown  # the store's messages use the same function
    (secret,) = credentials.secrets(location).values()
    assert secret.startswith(SECRET)
    assert SECRET not in credentials.scrub(f"could not connect: password {secret} rejected", location)


def test_a_location_without_secrets_is_left_as_it_is() -> None:
    for location in ("/tmp/orchard.db", "postgresql://ann@db.example/orchard?sslmode=require", "host=db user=ann"):
        assert credentials.redact(location) == location and credentials.secrets(location) == {}


@pytest.mark.parametrize("url", [u for u, _ in FORMS if u.startswith("postgres")])
def test_a_workers_command_line_carries_no_secret(url: str) -> None:
    argv, env = worker_command("python", "j1", url, "cpu", "sft", {})
    assert SECRET not in " ".join(argv)
    assert any(SECRET in v for v in env.values())
    key = "ORCHARD_PGSSLPASSWORD" if "sslpassword" in url else "PGPASSWORD"
    assert env[key] == credentials.secrets(url)[key.removeprefix("ORCHARD_PG").removeprefix("PG").lower()]


def test_the_query_password_goes_to_pgpassword() -> None:
    argv, env = worker_command("python", "j1", f"postgresql://ann@db.example/orchard?password={SECRET}&sslmode=require",
                               "cpu", "sft", {})
    assert argv[argv.index("--db") + 1] == "postgresql://ann@db.example/orchard?sslmode=require"
    assert env["PGPASSWORD"] == SECRET


def test_an_unreachable_servers_error_masks_the_query_password() -> None:
    pytest.importorskip("psycopg")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"postgresql://ann@127.0.0.1:{port}/orchard?password={SECRET}&connect_timeout=2"
    with pytest.raises(StoreError) as caught:
        Store(url)
    assert SECRET not in str(caught.value) and "password=***" in str(caught.value)
