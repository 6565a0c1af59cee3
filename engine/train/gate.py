"""The loop's promotion gate: a trained policy replaces the current one only when it is measurably
better on tasks held out of both the search and the evaluation.

WHY: measured on the shipped tiny policy, one iteration of the best method chosen on val lowered test
success (-0.046 [-0.092, 0.000] on 109 tasks) while val had shown +0.023 (one task of 43): an
iteration's gain is small against its noise, so a loop that always continues with the newest model
can make its policy worse. AlphaGo Zero kept a new network only if it beat the old one in an
evaluation match; here the match is a paired comparison over the gate tasks (the same tasks, the
same evaluation), and the candidate is promoted only when the `confidence` paired bootstrap
interval of (candidate - current) success lies above 0 — one task more of 43 does not pass, three
more with none lost does. A candidate that does not pass is kept on disk and scored, but the next
iteration searches with the current policy again.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.evaluate import by_task, paired_bootstrap_diff

GATE_BOOTSTRAP = 1000  # the fewest resamples the gate's interval takes (0 would make the interval a point)
MIN_GATE_TASKS = 10  # below this a percentile bootstrap over tasks is no interval: nothing is promoted


@dataclass(frozen=True)
class GateDecision:
    """`diff`: the paired (candidate - current) success on the gate tasks with its interval."""

    promoted: bool
    current: float
    candidate: float
    diff: dict[str, float]
    tasks: int
    why: str

    def record(self, split: str, confidence: float) -> dict[str, Any]:
        """What the loop stores with the iteration (the Loop view and benches read it)."""
        return {"split": split, "tasks": self.tasks, "confidence": confidence, "current": self.current,
                "candidate": self.candidate, "diff": self.diff, "promoted": self.promoted, "why": self.why}


def decide(current: Sequence[Any], candidate: Sequence[Any], confidence: float = 0.8,
           bootstrap: int = GATE_BOOTSTRAP, seed: int = 0) -> GateDecision:
    """Promote `candidate` over `current` (episodes of the same gate tasks, `Episode`s or stored rows)
    when the lower end of the paired `confidence` interval of the success difference is above 0, over
    at least MIN_GATE_TASKS tasks and GATE_BOOTSTRAP resamples."""
    a, b = by_task(current, "success"), by_task(candidate, "success")
    diff = paired_bootstrap_diff(a, b, n=max(bootstrap, GATE_BOOTSTRAP), confidence=confidence, seed=seed)
    cur, cand = (statistics.fmean(statistics.fmean(v) for v in arm.values()) if arm else 0.0 for arm in (a, b))
    enough = len(a) >= MIN_GATE_TASKS
    promoted = enough and diff["low"] > 0
    words = (f"{cand:.3f} vs {cur:.3f} on {len(a)} gate tasks, paired {diff['mean']:+.3f} "
             f"[{diff['low']:+.3f}, {diff['high']:+.3f}] at {confidence:.0%}")
    why = (f"promoted: {words} lies above 0" if promoted else
           f"kept the current policy: {words} does not lie above 0" if enough else
           f"kept the current policy: {words}, but {len(a)} gate tasks are too few for an interval "
           f"(at least {MIN_GATE_TASKS})")
    return GateDecision(promoted=promoted, current=cur, candidate=cand, diff=diff, tasks=len(a), why=why)
