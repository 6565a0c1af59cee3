"""The schema: its migrations (run in order on open) and the check that a file is an Orchard database
at a version this code reads, made before anything is written to it."""

from __future__ import annotations

import re
import sqlite3
import urllib.parse
from pathlib import Path

from engine.store.records import StoreError

APP_ID = "orchard"
SQLITE_MAGIC = b"SQLite format 3\x00"

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            env TEXT NOT NULL,
            model TEXT NOT NULL,
            config TEXT NOT NULL,
            task_ids TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            stats TEXT
        );
        CREATE TABLE trees (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(id),
            position INTEGER NOT NULL,
            task_id TEXT NOT NULL,
            goal TEXT NOT NULL,
            context TEXT NOT NULL,
            split TEXT NOT NULL,
            simulations INTEGER NOT NULL DEFAULT 0,
            solved INTEGER NOT NULL DEFAULT 0,
            UNIQUE (run_id, task_id)
        );
        CREATE TABLE observations (
            hash TEXT PRIMARY KEY,
            text TEXT NOT NULL
        );
        CREATE TABLE nodes (
            tree_id INTEGER NOT NULL REFERENCES trees(id),
            node_id INTEGER NOT NULL,
            parent_id INTEGER,
            depth INTEGER NOT NULL,
            action TEXT,
            raw TEXT,
            format_error TEXT,
            obs_hash TEXT NOT NULL REFERENCES observations(hash),
            n INTEGER NOT NULL,
            value_sum REAL NOT NULL,
            q_critic REAL,
            critic_rank INTEGER,
            critic_reason TEXT,
            logprob REAL,
            reward REAL,
            progress REAL,
            terminal TEXT,
            gen_ms REAL,
            env_ms REAL,
            n_tokens INTEGER,
            PRIMARY KEY (tree_id, node_id)
        );
        CREATE TABLE simulations (
            tree_id INTEGER NOT NULL REFERENCES trees(id),
            idx INTEGER NOT NULL,
            path TEXT NOT NULL,
            reward REAL NOT NULL,
            rollout TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (tree_id, idx)
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE pairs (
            id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(id),
            tree_id INTEGER REFERENCES trees(id),
            task_id TEXT NOT NULL,
            node_id INTEGER NOT NULL,
            chosen_node INTEGER NOT NULL,
            rejected_node INTEGER NOT NULL,
            kind TEXT NOT NULL,
            prompt TEXT NOT NULL,
            chosen TEXT NOT NULL,
            rejected TEXT NOT NULL,
            q_chosen REAL NOT NULL,
            q_rejected REAL NOT NULL,
            logprob_chosen REAL,
            logprob_rejected REAL,
            depth INTEGER NOT NULL,
            status TEXT NOT NULL,
            version INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            updated_by TEXT NOT NULL
        );
        CREATE INDEX pairs_by_run ON pairs (run_id, kind, status);
        CREATE INDEX pairs_by_task ON pairs (run_id, task_id, depth);
        CREATE TABLE pair_history (
            pair_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            at REAL NOT NULL,
            who TEXT NOT NULL,
            action TEXT NOT NULL,
            before TEXT,
            after TEXT,
            PRIMARY KEY (pair_id, version)
        );
        CREATE TABLE samples (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            run_id TEXT REFERENCES runs(id),
            task_id TEXT NOT NULL,
            source TEXT NOT NULL,
            data TEXT NOT NULL,
            status TEXT NOT NULL,
            version INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            updated_by TEXT NOT NULL
        );
        CREATE INDEX samples_by_kind ON samples (kind, status);
        CREATE INDEX samples_by_run ON samples (run_id, kind);
        CREATE TABLE sample_history (
            sample_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            at REAL NOT NULL,
            who TEXT NOT NULL,
            action TEXT NOT NULL,
            before TEXT,
            after TEXT,
            PRIMARY KEY (sample_id, version)
        );
        """,
    ),
    (
        3,
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            config TEXT NOT NULL,
            state TEXT NOT NULL,
            device TEXT NOT NULL,
            pid INTEGER,
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            heartbeat_at REAL,
            progress TEXT NOT NULL,
            log_path TEXT,
            output_path TEXT,
            error TEXT,
            cancel_requested INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX jobs_by_state ON jobs (state, device, created_at);
        CREATE TABLE job_metrics (
            job_id TEXT NOT NULL REFERENCES jobs(id),
            seq INTEGER NOT NULL,
            step INTEGER,
            at REAL NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (job_id, seq)
        );
        CREATE TABLE models (
            path TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            parent TEXT,
            job_id TEXT,
            data_ids TEXT NOT NULL,
            config TEXT NOT NULL,
            metrics TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE TABLE evaluations (
            id TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            env TEXT NOT NULL,
            split TEXT NOT NULL,
            task_ids TEXT NOT NULL,
            mode TEXT NOT NULL,
            config TEXT NOT NULL,
            metrics TEXT NOT NULL,
            episodes TEXT NOT NULL,
            job_id TEXT,
            created_at REAL NOT NULL
        );
        CREATE INDEX evaluations_by_model ON evaluations (model, created_at);
        CREATE TABLE iterations (
            loop_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            method TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (loop_id, idx)
        );
        """,
    ),
    (
        4,
        """
        CREATE TABLE node_media (
            tree_id INTEGER NOT NULL REFERENCES trees(id),
            node_id INTEGER NOT NULL,
            kind TEXT NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (tree_id, node_id, kind)
        );
        """,
    ),
    (
        5,
        # One model record per job: a path holds one model at a time (the current record); an
        # earlier job's record for the same folder is kept, marked replaced (docs/decisions.md).
        """
        ALTER TABLE models RENAME TO models_v4;
        CREATE TABLE models (
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            parent TEXT,
            job_id TEXT,
            data_ids TEXT NOT NULL,
            config TEXT NOT NULL,
            metrics TEXT NOT NULL,
            created_at REAL NOT NULL,
            replaced_at REAL,
            replaced_by TEXT
        );
        INSERT INTO models (path, name, kind, parent, job_id, data_ids, config, metrics, created_at)
            SELECT path, name, kind, parent, job_id, data_ids, config, metrics, created_at FROM models_v4
            ORDER BY created_at;
        DROP TABLE models_v4;
        CREATE UNIQUE INDEX models_current ON models (path) WHERE replaced_at IS NULL;
        """,
    ),
    (
        6,
        # Team curation (docs/decisions.md): dashboard users and their sessions (a token's SHA-256,
        # never the token), leases handing items to one curator at a time, every review / settlement
        # as a decision row, the queue's settings, and the decisions each training job used.
        """
        CREATE TABLE users (
            name TEXT PRIMARY KEY,
            role TEXT NOT NULL,
            password_hash TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE TABLE sessions (
            token_hash TEXT PRIMARY KEY,
            user_name TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            ended_at REAL
        );
        CREATE INDEX sessions_by_user ON sessions (user_name);
        CREATE TABLE leases (
            item_kind TEXT NOT NULL,
            item_id TEXT NOT NULL,
            holder TEXT NOT NULL,
            taken_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (item_kind, item_id)
        );
        CREATE INDEX leases_by_holder ON leases (holder, item_kind);
        CREATE TABLE decisions (
            id TEXT PRIMARY KEY,
            item_kind TEXT NOT NULL,
            item_id TEXT NOT NULL,
            run_id TEXT,
            who TEXT NOT NULL,
            role TEXT NOT NULL,
            label TEXT NOT NULL,
            item_version INTEGER NOT NULL,
            at REAL NOT NULL
        );
        CREATE INDEX decisions_by_item ON decisions (item_kind, item_id);
        CREATE INDEX decisions_by_run ON decisions (item_kind, run_id);
        CREATE UNIQUE INDEX decisions_one_review ON decisions (item_kind, item_id, who) WHERE role = 'review';
        CREATE TABLE curation_settings (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        CREATE TABLE job_decisions (
            job_id TEXT NOT NULL,
            item_kind TEXT NOT NULL,
            item_id TEXT NOT NULL,
            decision_id TEXT NOT NULL,
            label TEXT NOT NULL,
            PRIMARY KEY (job_id, item_kind, item_id, decision_id)
        );
        """,
    ),
    (
        7,
        # A review counts only on the content it saw (engine/store/review.py): after a swap or an
        # edit the same curator may review the item again, so one review per reviewer per VERSION.
        """
        DROP INDEX IF EXISTS decisions_one_review;
        CREATE UNIQUE INDEX decisions_one_review ON decisions (item_kind, item_id, who, item_version)
            WHERE role = 'review';
        """,
    ),
    (
        8,
        # Human branches (docs/decisions.md "Human branches from the Tree explorer"): who proposed a
        # node, the policy or a person at the tree; every older node is the policy's.
        """
        ALTER TABLE nodes ADD COLUMN author TEXT NOT NULL DEFAULT 'policy';
        """,
    ),
    (
        9,
        # Pair provenance (docs/decisions.md "Pairs carry their sources"): a pair's content key (same
        # prompt, same two commands: the same pair, whichever run built it) and one row per build that
        # made it, `source_id` being the id that build gave it and `data` its provenance as JSON.
        """
        ALTER TABLE pairs ADD COLUMN merge_key TEXT;
        CREATE INDEX pairs_by_merge_key ON pairs (merge_key);
        CREATE TABLE pair_sources (
            source_id TEXT PRIMARY KEY,
            pair_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX pair_sources_by_pair ON pair_sources (pair_id);
        CREATE INDEX pair_sources_by_run ON pair_sources (run_id);
        """,
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def _readonly_uri(path: Path) -> str:
    """A `file:` URI that opens `path` read-only. The path is percent-quoted: a `#`, `?` or `%41` in
    it would otherwise end the path early or be decoded, and SQLite would open (and create) another file."""
    return f"file:{urllib.parse.quote(str(path))}?mode=ro"


def _check_file(path: Path) -> int:
    """Refuse a file that is not SQLite, or SQLite that is not ours, without writing to it.
    Returns the file's schema version (0 for a new or empty file)."""
    if path.is_dir():
        raise StoreError(f"{path}: a folder, not a database file")
    if not path.exists() or path.stat().st_size == 0:
        return 0
    # The file is never opened here except through SQLite: closing any other descriptor of a
    # database file drops every POSIX lock this process's SQLite connections hold on it (SQLite's
    # documented pitfall), after which another process's close believes it is the last one,
    # checkpoints and DELETES the -wal a live connection here still writes to (a job worker's
    # heartbeat thread opening a second Store lost every later commit of its job that way).
    # Even a read-only look at a WAL-mode file creates its -wal / -shm companions: a file that is
    # refused gets them removed again, so a refusal leaves the folder as it was.
    companions = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    existed = [c.exists() for c in companions]
    try:
        con = sqlite3.connect(_readonly_uri(path), uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:
                return 0
            if "meta" not in tables:
                raise StoreError(f"{path}: a SQLite database, but not Orchard's (no meta table)")
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        finally:
            con.close()
        if meta.get("app") != APP_ID:
            raise StoreError(f"{path}: a SQLite database, but not Orchard's (app={meta.get('app')!r})")
        version = int(meta.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise StoreError(f"{path}: schema version {version} is newer than this Orchard ({SCHEMA_VERSION}); "
                             "upgrade")
    except (sqlite3.DatabaseError, StoreError, ValueError) as e:
        if isinstance(e, sqlite3.OperationalError) and _busy(e):
            # Another process is writing right now (it may have just created the -wal and -shm
            # this check saw missing): its files are never touched. Not a refusal: say so.
            raise StoreError(f"{path}: the database is busy (another process holds a lock); try again") from None
        _remove_our_companions(companions, existed)
        if isinstance(e, StoreError):
            raise
        if "not a database" in str(e):
            raise StoreError(f"{path}: not an Orchard database (not a SQLite file)") from None
        raise StoreError(f"{path}: corrupt or unreadable database ({e})") from None
    return version


def _busy(e: sqlite3.OperationalError) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text


def _remove_our_companions(companions: list[Path], existed: list[bool]) -> None:
    """Remove the -wal / -shm that this check's own read-only look created, and nothing else: a
    companion that was not there before but now holds data (a -wal with frames) belongs to a
    writer that started meanwhile, and deleting it would lose that writer's commits."""
    wal, shm = companions
    wal_new, shm_new = not existed[0], not existed[1]
    try:
        wal_ours = wal_new and (not wal.exists() or wal.stat().st_size == 0)
    except OSError:
        wal_ours = False
    if wal_ours:
        wal.unlink(missing_ok=True)
    if shm_new and (wal_ours or not wal.exists()):
        shm.unlink(missing_ok=True)


def _schema_tables() -> set[str]:
    """The tables the migrations create (read from MIGRATIONS when called, as tests shorten it)."""
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", "".join(sql for _, sql in MIGRATIONS)))
