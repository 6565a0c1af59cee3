"""GPU check of engine/gpu_memory.py (seconds on one GPU; torch alone): the loop's per-phase readings.

Phases that allocate known sizes: each phase's `peak_gib` must be its own (the counter reset at its
start: a phase starts from what is still allocated, not from zero), `device_used_gib` must see the
device, a process that has not used CUDA must read None (and not create a context), and `free_cached`
must hand the cached blocks back to the driver (what the loop does before a vLLM engine wakes up).
Prints one JSON object; exit 1 when a check fails.

    python3 bench/gpu/memory_phases.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch

from engine.gpu_memory import PhasePeaks, device_used_gib, free_cached, peak_memory

GIB = 2**30


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    failures: list[str] = []
    result: dict[str, object] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if not torch.cuda.is_available():
        print(json.dumps({**result, "failures": ["no CUDA"]}))
        return 1
    result["before_init"] = peak_memory()
    if result["before_init"] is not None or torch.cuda.is_initialized():
        failures.append("a reading before this process used CUDA was not None, or created a context")
    torch.zeros(1, device="cuda")
    lines: list[str] = []
    peaks = PhasePeaks(lines.append)
    peaks.begin("search", "check")
    x = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
    del x
    peaks.begin("train", "check")
    kept = torch.empty(6 * GIB, dtype=torch.uint8, device="cuda")
    peaks.begin("evaluate", "check")
    y = torch.empty(1 * GIB, dtype=torch.uint8, device="cuda")
    readings = peaks.take()
    result["readings"], result["lines"] = readings, lines
    expected = {"search": 2.0, "train": 6.0, "evaluate": 7.0}  # evaluate starts with train's 6 GiB allocated
    for phase, gib in expected.items():
        got = readings.get(phase, {}).get("peak_gib")
        if got is None or abs(got - gib) > 0.05:
            failures.append(f"{phase}: peak {got} GiB, expected {gib}")
    if readings.get("evaluate", {}).get("device_used_gib", 0.0) < 7.0:
        failures.append("evaluate: the device's use does not include this process's 7 GiB")
    del kept, y
    used_before = device_used_gib()
    free_cached()
    used_after = device_used_gib()
    result["device_used_before_after_free_gib"] = [used_before, used_after]
    if used_before is None or used_after is None or used_before - used_after < 6.5:
        failures.append(f"free_cached handed back {used_before} -> {used_after} GiB, expected >= 6.5 GiB less")
    result["device"] = torch.cuda.get_device_name()
    result["failures"] = failures
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
