"""Writing an output file atomically: into a temporary file beside it, then renamed over it, so a
reader (or a kill mid-write) never leaves half a file, and a bad target is one clear error."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


class OutputError(Exception):
    """An output file that cannot be written (a folder of that name, no permission, disk full)."""


def _default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str | Path, write: Callable[[str], object]) -> Path:
    """Call `write(tmp)` to fill a temporary file, then rename it to `path`. An existing folder at
    `path`, or any OS error, is an `OutputError` naming the file; the temporary file is removed."""
    out = Path(path)
    if out.is_dir():
        raise OutputError(f"{out}: is a folder; name a file to write (e.g. {out / 'out'}{out.suffix})")
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        os.close(fd)
        write(tmp)
        os.chmod(tmp, _default_file_mode())  # mkstemp's 0600 -> what open() would have made
        os.replace(tmp, out)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{out}: cannot write ({e.strerror or e})") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    return out
