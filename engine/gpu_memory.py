"""Peak GPU memory per phase: what a loop's search, training and evaluation each held.

WHY these figures: in `orchard iterate --model vllm:...` the engine and the trainer share one GPU
(issue 29), so what each phase needs decides `gpu_memory_utilization` and whether the engine must
sleep. Two numbers per phase, because vLLM's V1 engine runs in a child process whose memory this
process's allocator never sees:
- `peak_gib`: this process's torch peak (`max_memory_allocated`, reset at the phase's start): the
  trainer, HF generation;
- `device_used_gib`: the whole device's memory in use at the phase's end (`mem_get_info`), every
  process included: the engine, awake or asleep.
The reading is None on a machine without CUDA, or in a process that has not used CUDA (asking would create a CUDA context here, which makes vLLM start its workers
by spawn and costs ~300 MiB of GPU memory for nothing).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

GIB = 2**30


def _cuda() -> Any | None:
    """torch.cuda when this process has initialised CUDA, else None (torch is not imported for it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def reset_peak() -> None:
    """Start a phase: this process's peak counter from now."""
    cuda = _cuda()
    if cuda is not None:
        cuda.reset_peak_memory_stats()


def peak_memory() -> dict[str, float] | None:
    """{"peak_gib", "device_used_gib"} since the last `reset_peak` (see the module docstring); None
    without CUDA in this process."""
    cuda = _cuda()
    if cuda is None:
        return None
    free, total = cuda.mem_get_info()
    return {"peak_gib": round(cuda.max_memory_allocated() / GIB, 3), "device_used_gib": round((total - free) / GIB, 3)}


def device_used_gib() -> float | None:
    """The device's memory in use now, every process included; None without CUDA in this process."""
    cuda = _cuda()
    if cuda is None:
        return None
    free, total = cuda.mem_get_info()
    return round((total - free) / GIB, 3)


def free_cached() -> None:
    """Hand this process's cached-but-unused GPU blocks back to the driver (after training, before a
    vLLM engine in another process wakes up and allocates its weights and KV cache again)."""
    gc.collect()
    cuda = _cuda()
    if cuda is not None:
        cuda.empty_cache()


class PhasePeaks:
    """Peak GPU memory per phase: `begin(name)` ends the phase under way (its reading logged and kept)
    and starts the next; `take()` ends the current one and returns the readings since the last take.
    Without CUDA nothing is logged or kept."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.current: str | None = None
        self.where = ""
        self.done: dict[str, dict[str, float]] = {}

    def begin(self, phase: str, where: str = "") -> None:
        """Start `phase` (the key of its reading); `where` prefixes its log line (e.g. "iteration 2")."""
        self.end()
        self.current, self.where = phase, where
        reset_peak()

    def end(self) -> None:
        if self.current is None:
            return
        reading = peak_memory()
        if reading is not None:
            self.done[self.current] = reading
            self.log(f"{self.where + ': ' if self.where else ''}{self.current}: peak GPU memory {reading['peak_gib']:.2f} GiB in this process; "
                     f"{reading['device_used_gib']:.2f} GiB in use on the device at its end")
        self.current = None

    def take(self) -> dict[str, dict[str, float]]:
        self.end()
        out, self.done = self.done, {}
        return out
