"""PostgreSQL behind the store: `orchard db copy` both ways, the dialect shim, and bad input (a wrong
URL or password, a server that goes away mid-session) as one-line errors with nothing half-written.
The store's own suites (test_store, test_curation) run on both backends through tests/pg_fixture.py."""

from __future__ import annotations

import psycopg_guard  # noqa: F401 - skips this module without psycopg
import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv
from pg_fixture import PASSWORD_ROLE, TEST_PG_ENV, PgSchemas

from engine.cli import main
from engine.config import SearchConfig
from engine.search.runner import new_run
from engine.store import Store, StoreError, postgres
from engine.store.copy import copy_order


def _fill(location: str) -> dict[str, int]:
    """A store with a finished run, pairs, a curated pair, a job, a model: every table gets rows."""
    from engine.store import ModelRecord

    with Store(location) as store:
        run_id, _ = new_run(store, "line", SnapshotLineEnv().tasks()[:2], ScriptedGenerator(p_garbage=0.2),
                            SearchConfig(simulations=6, k=3, depth_limit=4), "r", make_env=SnapshotLineEnv)
        from engine.datasets.pairs import PairsConfig, build_pairs
        from engine.datasets.samples import TreeRef

        refs = [TreeRef(store.load_tree(t), run_id, t, "desc") for t, _ in store.tree_ids(run_id)]
        built = build_pairs(refs, PairsConfig())
        store.save_pairs(run_id, built.step + built.trajectory)
        first = store.pairs()[0]
        store.set_pair_status(first.id, "approved", "ann", first.version)
        job = store.create_job("sft", {"a": 1}, "cpu")
        store.add_job_metrics(job.id, {"loss": 1.0}, step=1)
        store.save_model(ModelRecord(path="/m", name="m", kind="sft", job_id=job.id, data_ids=["x"]))
        store.save_iteration("loop", 0, "dpo", {"k": "v\x00nul"})
        return {t: int(store.con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in copy_order()}


@pytest.fixture
def pg(pg_server):
    schemas = PgSchemas(pg_server)
    yield schemas
    schemas.drop()


def test_copy_sqlite_to_postgresql_and_back_keeps_every_row(tmp_path, pg, capsys):
    sqlite_db = str(tmp_path / "a.db")
    counts = _fill(sqlite_db)
    url = pg.new()
    assert main(["db", "copy", sqlite_db, url]) == 0
    assert f"copied {sum(counts.values())} rows" in capsys.readouterr().out
    back = str(tmp_path / "b.db")
    assert main(["db", "copy", url, back]) == 0
    with Store(sqlite_db) as a, Store(url) as p, Store(back) as b:
        for store in (p, b):
            assert [r.id for r in store.runs()] == [r.id for r in a.runs()]
            for tree_id, _ in a.tree_ids(a.runs()[0].id):
                mine, theirs = store.load_tree(tree_id), a.load_tree(tree_id)
                assert [vars(n) for n in mine.nodes] == [vars(n) for n in theirs.nodes]
                assert mine.simulations == theirs.simulations
            assert store.pairs() == a.pairs() and len(a.pairs()) > 1
            assert store.pair_history(a.pairs()[0].id) == a.pair_history(a.pairs()[0].id)
            assert store.iterations()[0]["k"] == "v\x00nul"  # NUL survives PostgreSQL's TEXT
            assert store.models() == a.models()
        # identities move on past the copied ids: a new model record gets a fresh id
        from engine.store import ModelRecord

        p.save_model(ModelRecord(path="/m2", name="m2", kind="sft"))
        assert len(p.models()) == 2


def test_copy_refuses_a_non_empty_destination_and_writes_nothing(tmp_path, pg):
    src, dst = str(tmp_path / "a.db"), pg.new()
    _fill(src)
    with Store(dst) as store:
        store.create_job("sft", {}, "cpu")
    assert main(["db", "copy", src, dst]) == 2
    with Store(dst) as store:
        assert len(store.jobs()) == 1 and store.runs() == []
    with pytest.raises(StoreError, match="same store"):
        from engine.store.copy import copy_store

        copy_store(src, src)


def test_a_copy_that_fails_midway_leaves_no_new_file(tmp_path, pg, monkeypatch):
    from engine.store import copy as copy_module

    src = pg.new()
    _fill(src)
    dst = tmp_path / "new.db"
    original = copy_module._copy

    def broken(source, target):  # the destination loses rows behind the copy's back: the count check sees it
        target.con.execute("CREATE TEMP TRIGGER drop_one AFTER INSERT ON iterations BEGIN "
                           "DELETE FROM iterations; END")
        return original(source, target)

    monkeypatch.setattr(copy_module, "_copy", broken)
    with pytest.raises(StoreError, match="iterations has 0 rows after the copy"):
        copy_module.copy_store(src, str(dst))
    assert not dst.exists()


def test_sql_translation():
    from engine.store.postgres import _placeholders, translate_ddl

    assert _placeholders("SELECT ? FROM t WHERE a='?%' AND b LIKE '%'||?", True) == \
        "SELECT %s FROM t WHERE a='?%%' AND b LIKE '%%'||%s"
    assert translate_ddl("CREATE TABLE x (id INTEGER PRIMARY KEY, v REAL, b BLOB, t TEXT)") == [
        ('CREATE TABLE x (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, v DOUBLE PRECISION, b BYTEA, '
         't TEXT COLLATE "C")')]
    assert translate_ddl("CREATE TABLE y (id INTEGER PRIMARY KEY AUTOINCREMENT)") == [
        "CREATE TABLE y (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY)"]
    assert translate_ddl("ALTER TABLE jobs ADD COLUMN n INTEGER NOT NULL DEFAULT 0") == [
        "ALTER TABLE jobs ADD COLUMN n BIGINT NOT NULL DEFAULT 0"]
    assert translate_ddl("ALTER TABLE models RENAME TO models_v4")[1] == \
        "ALTER INDEX IF EXISTS models_pkey RENAME TO models_v4_pkey"
    for text in ("plain", "a\x00b", "\ue000", "\ue000e\x00\ue0000"):
        assert postgres.unescape_text(postgres.escape_text(text)) == text


def test_urls_are_redacted_and_passwords_kept_off_command_lines():
    url = "postgresql://ann:s3cr%40t@db.example:5432/orchard?sslmode=require"
    assert postgres.redact(url) == "postgresql://ann:***@db.example:5432/orchard?sslmode=require"
    assert postgres.split_password(url) == ("postgresql://ann@db.example:5432/orchard?sslmode=require", "s3cr@t")
    from engine.jobs.runner import worker_command

    argv, env = worker_command("python", "j1", url, "cpu", "sft", {})
    assert "s3cr" not in " ".join(argv) and env["PGPASSWORD"] == "s3cr@t"


def test_wrong_password_or_url_is_one_line_naming_the_server(pg_server, capsys):
    import os

    if os.environ.get(TEST_PG_ENV):
        pytest.skip(f"{TEST_PG_ENV} names an outside server: the password role exists only on the fixture's")
    import psycopg

    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        con.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD 'right'")
    bad = pg_server.replace("orchard@", f"{PASSWORD_ROLE}:wrong-secret@")
    assert main(["runs", "--db", bad]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to PostgreSQL" in err and "password authentication failed" in err
    assert "wrong-secret" not in err and f"{PASSWORD_ROLE}:***@" in err and len(err.strip().splitlines()) == 1
    port = pg_server.rsplit(":", 1)[1].split("/")[0]
    closed = pg_server.replace(f":{port}/", ":1/")
    with pytest.raises(StoreError, match=r"127.0.0.1:1/postgres: cannot connect"):
        Store(closed)
    with pytest.raises(StoreError, match="cannot connect"):
        Store("postgresql://orchard@127.0.0.1:1/x?sslmode=nonsense")


def test_a_server_that_drops_the_connection_retries_reads_and_refuses_half_writes(pg):
    import psycopg

    url = pg.new()
    with Store(url) as store, psycopg.connect(pg.base, autocommit=True) as admin:
        job = store.create_job("sft", {}, "cpu")

        def kill():
            pid = store.con.raw.info.backend_pid
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

        kill()
        assert store.job(job.id).state == "queued"  # a read: reconnected and retried
        lost = "connection to PostgreSQL lost.*nothing of it was saved"
        with pytest.raises(StoreError, match=lost), store.transaction() as con:
            con.execute("UPDATE jobs SET state='running' WHERE id=?", (job.id,))
            kill()
            con.execute("UPDATE jobs SET name='half' WHERE id=?", (job.id,))
        again = store.job(job.id)
        assert (again.state, again.name) == ("queued", job.name)  # nothing half-written
        kill()  # gone while idle: the next write transaction re-opens the connection at BEGIN and goes through
        store.request_job_cancel(job.id)
        assert store.job(job.id).state == "cancelled"


def test_foreign_schema_and_readonly_are_refused_untouched(pg):
    import psycopg

    url = pg.new()
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(StoreError, match="not Orchard's"):
        Store(url)
    fresh = pg.new()
    with pytest.raises(StoreError, match="no Orchard database there yet"):
        Store(fresh, readonly=True)
    with Store(fresh) as store:
        store.create_job("sft", {}, "cpu")
    with Store(fresh, readonly=True) as ro, pytest.raises(StoreError, match="read-only transaction"):
        ro.con.execute("DELETE FROM jobs")


def test_a_url_in_orchard_db_or_db_stays_a_url(monkeypatch, tmp_path):
    from pathlib import Path

    from engine import paths

    url = "postgresql://ann@127.0.0.1:5432/orchard"
    assert paths.db_path(url) == url  # a Path would fold "//" into "/"
    monkeypatch.setenv("ORCHARD_DB", url)
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path))
    assert paths.db_path() == url and paths.db_exists(url)
    assert paths.jobs_dir(url) == tmp_path / "jobs"
    assert paths.db_path(tmp_path / "x.db") == tmp_path / "x.db" and not paths.db_exists(tmp_path / "x.db")
    assert paths.jobs_dir(Path("/a/b.db")) == Path("/a/jobs")


def test_a_new_schema_url_is_an_empty_store_of_its_own_and_the_commit_thread_writes_there(pg_server):
    """postgres.new_schema_url (bench/scale.py --store-url): each call a fresh schema, stores apart; a search
    committing on its commit thread (runner writer="thread") stores its trees there too."""
    import psycopg

    a, b = postgres.new_schema_url(pg_server, "t_scale"), postgres.new_schema_url(pg_server, "t_scale")
    try:
        assert a != b
        with Store(a) as store:
            run_id, _ = new_run(store, "line", SnapshotLineEnv().tasks()[:2], ScriptedGenerator(p_right=0.5),
                                SearchConfig(simulations=3, k=2, depth_limit=3), "r", make_env=SnapshotLineEnv,
                                writer="thread")
            assert store.run(run_id).status == "finished" and store.run(run_id).simulations == 6
        with Store(b) as store:
            assert store.runs() == []
        with pytest.raises(StoreError, match="schema prefix 'x; DROP'"):
            postgres.new_schema_url(pg_server, "x; DROP")
    finally:
        with psycopg.connect(pg_server, autocommit=True) as con:
            for url in (a, b):
                con.execute(f"DROP SCHEMA IF EXISTS {url.rsplit('%3D', 1)[1]} CASCADE")
