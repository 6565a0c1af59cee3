"""`torch_threads(n)`: torch's CPU thread count for the duration of a block, then restored.

WHY one helper: generation, training and the tiny-model build each pin their own thread count (on
2 shared cores the right count is a measured choice, see docs/decisions.md), and each must put the
process-wide setting back for whatever runs next in the same process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with `n` torch CPU threads (None: leave the setting alone)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
