"""The offline AgentRefine synthesizer (engine/datasets/refine_offline.py) over many personas and seeds:
every row must pass the pipeline's verifier at the first try, with the corrections asked.

    .venv/bin/python bench/refine_offline.py [--personas 150] [--seeds 6]

Prints rows, failures, continuations and regenerations (all three 0 when the synthesizer is sound),
the distinct TextCraft tasks used, and the wall time.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from engine.datasets.refine import RefineConfig, generate, load_personas, sample_personas
from engine.datasets.refine_offline import OfflineRefineGenerator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--personas", type=int, default=150)
    p.add_argument("--seeds", type=int, default=6)
    args = p.parse_args()
    began, totals, tasks = time.perf_counter(), Counter[str](), set()
    for seed in range(args.seeds):
        for corrections in (1, 2, 3):
            personas = sample_personas(load_personas(), args.personas, seed)
            r = generate(OfflineRefineGenerator(), personas, RefineConfig(seed=seed, min_corrections=corrections))
            totals.update(rows=r.stats.rows, failed=r.stats.failed, continuations=r.stats.continuations,
                          regenerations=r.stats.regenerations)
            tasks |= {s.source["script"]["environment"]["textcraft_task"] for s in r.samples}
            short = [s.id for s in r.samples if s.source["verification"]["corrections"] < corrections]
            totals.update(too_few_corrections=len(short))
    print(f"{dict(totals)}; {len(tasks)} distinct TextCraft train tasks; {time.perf_counter() - began:.1f}s")


if __name__ == "__main__":
    main()
