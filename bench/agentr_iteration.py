"""One Agent-R iteration on the embedded default, measured: does revising its own errors help?

Runs `engine.loop.run_loop(method="agentr")` (docs/algorithms.md §4): MCTS with the policy on
B train tasks; for every (good, bad) leaf pair the policy itself judges the bad path's first error
(§4.1); the bad prefix through it is spliced onto the good path with a revision turn (§4.2); SFT on
revision + good trajectories at the loop's revision share (§4.3). The base and the trained model
are evaluated greedily on the SAME first `--test-tasks` held-out tasks (success, progress, loop rate
with 95% intervals and the PAIRED interval of each difference) and on a recovery set: bad prefixes
through a judged first error, from an MCTS search of the first `--recovery-tasks` held-out tasks
with the BASE model (the same prefixes for both models; Agent-R's recovery score is their success).

    .venv/bin/python bench/agentr_iteration.py [--model tiny] [--tasks 16] [--simulations 12]
        [--test-tasks 32] [--recovery-tasks 16] [--lr 5e-5] [--epochs 2] [--seed 0]

Sized for the 30-minute bench budget on 2 CPU cores: 10 minutes with the shipped 5.3M tiny model on a
host shared with a second bench (the wall time it prints is the measure).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    Table,
    add_common_args,
    add_loop_args,
    greedy_settings,
    held_out,
    loop_search,
    stored_episodes,
)
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import recovery_starts, run_episodes, summarize
from engine.llm.registry import load_generator
from engine.loop import IterateConfig, run_loop
from engine.store import Store


def main(argv: list[str] | None = None) -> Table:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=32)
    add_loop_args(ap)
    ap.add_argument("--recovery-tasks", type=int, default=16, help="held-out tasks searched for recovery prefixes")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="orchard-agentr-"))
    tasks = held_out(args.test_tasks, args.split)
    search = loop_search(args)
    config = IterateConfig(
        method="agentr", model=args.model, iterations=1, tasks_per_iteration=args.tasks, seed=args.seed,
        eval_split=args.split, train_split="fit", eval_tasks=f"0:{len(tasks)}", evaluate_base=False, output_root=str(work / "models"), name="bench-agentr",
        search=search,
        sft={"learning_rate": args.lr, "epochs": args.epochs, "batch_size": 8, "num_threads": 2, "device": "cpu",
             "precision": "fp32"},
        eval=greedy_settings(args),
    )
    table = Table("One Agent-R iteration vs the base policy, greedy on the same held-out TextCraft tasks",
                  {"model": args.model, "tasks": f"{args.split}[:{len(tasks)}]", "seed": args.seed,
                   "budget": f"{args.tasks} train tasks x {args.simulations} simulations, K={args.k}, "
                             f"depth {args.depth_limit}",
                   "recovery set": f"prefixes from {args.split}[:{args.recovery_tasks}] searched by the base model",
                   "sft": f"lr {args.lr}, {args.epochs} epochs, revision share {config.revision_shares[0]}"},
                  bootstrap=args.bootstrap, seed=args.seed, constrained=args.constrained)
    table.header()
    eval_config = config.eval_config()
    base_gen = load_generator(args.model)
    table.evaluate("base", base_gen, TextCraftEnv, tasks, eval_config)
    with Store(work / "bench.db") as store:
        starts = recovery_set(store, base_gen, held_out(args.recovery_tasks, args.split) if args.recovery_tasks else [],
                              config, args.seed)
        del base_gen
        loop_id = run_loop(store, config)
        (it,) = store.iterations(loop_id)
        revisions = store.samples(run_id=it["run_id"], kind="revision")
        judged = sum(1 for s in revisions if s.source.get("error_found"))
        good = len(store.samples(run_id=it["run_id"], kind="good"))
        print(f"  iteration 1: {store.run(it['run_id']).solved}/{args.tasks} train tasks solved in search, "
              f"{len(revisions)} revision trajectories ({judged} with a judged first error), {good} good; "
              f"SFT on {it.get('samples', 0)} ({it.get('revisions', 0)} revisions)", flush=True)
        if "eval" not in it:
            print(f"  no model trained: {it.get('skipped')}")
            table.footer()
            return table
        ev = next(e for e in store.evaluations() if e["id"] == it["eval"]["eval_id"])
        table.add("agent-r iteration 1", ev["metrics"], stored_episodes(store, ev["id"]), it.get("seconds", 0.0),
                  note="(search + revisions + SFT + eval)")
        pairs = [("base", "agent-r iteration 1")]
        if starts:
            for name, model in (("base (recovery)", args.model), ("agent-r (recovery)", it["model"])):
                t = time.perf_counter()
                episodes = run_episodes(load_generator(str(model)), TextCraftEnv, starts, eval_config)
                table.add(name, summarize(episodes, eval_config), episodes, time.perf_counter() - t,
                          note=f"({len(starts)} recovery prefixes: success = recovery score)")
            pairs.append(("base (recovery)", "agent-r (recovery)"))
    table.print_diffs(pairs)
    table.footer()
    print(f"work folder {work}")
    return table


def recovery_set(store: Store, generator, tasks: list, config: IterateConfig, seed: int) -> list:
    """Bad prefixes through their first error (judged by the base model) on held-out `tasks`: the
    starts of the recovery score. Evaluation data only: nothing here is trained on."""
    from engine.datasets.revisions import RevisionConfig, build_revisions
    from engine.datasets.samples import tree_refs
    from engine.search.runner import new_run

    if not tasks:
        return []
    run_id, _ = new_run(store, "textcraft", tasks, generator, config.search_config(), "bench-agentr-recovery",
                        make_env=TextCraftEnv)
    built = build_revisions(tree_refs(store, run_id, TextCraftEnv().describe()), generator, RevisionConfig(seed=seed))
    starts = recovery_starts(built.recovery)
    print(f"  recovery set: {len(starts)} prefixes from {len(tasks)} held-out trees "
          f"({sum(1 for s in built.recovery if s.source.get('error_found'))} with a judged first error)", flush=True)
    return starts


if __name__ == "__main__":
    main()
