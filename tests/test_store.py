"""Store: schema, one transaction per simulation, refusal of foreign files, resume after SIGKILL."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv

from engine.actions import CompositeAction
from engine.config import SearchConfig
from engine.envs.base import TaskSpec
from engine.search.runner import new_run, resume_run
from engine.store import SCHEMA_VERSION, Store, StoreError
from engine.store.runs import SimulationRows, simulation_rows
from engine.tree_nodes import SearchTree, Simulation

ROOT = Path(__file__).resolve().parent.parent


def _run(store, sims=6, n_tasks=4, gen=None):
    env = SnapshotLineEnv()
    cfg = SearchConfig(simulations=sims, k=3, depth_limit=5)
    return new_run(store, "line", env.tasks()[:n_tasks], gen or ScriptedGenerator(), cfg, "t", make_env=SnapshotLineEnv)


def test_run_roundtrip(db):
    with Store(db) as store:
        run_id, _ = _run(store)
        assert store.schema_version == SCHEMA_VERSION
        (info,) = store.runs()
        assert info.id == run_id and info.status == "finished" and info.trees == 4
        assert info.simulations == 24 and info.config["k"] == 3
        assert info.stats["simulations"] == 24
        for tree_id, task_id in store.tree_ids(run_id):
            tree = store.load_tree(tree_id)
            assert tree.task.id == task_id and len(tree.simulations) == 6
            assert tree.check_invariants() == []
        # observations are stored once per distinct text
        n_obs = store.con.execute("SELECT COUNT(*) FROM observations").fetchone()[0]
        n_nodes = store.con.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
        assert n_obs < n_nodes
        assert store.find_run("t") == run_id and store.find_run(run_id[:4]) == run_id
        with pytest.raises(StoreError, match="no run"):
            store.find_run("nope")


def test_one_run_read_by_id_is_the_same_as_its_entry_in_runs(db):
    with Store(db) as store:
        searched, _ = _run(store, sims=3, n_tasks=2)
        empty = store.create_run("empty", "line", "m", {"k": 1}, [])
        other = store.create_run("other", "line", "m", {}, SnapshotLineEnv().tasks()[:3])
        store.set_run_status(other, "finished", {"simulations": 0})
        listed = {info.id: info for info in store.runs()}
        assert set(listed) == {searched, empty, other}
        for run_id, info in listed.items():
            assert store.run(run_id) == info
        assert listed[searched].nodes > 1 and listed[empty].trees == 0 and listed[other].trees == 3
        for missing in ("nope", searched[:4], "", None, "\ud800"):
            with pytest.raises(StoreError, match="no run|not valid Unicode"):
                store.run(missing)


def test_journal_is_wal(tmp_path):
    with Store(tmp_path / "o.db") as store:
        assert store.con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_foreign_and_corrupt_files_are_refused_untouched(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 10)
    before = junk.read_bytes()
    with pytest.raises(StoreError, match="not a SQLite file"):
        Store(junk)
    assert junk.read_bytes() == before

    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE users (id INTEGER)")
    con.commit()
    con.close()
    before = foreign.read_bytes()
    with pytest.raises(StoreError, match="not Orchard's"):
        Store(foreign)
    assert foreign.read_bytes() == before
    assert not (tmp_path / "foreign.db-wal").exists()

    truncated = tmp_path / "trunc.db"
    with Store(truncated) as s:
        _run(s, sims=2, n_tasks=1)
    data = truncated.read_bytes()
    truncated.write_bytes(data[:100] + b"\xff" * 200)
    with pytest.raises(StoreError):
        Store(truncated)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "o.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_failed_generator_marks_run_interrupted_and_resume_completes(db):
    class Failing(ScriptedGenerator):
        def sample(self, requests):
            if len(self.calls) >= 15:
                raise RuntimeError("server went away")
            return super().sample(requests)

    with Store(db) as store:
        with pytest.raises(RuntimeError):
            _run(store, sims=8, gen=Failing())
        (info,) = store.runs()
        assert info.status == "interrupted" and 0 < info.simulations < 32
        for tree_id, _ in store.tree_ids(info.id):
            tree = store.load_tree(tree_id)
            if tree is not None:
                assert tree.check_invariants() == []
        resume_run(store, info.id, ScriptedGenerator(), make_env=SnapshotLineEnv)
        (info,) = store.runs()
        assert info.status == "finished" and info.simulations == 32


KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from doubles import ScriptedGenerator, SnapshotLineEnv
from engine.config import SearchConfig
from engine.search.runner import new_run, resume_run
from engine.store import Store
store = Store({db!r})
gen = ScriptedGenerator(delay_s={delay})
if sys.argv[1] == "new":
    env = SnapshotLineEnv()
    new_run(store, "line", env.tasks()[:4], gen, SearchConfig(simulations=10, k=3, depth_limit=6), "killme",
            make_env=SnapshotLineEnv)
else:
    resume_run(store, "killme", gen, make_env=SnapshotLineEnv)
"""


