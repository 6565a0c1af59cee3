"""Does any training preset the Training page offers make the model worse? Every CPU preset x every
data choice, trained on the demo's data, against the base on the same held-out tasks.

The demo's data: its search (`engine.demo.DEMO`: 8 train tasks x 12 simulations, constrained) and
its data builds (step and trajectory pairs, RFT and expert-iteration rows, revisions judged by the
model, the offline AgentRefine rows), all rows included as the demo's loop would with uncurated rows.
Each (data, preset) launch is the job config the Training page builds (`engine.train.presets.job_config`),
run in this process by the jobs' own training body (`engine.train.training.run_training`). Each trained
model and the base are evaluated greedily on the same held-out tasks (default: the 43 val tasks, constrained, 15
steps, 160 tokens); the table prints each with the PAIRED interval of its difference from the base.
A preset "does not lower held-out success" when that interval's upper end is >= 0 (no measured
harm); one whose interval lies below 0 is flagged. GPU presets are listed as not run (no GPU here).

    .venv/bin/python bench/presets.py [--split val] [--test-tasks 0] [--presets cpu-quick,cpu-epoch]
        [--data pairs,rft,exit,...] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import Table, add_common_args, greedy_config, held_out
from engine.config import ConfigError
from engine.envs.textcraft import TextCraftEnv
from engine.llm.registry import load_generator
from engine.progress import MemoryReporter
from engine.store import Store
from engine.train.presets import DATA_CHOICES, PRESETS, job_config, train_plan


def demo_data(store: Store, log=print) -> str:
    """The demo's search and data builds in `store`; returns the run id."""
    from engine.demo import DEMO, demo_tasks, stage_pairs, stage_refine, stage_revisions, stage_search
    from engine.llm.tiny_checkpoint import tiny_generator

    generator = tiny_generator(log=log)
    train_tasks, _ = demo_tasks(DEMO)
    run_id = stage_search(store, generator, train_tasks, DEMO, log)
    stage_pairs(store, run_id, DEMO, log)
    stage_revisions(store, run_id, generator, log)
    stage_refine(store, DEMO, log)  # the refinement choice's rows (the demo's offline AgentRefine stage)
    return run_id


def main(argv: list[str] | None = None) -> Table:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=0)
    ap.set_defaults(split="val", constrained=True)
    ap.add_argument("--presets", default="", help="comma-separated presets (default: every CPU preset)")
    ap.add_argument("--data", default="", help="comma-separated data choices (default: all)")
    args = ap.parse_args(argv)
    cpu = [k for k, p in PRESETS.items() if not str(p.train.get("device", "")).startswith("cuda")]
    presets = [p for p in args.presets.split(",") if p] or cpu
    choices = [d for d in args.data.split(",") if d] or list(DATA_CHOICES)
    work = Path(tempfile.mkdtemp(prefix="orchard-presets-"))
    tasks = held_out(args.test_tasks, args.split)
    table = Table("Training presets on the demo's data vs the base, greedy on the same held-out TextCraft tasks",
                  {"model": args.model, "tasks": f"{args.split}[:{len(tasks)}]", "seed": args.seed,
                   "presets": ",".join(presets), "not run (GPU)": ",".join(k for k in PRESETS if k not in cpu) or "-"},
                  bootstrap=args.bootstrap, seed=args.seed, constrained=args.constrained)
    table.header()
    config = greedy_config(args)
    table.evaluate("base", load_generator(args.model), TextCraftEnv, tasks, config)
    arms = []
    with Store(work / "bench.db") as store:
        t = time.perf_counter()
        run_id = demo_data(store, log=lambda line: None)
        print(f"  demo data: run {run_id}, {time.perf_counter() - t:.0f} s", flush=True)
        from engine.train.training import run_training, train_job

        for data in choices:
            for preset in presets:
                name = f"{data} / {preset}"
                try:
                    kind, job = job_config(data, preset, args.model, [run_id], include_pending=True,
                                           output=str(work / "models" / f"{data}-{preset}"))
                except ConfigError as e:
                    print(f"  {name}: not run: {e}")
                    continue
                plan = train_plan(store, kind, job)
                if plan.rows == 0:
                    print(f"  {name}: no rows in the demo's data (not trained)")
                    continue
                t = time.perf_counter()
                result = run_training(store, train_job(kind, job), MemoryReporter())
                trained = time.perf_counter() - t
                table.evaluate(name, load_generator(str(result.output)), TextCraftEnv, tasks, config)
                table.annotate(name, f"({plan.items} items, {plan.rows} rows, {plan.steps} steps, {trained:.0f} s training)")
                arms.append(name)
    if arms:
        diffs = table.print_diffs([("base", n) for n in arms])
        harmful = [n for n in arms if diffs[("base", n)]["success"]["high"] < 0]
        print(f"presets whose held-out success interval lies below the base: {', '.join(harmful) or 'none'}")
    table.footer()
    print(f"work folder {work}")
    return table


if __name__ == "__main__":
    main()
