"""How a long piece of work talks to whoever runs it: progress, metrics, log lines, a cancel, its outcome.

WHY on the ground floor: search, data builds, evaluation, training and the job worker all report
through one `Reporter` (the worker's writes to the store, the CLI's draws a progress bar, a test's
keeps everything in memory), so the protocol sits below every one of them and imports nothing of
the engine. `Units` counts a stage's units (simulations, trees, personas, model calls) with an ETA
and turns a cancel request into `Cancelled` at the next unit; `StageResult` is what a stage made.
`Within` runs a stage inside a larger job (a loop's iteration): the stage counts its own units and
the job's progress says where it is ("iteration 2 · search: 57/128 simulations"); `progress_line`
is that one line, the same for the CLI, `orchard jobs` and the dashboard's job panels.
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


class Within:
    """A Reporter for one stage of a larger job: the stage's progress rows (its own units, step of
    total) go on to `outer` with `label` before their phase ("iteration 2" + "search" ->
    "iteration 2 · search"), `unit` unless the row names one, and `extra` (what a view needs to
    place the stage: e.g. iteration=2, stage="search"). Metrics, log lines and the cancel pass
    through unchanged. WHY a wrapper, not a second progress channel: the job keeps one progress row
    (the store's), which every page and `orchard jobs` already show; the loop's stages report
    through it as they do when they run as jobs of their own."""

    def __init__(self, outer: Reporter, label: str, unit: str = "", **extra: Any) -> None:
        self.outer, self.label, self.unit, self.extra = outer, label, unit, extra

    def begin(self, phase: str) -> None:
        """The stage has started and counted nothing yet (loading a model, starting envs)."""
        self.progress({"phase": phase, "step": 0, "total": 0, "eta_s": None})

    def progress(self, data: dict[str, Any]) -> None:
        phase = data.get("phase")
        row = {**self.extra, **data, "phase": f"{self.label} · {phase}" if phase else self.label}
        if self.unit and "unit" not in data:
            row["unit"] = self.unit
        self.outer.progress(row)

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        self.outer.metrics(step, data)

    def should_stop(self) -> bool:
        return self.outer.should_stop()

    def log(self, message: str) -> None:
        self.outer.log(message)


def progress_line(data: dict[str, Any], live: bool = True) -> str:
    """A progress row in words: "phase step/total, ETA N s"; with a unit "phase: step/total unit, ETA
    N s"; units without a known total: "phase step"; nothing counted yet: the phase. `live`: False
    for a job that has ended (no ETA)."""
    phase, unit = str(data.get("phase") or ""), str(data.get("unit") or "")
    step, total = data.get("step") or 0, data.get("total") or 0
    counts = f"{step}/{total}" if total else f"{step}" if step else ""
    if not counts:
        return phase
    eta = f", ETA {data['eta_s']:.0f} s" if total and live and isinstance(data.get("eta_s"), int | float) else ""
    if unit:
        return f"{phase}: {counts} {unit}{eta}" if phase else f"{counts} {unit}{eta}"
    return f"{phase} {counts}{eta}".strip()


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
