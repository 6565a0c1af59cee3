"""Helpers shared by the command modules: logging to stderr, comma lists, a printing Reporter."""

from __future__ import annotations

import sys
import time
from typing import Any


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
            eta = f", ETA {data['eta_s']:.0f}s" if data.get("eta_s") is not None else ""
            log(f"{data.get('phase', '')} {data.get('step', 0)}/{data.get('total', '?')}{eta}")

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        keys = [k for k in ("loss", "rewards/margins", "rewards/accuracies", "mean_token_accuracy") if k in data]
        if keys:
            log(f"step {step}: " + ", ".join(f"{k}={data[k]:.4g}" for k in keys))

    def should_stop(self) -> bool:
        return False

    def log(self, message: str) -> None:
        log(message)