def _committed_simulations(db: str) -> int:
    try:
        with Store(db, readonly=True) as ro:
            return int(ro.con.execute("SELECT COUNT(*) FROM simulations").fetchone()[0])
    except (StoreError, sqlite3.Error):
        return 0  # not created yet


def test_resume_after_sigkill(tmp_path, db):
    script = tmp_path / "s.py"
    script.write_text(KILL_SCRIPT.format(tests=str(ROOT / "tests"), db=str(db), delay=0.02))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), "new"], env=env)
    deadline = time.time() + 60
    sims = 0
    while time.time() < deadline:  # wait until some simulations are committed, then kill -9
        time.sleep(0.2)
        sims = _committed_simulations(db)
        if sims >= 8:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 8 <= sims < 40, "the run should have been killed mid-way"
    with Store(db) as store:
        (info,) = store.runs()
        assert info.status == "running"  # it never got to say otherwise
        committed = info.simulations
        for tree_id, _ in store.tree_ids(info.id):
            tree = store.load_tree(tree_id)
            if tree is not None:
                assert tree.check_invariants() == []
    subprocess.run([sys.executable, str(script), "resume"], env=env, check=True, timeout=120)
    with Store(db) as store:
        (info,) = store.runs()
        assert info.status == "finished" and info.simulations == 40 and committed <= 40
        for tree_id, _ in store.tree_ids(info.id):
            tree = store.load_tree(tree_id)
            assert len(tree.simulations) == 10 and tree.check_invariants() == []
            orphans = store.con.execute(
                "SELECT COUNT(*) FROM nodes c WHERE c.tree_id=? AND c.parent_id IS NOT NULL AND NOT EXISTS "
                "(SELECT 1 FROM nodes p WHERE p.tree_id=c.tree_id AND p.node_id=c.parent_id)", (tree_id,)
            ).fetchone()[0]
            assert orphans == 0
        assert json.loads(json.dumps(info.stats))["simulations"] > 0


def test_readonly_store_reads_without_writing(tmp_path):
    path = tmp_path / "o.db"
    with Store(path) as store:
        run_id, _ = _run(store, sims=2, n_tasks=1)
    before = path.read_bytes()
    with Store(path, readonly=True) as ro:
        (tree_id, _), = ro.tree_ids(run_id)
        assert ro.load_tree(tree_id).check_invariants() == []
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro.con.execute("DELETE FROM runs")
    assert path.read_bytes() == before
    with pytest.raises(StoreError, match="no such database"):
        Store(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()


def test_migrations_are_numbered_in_order_and_every_older_database_upgrades(new_db, monkeypatch) -> None:
    """A duplicated or out-of-order version would silently skip a migration on existing databases
    (on both backends: each migration is also translated for PostgreSQL)."""
    from engine.store import schema as store_module  # the migrations live in engine.store.schema

    versions = [v for v, _ in store_module.MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
    with Store(new_db()) as fresh:
        want = fresh.table_names()
    for keep in range(1, len(versions)):
        path = new_db()
        monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:keep])
        monkeypatch.setattr(store_module, "SCHEMA_VERSION", keep)
        Store(path).close()
        monkeypatch.undo()
        with Store(path) as upgraded:
            assert upgraded.schema_version == versions[-1]
            assert upgraded.table_names() == want


