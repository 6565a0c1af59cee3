"""Helpers shared by the command modules: logging to stderr, comma lists, a printing Reporter."""

from __future__ import annotations

import sys
import time
from typing import Any

from engine.progress import progress_line


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def split_list(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


class PrintReporter:
    """A Reporter for foreground commands: log lines and a progress line on stderr."""

    def __init__(self) -> None:
        self._last = 0.0

    def progress(self, data: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last >= 2.0 or data.get("step") == data.get("total"):
            self._last = now
            log(progress_line(data))

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        keys = [k for k in ("loss", "rewards/margins", "rewards/accuracies", "mean_token_accuracy") if k in data]
        if keys:
            log(f"step {step}: " + ", ".join(f"{k}={data[k]:.4g}" for k in keys))

    def should_stop(self) -> bool:
        return False

    def log(self, message: str) -> None:
        log(message)
