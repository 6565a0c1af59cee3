"""A throwaway PostgreSQL server for the store's tests, so every store test runs on both backends.

`$ORCHARD_TEST_PG` (a `postgresql://` URL of a server you started) is used when set; otherwise, when
Debian's (or any) PostgreSQL binaries are installed, `initdb` + `pg_ctl start` a cluster in a temporary
folder on a free loopback port (as the `postgres` user when run as root: the server refuses root),
stopped at the end of the session. Each test gets its own schema (via `search_path` in the URL), so
tests never see each other's tables and no database has to be created per test.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

TEST_PG_ENV = "ORCHARD_TEST_PG"
USER = "orchard"
PASSWORD_ROLE = "orchard_pw"  # on the fixture's own server, this role logs in with a password


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str]) -> list[str]:
    """The command as the `postgres` user when we are root (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return argv
    return ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(f"'{a}'" for a in argv)]


def start_server() -> tuple[str, Path, Path]:
    """(base URL, data folder, bin folder) of a new cluster; raises RuntimeError saying why not."""
    bindir = _bin_dir()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin)")
    folder = Path(tempfile.mkdtemp(prefix="orchard-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    data = folder
    port = _free_port()
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "-E", "UTF8",
                                    "--locale=C"]), check=True, capture_output=True, timeout=120)
    hba = data / "pg_hba.conf"  # one role that must give a password: the wrong-password test's
    hba.write_text(f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(data / "log"),
                                    "-w", "start"]), check=True, capture_output=True, timeout=120)
    return f"postgresql://{USER}@127.0.0.1:{port}/postgres", data, bindir


def stop_server(data: Path, bindir: Path) -> None:
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                   check=False, capture_output=True, timeout=60)
    shutil.rmtree(data, ignore_errors=True)


def with_schema(base: str, schema: str) -> str:
    """`base` with `search_path` set to `schema` (libpq's `options` parameter)."""
    return f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The base URL of a PostgreSQL server for tests (skips with the reason when there is none)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg 3 is not installed (pip install 'orchard[postgres]')")
    if os.environ.get(TEST_PG_ENV):
        yield os.environ[TEST_PG_ENV]
        return
    try:
        base, data, bindir = start_server()
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        pytest.skip(f"no PostgreSQL server for the tests: {e} {detail.decode(errors='replace')[:200]}"
                    f" (install postgresql, or set {TEST_PG_ENV})")
    try:
        yield base
    finally:
        stop_server(data, bindir)


class PgSchemas:
    """Fresh schemas on the test server, dropped at the end of the test."""

    def __init__(self, base: str) -> None:
        self.base, self.made = base, []

    def new(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.base, autocommit=True) as con:
            con.execute(f"CREATE SCHEMA {name}")
        self.made.append(name)
        return with_schema(self.base, name)

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as con:
            for name in self.made:
                con.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def new_db(request, backend, tmp_path) -> Iterator:
    """A factory of empty store locations on the test's backend: a file path, or a fresh schema's URL."""
    if backend == "sqlite":
        names = iter(range(1_000_000))
        yield lambda: str(tmp_path / f"store{next(names)}.db")
        return
    schemas = PgSchemas(request.getfixturevalue("pg_server"))
    try:
        yield schemas.new
    finally:
        schemas.drop()


@pytest.fixture
def db(new_db) -> str:
    """One empty store location on each backend (the store tests are parametrized over both)."""
    return new_db()
