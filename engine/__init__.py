"""Orchard's engine: search, datasets, training and evaluation over LLM-agent episodes.

WHY the one setting below: torch's CPU build uses GNU OpenMP, whose threads spin-wait for work.
On a 2-core machine shared with any other busy process (a pytest worker, the dashboard, a job)
two spinning threads starve each other and training runs 5-30x slower than on one thread
(measured: 1.53 s vs 0.31 s per tiny-model step). PASSIVE makes idle threads sleep instead, which
costs little when the machine is idle. It must be set before torch loads its OpenMP runtime, so it
lives here, the first module any Orchard entry point imports; an explicit setting wins.
"""

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