@pytest.mark.parametrize("key", ["%", "_", "", "%%", "_" * 3, "[a-f]*"])
def test_run_and_job_lookups_take_the_users_text_literally(db, key):
    """`orchard jobs cancel %` once cancelled the only job: the prefix went into LIKE unescaped."""
    with Store(db) as store:
        run_id, _ = _run(store, sims=2, n_tasks=1)
        job = store.create_job("sft", {}, "cpu")
        with pytest.raises(StoreError, match="no run|empty run id"):
            store.find_run(key)
        with pytest.raises(StoreError, match="no job|empty job id"):
            store.find_job(key)
        assert store.find_run(run_id[:3]) == run_id and store.find_job(job.id[:3]) == job.id
        assert store.find_run(run_id[:4].upper()) == run_id and store.find_job(job.id.upper()) == job.id


def test_cancelling_job_percent_from_the_cli_cancels_nothing(db, capsys):
    from engine.cli import main

    with Store(db) as store:  # a finished job, so the runner the command starts launches nothing
        job = store.create_job("sft", {}, "cpu")
        store.finish_job(job.id, "succeeded", expect=("queued",))
    assert main(["jobs", "cancel", "%", "--db", str(db)]) == 2
    assert "no job '%'" in capsys.readouterr().err
    with Store(db) as store:
        assert not store.job(job.id).cancel_requested


@pytest.mark.parametrize("name", ["a#b.db", "a?b.db", "a%41b.db", "a%b.db", "a b&c=d.db"])
def test_database_paths_with_uri_characters_open_read_only(tmp_path, name):
    """The read-only open builds a `file:` URI: `#`, `?` or `%xx` in the path once gave "schema version 0"
    and created a stray empty file (the path cut at `#`/`?`, or `%41` decoded to `A`)."""
    db = tmp_path / name
    with Store(db) as store:
        run_id, _ = _run(store, sims=2, n_tasks=1)
    before = sorted(p.name for p in tmp_path.iterdir())
    with Store(db, readonly=True) as ro:
        assert ro.find_run(run_id) == run_id and ro.schema_version == SCHEMA_VERSION
    with Store(db) as again:
        assert again.find_run(run_id) == run_id
    after = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm")))
    assert after == [n for n in before if not n.endswith(("-wal", "-shm"))] == [name]


def test_lone_surrogates_reaching_the_store_are_one_line_errors(db):
    """A non-UTF-8 byte in a command-line argument arrives as a lone surrogate ('\\udcff'), which
    SQLite cannot bind: once a UnicodeEncodeError traceback from every lookup and save."""
    from engine.datasets.samples import Sample, Task, Turn
    from engine.envs.base import TaskSpec

    with Store(db) as store:
        with pytest.raises(StoreError, match=r"run '\\udcff': not valid Unicode text"):
            store.find_run("\udcff")
        with pytest.raises(StoreError, match=r"job 'a\\ud800': not valid Unicode text"):
            store.find_job("a\ud800")
        with pytest.raises(StoreError, match="run name"):
            store.create_run("r\udcff", "line", "tiny", {}, [TaskSpec(id="t", goal="g", context="", split="train")])
        bad = Sample(id="s1", kind="imported", task=Task(id="t\ud800", first_observation="x"),
                     turns=(Turn(text="ACTION: go", observation=None, loss=True),))
        with pytest.raises(StoreError, match="sample s1: task id"):
            store.save_samples([bad])
        assert store.runs() == [] and store.sample_counts()["total"] == 0


