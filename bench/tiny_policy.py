"""Tiny-policy builds compared: greedy success, progress and loop rate on the same held-out tasks.

How a build recipe is chosen and reported (docs/decisions.md, "A capable tiny policy"): every model
folder given is evaluated greedily on the same tasks (val: the 43 train tasks the tiny model holds out,
where recipes are chosen; test: the reported figures, run once), without and with the action grammar
(`--constrained`: with it only; each table's header names its decoding), and each later model is compared with the first by the PAIRED bootstrap interval over tasks. Each
model's successes are also counted by the goal's recipe depth (1: the goal is crafted from base items),
the line that says which tasks a build can solve at all.

    .venv/bin/python bench/tiny_policy.py --models BASE_DIR NEW_DIR [...] [--split val|test]
        [--test-tasks 0] [--max-steps 15] [--max-tokens 160] [--seed 0] [--constrained]

The shipped checkpoint is `tiny`; a first-stage (no DAgger) build of the default recipe is
`engine.llm.tiny.ensure_tiny_model(DIR, config=replace(TinyConfig(), dagger_rounds=0))`. About 80 s per
model and decoding on the 109 test tasks on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import Table, add_common_args, by_task, greedy_config, held_out
from engine.envs.base import TaskSpec
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import Episode
from engine.llm.registry import load_generator


def main(argv: list[str] | None = None) -> list[Table]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=0)
    ap.add_argument("--models", nargs="+", required=True, help="model specs or folders; the first is the baseline")
    args = ap.parse_args(argv)
    tasks = held_out(args.test_tasks, args.split)
    names = [f"{i}: {Path(m).name or m}" for i, m in enumerate(args.models)]
    tables = []
    for constrained in (True,) if args.constrained else (False, True):
        table = Table("Tiny-policy builds, greedy on the same held-out TextCraft tasks",
                      {"tasks": f"{args.split}[:{len(tasks)}]", "seed": args.seed,
                       "models": ", ".join(f"{n} = {m}" for n, m in zip(names, args.models, strict=True))},
                      bootstrap=args.bootstrap, seed=args.seed, constrained=constrained)
        table.header()
        config = greedy_config(args, constrained=constrained)
        for name, spec in zip(names, args.models, strict=True):
            table.evaluate(name, load_generator(spec), TextCraftEnv, tasks, config)
        for name in names:
            print(f"  {name}: success by recipe depth {by_depth(table.arms[name].episodes, tasks)}")
        table.print_diffs([(names[0], n) for n in names[1:]])
        table.footer()
        tables.append(table)
    return tables


def by_depth(episodes: Sequence[Episode], tasks: Sequence[TaskSpec]) -> str:
    """Successful episodes per recipe depth of the goal, e.g. "1: 6/28, 2: 0/56" (success scored by
    `by_task`, as the table scores it)."""
    depth = {t.id: t.meta["depth"] for t in tasks}
    counts: dict[int, list[int]] = {}
    for task_id, wins in by_task(episodes, "success").items():
        tally = counts.setdefault(depth[task_id], [0, 0])
        tally[0] += int(sum(wins))
        tally[1] += len(wins)
    return ", ".join(f"{d}: {won}/{n}" for d, (won, n) in sorted(counts.items()))


if __name__ == "__main__":
    main()
