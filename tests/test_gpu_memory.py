"""engine.gpu_memory: peak GPU memory per phase, None (and nothing logged) without CUDA here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import gpu_memory
from engine.gpu_memory import PhasePeaks, device_used_gib, peak_memory


def test_without_torch_imported_nothing_is_read_and_torch_stays_out() -> None:
    code = ("import sys; from engine.gpu_memory import peak_memory, device_used_gib, free_cached; free_cached(); "
            "print(peak_memory(), device_used_gib(), 'torch' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split() == ["None", "None", "False"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU machine's answer")
def test_on_cpu_the_readings_are_none_and_no_phase_is_logged() -> None:
    lines: list[str] = []
    peaks = PhasePeaks(lines.append)
    peaks.begin("search", "iteration 1")
    peaks.begin("train", "iteration 1")
    assert peak_memory() is None and device_used_gib() is None
    assert peaks.take() == {} and lines == []


def test_a_phase_is_read_from_its_own_start(monkeypatch: pytest.MonkeyPatch) -> None:
    class Cuda:
        allocated = 0

        def reset_peak_memory_stats(self) -> None:
            Cuda.allocated = 0

        def max_memory_allocated(self) -> int:
            return Cuda.allocated

        def mem_get_info(self) -> tuple[int, int]:
            return 40 * 2**30, 140 * 2**30

    monkeypatch.setattr(gpu_memory, "_cuda", Cuda)
    lines: list[str] = []
    peaks = PhasePeaks(lines.append)
    peaks.begin("search", "iteration 2")
    Cuda.allocated = 3 * 2**30
    peaks.begin("train", "iteration 2")  # resets: train's peak is its own
    Cuda.allocated += 2**29
    assert peaks.take() == {"search": {"peak_gib": 3.0, "device_used_gib": 100.0},
                            "train": {"peak_gib": 0.5, "device_used_gib": 100.0}}
    assert lines[0] == ("iteration 2: search: peak GPU memory 3.00 GiB in this process; 100.00 GiB in use on the "
                        "device at its end")
    assert peaks.take() == {}  # taken once
