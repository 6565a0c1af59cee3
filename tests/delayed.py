"""Start bench/delayed_server.py as a real local process (127.0.0.1) for tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER = Path(__file__).resolve().parent.parent / "bench" / "delayed_server.py"


@contextmanager
def delayed_server(commands: str | None = "left,right,wait", time_scale: float = 0.1) -> Iterator[tuple[str, subprocess.Popen]]:
    """(base URL ending in /v1, the process); the process is killed on exit. `commands` None: the
    server's TextCraft commands."""
    extra = ["--commands", commands] if commands is not None else []
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", *extra, "--time-scale", str(time_scale)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("READY "):
            raise RuntimeError(f"delayed server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1", proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