def test_a_busy_check_never_removes_a_writers_wal(tmp_path: Path, monkeypatch) -> None:
    """The read-only look at a database once removed the -wal and -shm it found missing whenever it
    failed, also for a transient 'database is locked' while a job worker was opening the store: the
    worker then wrote into unlinked files and every later commit was lost (a Training page's live job
    stood still at its 9th step). A busy store is an error to retry; a writer's files stay."""
    import sqlite3 as sqlite

    from engine.store import schema

    path = tmp_path / "o.db"
    with Store(path) as store:
        store.create_run("r", "line", "m", {}, SnapshotLineEnv().tasks()[:1])
    wal, shm = path.with_name("o.db-wal"), path.with_name("o.db-shm")
    for f in (wal, shm):
        f.unlink(missing_ok=True)
    real_connect = sqlite.connect

    def writer_starts_meanwhile(*args, **kwargs):
        wal.write_bytes(b"\0" * 4096)  # another process opened the store and wrote frames
        shm.write_bytes(b"\0" * 32768)
        raise sqlite.OperationalError("database is locked")

    monkeypatch.setattr(schema.sqlite3, "connect", writer_starts_meanwhile)
    with pytest.raises(StoreError, match="busy"):
        schema._check_file(path)
    assert wal.exists() and shm.exists()

    def unreadable(*args, **kwargs):
        wal.write_bytes(b"\0" * 4096)
        raise sqlite.DatabaseError("disk I/O error")

    wal.unlink()
    shm.unlink()
    monkeypatch.setattr(schema.sqlite3, "connect", unreadable)
    with pytest.raises(StoreError, match="corrupt or unreadable"):
        schema._check_file(path)
    assert wal.exists()  # it holds frames: not this check's to remove
    monkeypatch.setattr(schema.sqlite3, "connect", real_connect)


def test_a_job_keeps_every_commit_while_others_open_and_close_the_store(tmp_path: Path, monkeypatch) -> None:
    """Opening a Store once read the file's first bytes through a plain descriptor; closing it
    dropped the POSIX locks of every SQLite connection of that process on the file (a job worker
    opens a second Store for its heartbeat thread), so a reader's close in another process (the
    dashboard polls every 2 s) took itself for the last connection, checkpointed and DELETED the
    -wal the worker still wrote to: every later commit of the job was lost."""
    from engine.jobs.runner import JobRunner

    monkeypatch.setenv("ORCHARD_JOB_HEARTBEAT_S", "0.05")
    path = tmp_path / "o.db"
    with Store(path) as store:
        job = JobRunner(store).submit("probe", {"steps": 40, "seconds": 0.05}, device="cpu")
        deadline = time.time() + 60
        while time.time() < deadline and not store.job(job.id).final:
            with Store(path) as poller:  # a poller's short-lived connection, as the dashboard's every 2 s
                poller.jobs()
            time.sleep(0.02)
        done = JobRunner(store).wait(job.id, timeout=30)
    assert done.state == "succeeded", done.error
    with Store(path, readonly=True) as reader:
        assert len(reader.job_metrics(job.id)) == 40 and reader.job(job.id).progress["step"] == 40


def add_human_branches(store: Store, run_id: str, n: int) -> None:
    """`n` human-authored children of the root of the run's first tree, backed up by one simulation."""
    tree_id, _ = store.tree_ids(run_id)[0]
    tree = store.load_tree(tree_id)
    assert tree is not None
    first_new = len(tree.nodes)
    for i in range(n):
        tree.add_child(tree.root, observation=f"after human step {i}", author="human",
                       action=CompositeAction(thought="a person's step", command=f"wait {i}"))
    path = (len(tree.nodes) - 1,)
    tree.backpropagate(list(path), 0.0)
    sim = Simulation(path, 0.0)
    tree.simulations.append(sim)
    store.save_simulation(tree_id, tree, sim, first_new)


