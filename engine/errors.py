"""The errors that are the user's to fix: every entry point (CLI, job worker, dashboard) reports
them as one line naming what was wrong, never a traceback.

Lives outside the CLI so the job runtime can classify an error without importing the CLI layer.
"""

from __future__ import annotations


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, exit 2."""


def cause_line(error: BaseException, limit: int = 300) -> str:
    """`error` as one line for a message that wraps it: its type and its first line (a library's own
    exception, e.g. a truncated safetensors file or a config field of the wrong type, is no user error
    class of ours, but what it says is the useful part)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:limit]


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix and say so in one line (exit 2 in the CLI; a job logs the line).
    Imported when called, so `orchard --help` stays fast."""
    from engine.config import ConfigError
    from engine.datasets.samples import DatasetError
    from engine.envs.base import EnvError
    from engine.fileio import OutputError
    from engine.llm.base import GeneratorError
    from engine.store import StoreError

    return (UsageError, ConfigError, DatasetError, EnvError, GeneratorError, StoreError, OutputError)
