"""The shipped tiny checkpoint: a committed build of the default `TinyConfig`, checked before use.

WHY: the capable tiny policy takes longer to build than `make run` may wait, so its weights are
committed under `data/models/shipped/textcraft-tiny/` with a manifest (`checkpoint.json`): the build
config, the sha256 of every file, the figures it was measured at, and the one command that rebuilds
it. `--model tiny`, `orchard demo` and training from `tiny` load it with no build. A folder that does
not match its manifest (a missing or changed file) or was built from another config than the code's
default is refused with one line that names the rebuild command, never loaded silently.

The rebuild is deterministic on a given torch version and CPU kind (fixed seed, fixed thread count);
elsewhere it yields an equally good model with other last bits, and the rebuild writes the manifest
of what it built.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.llm.base import GeneratorError
from engine.llm.tiny import ensure_tiny_model

if TYPE_CHECKING:
    from engine.llm.hf import HFGenerator

MANIFEST = "checkpoint.json"
NAME = "textcraft-tiny"
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "models" / "shipped" / NAME
REBUILD = "python -m engine.llm.tiny_checkpoint --out data/models/shipped/textcraft-tiny"
MAX_BYTES = 25 * 1024 * 1024  # the repository's limit for committed weights


class CheckpointError(GeneratorError):
    """The shipped checkpoint cannot be used as it is (the message says why and how to rebuild)."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _expected() -> dict[str, Any]:
    from engine.llm.tiny import TINY_FORMAT, TinyConfig

    return {"format": TINY_FORMAT, "config": asdict(TinyConfig())}


def verify(path: Path = SHIPPED_DIR) -> dict[str, Any]:
    """The manifest of the checkpoint at `path`, after checking every file's sha256 and that it was
    built from the code's default config; raises `CheckpointError` (one line) otherwise."""
    fix = f"rebuild it with `{REBUILD}`" if path == SHIPPED_DIR else (
        f"rebuild it with `python -m engine.llm.tiny_checkpoint --out {path}`"
    )
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or "model.safetensors" not in files:
            raise KeyError("files")
    except FileNotFoundError:
        raise CheckpointError(f"tiny checkpoint {path}: {MANIFEST} is missing; {fix}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"tiny checkpoint {path / MANIFEST}: unreadable ({type(e).__name__}: {e}); {fix}") from None
    for name, digest in sorted(files.items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"tiny checkpoint {path}: {name} is missing; {fix}")
        actual = sha256(file)
        if actual != digest:
            raise CheckpointError(
                f"tiny checkpoint {file}: sha256 {actual[:12]}... does not match the manifest's {str(digest)[:12]}...; {fix}"
            )
    expected = _expected()
    for key, want in expected.items():
        if manifest.get(key) != want:
            diff = _diff(manifest.get(key), want)
            raise CheckpointError(
                f"tiny checkpoint {path}: built from another {key} than this code's default ({diff}); {fix}"
            )
    return manifest


def _diff(have: Any, want: Any) -> str:
    if isinstance(have, dict) and isinstance(want, dict):
        keys = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        return ", ".join(f"{k}: {have.get(k)!r} != {want.get(k)!r}" for k in keys[:3])
    return f"{have!r} != {want!r}"


def shipped_model(log: Callable[[str], None] = print) -> Path:
    """The verified shipped checkpoint folder (see the module docstring)."""
    verify(SHIPPED_DIR)
    return SHIPPED_DIR


def build(out: Path, log: Callable[[str], None] = print, stated: dict[str, Any] | None = None,
          base: Path | None = None) -> Path:
    """Build the default `TinyConfig` into `out` with its manifest (atomically: temp folder, rename);
    `base`: a first-stage build to start from (see `build_tiny_model`)."""
    from engine.llm.tiny import META_FILE, TinyConfig, build_tiny_model

    out = Path(out)
    tmp = out.with_name(f".{out.name}.building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny_model(tmp, TinyConfig(), log, base=base)
    old = out / MANIFEST
    if stated is None and old.is_file():
        try:
            stated = json.loads(old.read_text()).get("stated")
        except ValueError:
            stated = None
    write_manifest(tmp, stated)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    meta = json.loads((out / META_FILE).read_text())
    log(f"tiny checkpoint: built {out} in {meta['build_seconds']:.0f} s; model.safetensors sha256 "
        f"{json.loads((out / MANIFEST).read_text())['files']['model.safetensors']}")
    return out


def write_manifest(path: Path, stated: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the files' sha256, the folder's build config and `stated` (the figures measured on it)."""
    from engine.llm.tiny import read_meta

    meta = read_meta(path)
    if meta is None:
        raise CheckpointError(f"tiny checkpoint {path}: no complete build to record")
    files = {p.name: sha256(p) for p in sorted(path.iterdir()) if p.is_file() and p.name != MANIFEST}
    size = (path / "model.safetensors").stat().st_size
    if size > MAX_BYTES:
        raise CheckpointError(f"tiny checkpoint {path}: model.safetensors is {size} bytes (limit {MAX_BYTES})")
    manifest = {
        "name": NAME,
        "format": meta["format"],
        "config": meta["config"],  # what the folder was built from (verify compares it with the code's)
        "files": files,
        "rebuild": REBUILD,
        "stated": stated or {},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.llm.tiny_checkpoint",
                                     description="Rebuild (or check) the shipped tiny checkpoint.")
    parser.add_argument("--out", default=str(SHIPPED_DIR), help="folder to write (default: the shipped one)")
    parser.add_argument("--check", action="store_true", help="only verify the folder against its manifest")
    parser.add_argument("--base", help="a finished first-stage build (no DAgger rounds) of the same config: "
                        "run only the DAgger rounds on it")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    if args.check:
        try:
            manifest = verify(out)
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"ok: {out} matches its manifest (model.safetensors {manifest['files']['model.safetensors']})")
        return 0
    try:
        build(out, base=Path(args.base).resolve() if args.base else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def tiny_model_dir(path: Path | None = None, seed: int = 0, log: Callable[[str], None] = print) -> Path:
    """The folder `--model tiny` means: the shipped checkpoint, verified (see `tiny_checkpoint`),
    for the default (no `path`, seed 0); else the cached build of `path` / `seed`."""
    if path is None and seed == 0:
        return shipped_model(log)
    return ensure_tiny_model(path, seed=seed, log=log)


def tiny_generator(
    path: Path | None = None, seed: int = 0, log: Callable[[str], None] = print, **kwargs: Any
) -> HFGenerator:
    """An `HFGenerator` named "tiny" on the shipped checkpoint (or another build: `tiny_model_dir`).
    One CPU thread unless told otherwise: the model is too small to gain from two, and loses badly
    to contention."""
    from engine.llm.hf import HFGenerator

    kwargs.setdefault("num_threads", 1)
    return HFGenerator(tiny_model_dir(path, seed=seed, log=log), name="tiny", **kwargs)
