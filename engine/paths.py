"""Where Orchard keeps its files: the one place that reads $ORCHARD_HOME, $ORCHARD_DB and $ORCHARD_CACHE.

Every entry point (the CLI, the dashboard, the job worker, the demo) resolves the store through
`db_path`, so a user who points one of them at a database with $ORCHARD_DB finds the others using
it too. Nothing here creates a file except `cache_dir` (its folders are made on demand).

- data root: $ORCHARD_HOME, else `data/` in the repository (git-ignored);
- database: an explicit path (`--db`), else $ORCHARD_DB, else `<data root>/orchard.db`; either may be
  a `postgresql://` URL (kept as text: a Path would fold its `//`);
- job logs: `jobs/` beside the database (a job's log follows its store), `<data root>/jobs` for a server;
- runs (refinement output): `<data root>/runs`;
- models: `<data root>/models` (the tiny model in `tiny`, trained ones in `trained/NAME`);
- caches of generated env data: $ORCHARD_CACHE, else `$ORCHARD_HOME/cache`, else ~/.cache/orchard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
HOME_ENV = "ORCHARD_HOME"
DB_ENV = "ORCHARD_DB"
CACHE_ENV = "ORCHARD_CACHE"


def data_root() -> Path:
    """$ORCHARD_HOME, else `<repo>/data`."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else REPO_ROOT / "data"


PG_SCHEMES = ("postgresql://", "postgres://")


def is_db_url(db: str | os.PathLike[str]) -> bool:
    """True when `db` names a PostgreSQL server rather than a SQLite file."""
    return str(db).startswith(PG_SCHEMES)


def db_path(explicit: str | os.PathLike[str] | None = None) -> Path | str:
    """The database: `explicit` (a `--db` flag), else $ORCHARD_DB, else `<data root>/orchard.db`.
    A `postgresql://` URL is returned as the string it is."""
    value = str(explicit) if explicit is not None and str(explicit) != "" else os.environ.get(DB_ENV)
    if value and is_db_url(value):
        return value
    if explicit is not None and str(explicit) != "":
        return Path(explicit)
    return Path(value).expanduser() if value else data_root() / "orchard.db"


def db_exists(db: str | os.PathLike[str]) -> bool:
    """Whether there may be a store to read at `db` without creating one: a file that exists, or
    any server URL (the server says whether the schema is there)."""
    return is_db_url(db) or Path(db).exists()


def jobs_dir(db: str | os.PathLike[str]) -> Path:
    """Job log files of the database `db`: `jobs/` beside it (`<data root>/jobs` for a server)."""
    return data_root() / "jobs" if is_db_url(db) else Path(db).parent / "jobs"


def job_log(db: str | os.PathLike[str], log_path: str | None) -> Path | None:
    """A job's stored log path when it lies inside the job-log folder of `db` (`jobs_dir`, links
    resolved), else None. WHY: the path is read from the database, which someone else may have
    written (`/etc/passwd`); only the folder Orchard writes job logs to is read or appended to."""
    if not log_path:
        return None
    folder = jobs_dir(db).resolve()
    path = Path(log_path).resolve()
    return path if path.is_relative_to(folder) and path != folder else None


def runs_dir() -> Path:
    """`<data root>/runs`: refinement output files by default."""
    return data_root() / "runs"


def models_dir() -> Path:
    return data_root() / "models"


def tiny_model_dir() -> Path:
    """`<data root>/models/tiny`: the built tiny offline model."""
    return models_dir() / "tiny"


def trained_model_dir(name: str) -> Path:
    """`<data root>/models/trained/NAME`: a trained model's default folder."""
    return models_dir() / "trained" / name


def cache_dir(*parts: str) -> Path:
    """Where adapters keep generated data: $ORCHARD_CACHE, else $ORCHARD_HOME/cache, else
    ~/.cache/orchard (created on demand)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        home = os.environ.get(HOME_ENV)
        root = str(Path(home) / "cache") if home else str(Path.home() / ".cache" / "orchard")
    path = Path(root).joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


TRAIN_META = "orchard_train.json"  # the record Orchard writes beside a trained model's weights


def read_train_meta(path: str | Path) -> dict[str, Any] | None:
    """A model folder's `orchard_train.json` (what was trained from what), or None when absent or unreadable."""
    try:
        meta = json.loads((Path(path) / TRAIN_META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None
