"""How a long piece of work talks to whoever runs it: progress, metrics, log lines, a cancel, its outcome.

WHY on the ground floor: search, data builds, evaluation, training and the job worker all report
through one `Reporter` (the worker's writes to the store, the CLI's draws a progress bar, a test's
keeps everything in memory), so the protocol sits below every one of them and imports nothing of
the engine. `Units` counts a stage's units (simulations, trees, personas, model calls) with an ETA
and turns a cancel request into `Cancelled` at the next unit; `StageResult` is what a stage made.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


class Reporter(Protocol):
    """Where a stage or a trainer sends progress; the job worker's implementation writes to the store."""

    def progress(self, data: dict[str, Any]) -> None: ...

    def metrics(self, step: int, data: dict[str, Any]) -> None: ...

    def should_stop(self) -> bool: ...

    def log(self, message: str) -> None: ...


@dataclass
class MemoryReporter:
    """Keeps everything in memory (library calls and tests); prints nothing unless `echo`."""

    echo: bool = False
    stop: bool = False
    progress_rows: list[dict[str, Any]] = field(default_factory=list)
    metric_rows: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def progress(self, data: dict[str, Any]) -> None:
        self.progress_rows.append(dict(data))

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        self.metric_rows.append({"step": step, **data})

    def should_stop(self) -> bool:
        return self.stop

    def log(self, message: str) -> None:
        self.lines.append(message)
        if self.echo:
            print(message, flush=True)


class ConsoleReporter:
    """A Reporter for the CLI's foreground commands: a progress bar and log lines on stderr."""

    def __init__(self, unit: str = "it") -> None:
        self.unit = unit
        self._bar: Any = None  # a tqdm bar (tqdm ships no types), made on the first progress()

    def progress(self, data: dict[str, Any]) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=data.get("total") or 0, desc=data.get("phase", ""), unit=self.unit,
                             file=sys.stderr, dynamic_ncols=True)
        self._bar.n = data.get("step") or 0
        if "solved" in data:
            self._bar.set_postfix(solved=data["solved"], refresh=False)
        self._bar.refresh()

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def log(self, message: str) -> None:
        self.close()
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Cancelled(Exception):
    """A stage stopped at a unit boundary because a cancel was requested."""


@dataclass
class StageResult:
    """What a stage made (`output`: the id of its run, evaluation or file) and the lines that say so."""

    output: str | None
    lines: list[str] = field(default_factory=list)


class Units:
    """Units done / total with an ETA, sent to a reporter; a cancel request raises `Cancelled`."""

    def __init__(self, reporter: Reporter, phase: str, total: int, **extra: Any) -> None:
        self.reporter, self.phase, self.total, self.extra = reporter, phase, total, extra
        self.done, self.began = 0, time.monotonic()
        reporter.progress({"phase": phase, "step": 0, "total": total, **extra})

    def step(self, n: int = 1, **extra: Any) -> None:
        self.done += n
        self.extra.update(extra)
        elapsed = time.monotonic() - self.began
        eta = elapsed / self.done * max(0, self.total - self.done) if self.done else None
        self.reporter.progress({"phase": self.phase, "step": min(self.done, self.total) if self.total else self.done,
                                "total": self.total, "eta_s": eta if self.total else None, **self.extra})
        self.check()

    def finish(self) -> None:
        """The stage is done: the units it did are the whole (a search can end early, e.g. a tree exhausted)."""
        self.reporter.progress({"phase": self.phase, "step": self.done, "total": self.done, "eta_s": 0.0,
                                **self.extra})

    def check(self) -> None:
        if self.reporter.should_stop():
            raise Cancelled(f"{self.phase}: cancelled after {self.done} of {self.total}")