def test_human_node_count_counts_the_runs_human_authored_nodes_only(db):
    with Store(db) as store:
        first, _ = _run(store, sims=2, n_tasks=2)
        second, _ = _run(store, sims=2, n_tasks=1)
        add_human_branches(store, first, 2)
        add_human_branches(store, second, 1)
        (last_tree, _) = store.tree_ids(first)[-1]
        by_tree = [len(store.human_nodes(t)) for t, _ in store.tree_ids(first)]
        assert by_tree == [2, 0] and store.human_nodes(last_tree) == []
        assert (store.human_node_count(first), store.human_node_count(second)) == (2, 1)
        assert store.human_node_count("no-such-run") == 0


def _grown_with_rows(tree_id: int) -> tuple[SearchTree, list[SimulationRows]]:
    """A tree grown by 4 simulations of 2 new nodes each, and the rows each wrote when it ended: the
    odd ones go on below the newest node of the one before, every one repeats an observation, the last
    finds a success."""
    tree = SearchTree.new(TaskSpec(id="t0", goal="g", context=""), "start")
    rows = []
    for s in range(4):
        first = len(tree.nodes) if s else 0  # the first writes the root too
        parent = tree.nodes[-1] if s % 2 else tree.root
        for k in range(2):
            tree.add_child(parent, observation="the same text" if k == 0 else f"seen once {s}",
                           action=CompositeAction("t", f"c{s}{k}"), critic_rank=k,
                           terminal="success" if (s, k) == (3, 1) else None, reward=1.0 if (s, k) == (3, 1) else 0.0)
        path = tuple(n.id for n in tree.path(tree.nodes[-1]))
        tree.backpropagate(list(path), 0.25 * s)
        sim = Simulation(path, 0.25 * s)
        tree.simulations.append(sim)
        rows.append(simulation_rows(tree_id, tree, sim, first))
    return tree, rows


def _stored(store: Store, tree_id: int) -> tuple:
    return (store.load_tree(tree_id),
            store.con.execute("SELECT * FROM nodes ORDER BY tree_id, node_id").fetchall(),
            sorted(store.con.execute("SELECT * FROM observations").fetchall()),
            store.con.execute("SELECT tree_id, idx, path, reward, rollout FROM simulations ORDER BY idx").fetchall(),
            store.con.execute("SELECT simulations, solved FROM trees").fetchall())


def test_a_batch_of_simulations_stores_what_saving_them_one_by_one_does(new_db):
    """save_simulations merges a batch's writes (a node's visits written once, into its INSERT when the
    batch creates it; a tree's counts once; an observation once): the tables end as one by one."""
    stored = []
    for batched in (False, True):
        with Store(new_db()) as store:
            run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id="t0", goal="g", context="")])
            ((tree_id, _),) = store.tree_ids(run_id)
            tree, rows = _grown_with_rows(tree_id)
            if batched:  # the first alone, so the batch also updates nodes it did not create (the root)
                store.save_simulations(rows[:1])
                store.save_simulations(rows[1:])
            else:
                for r in rows:
                    store.save_simulations([r])
            stored.append(_stored(store, tree_id))
            assert stored[-1][0] == tree
    assert stored[0] == stored[1]
    assert stored[1][4] == [(4, 1)]


def test_observations_of_a_rolled_back_batch_are_written_again(db):
    """The writer skips observations it has committed; those of a batch whose outer transaction rolled
    back were not, and the next save writes them (their nodes' foreign keys would fail otherwise)."""
    with Store(db) as store:
        run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id="t0", goal="g", context="")])
        ((tree_id, _),) = store.tree_ids(run_id)
        tree, rows = _grown_with_rows(tree_id)
        with pytest.raises(RuntimeError), store.transaction():
            store.save_simulations(rows[:2])
            raise RuntimeError("the outer work fails")
        assert store.load_tree(tree_id) is None
        store.save_simulations(rows[:2])
        store.save_simulations(rows[2:])
        assert store.load_tree(tree_id) == tree
