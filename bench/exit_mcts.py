"""Expert iteration from MCTS at inference: distil the operator that beats the policy, where the policy fails.

The loop's other distillation ("exit") reads each solved tree's shortest path off one offline search
of 12 simulations per task; with the shipped 5.3M policy that solves 9 of 32 fit tasks, mostly ones
the greedy policy already solves, and SFT on them did not carry to test. Here the data comes from
MCTS at inference (`EvalConfig(mode="mcts")`, measured +0.188 over greedy on test), run only on the
fit tasks the greedy policy FAILS: every successful episode is a trajectory the policy could not
produce, with the recoveries search found (`engine.datasets.distill.episode_samples`).

`--operator sampled` replaces MCTS at inference by the cheapest search there is, N sampled episodes
from each failed task's start (best-of-N at `--temperature`; each is one MCTS rollout's cost), so that
far more fit tasks fit in the same time; the `--per-task` shortest distinct successes of each task
are kept, so tasks that are easy to hit do not outweigh the rest.

Per run (seed stated; nothing chosen on test):
1. greedy on `--tasks` fit tasks drawn as the loop draws its first batch (Random(seed).sample);
2. the operator on the ones greedy fails: MCTS at inference (`--simulations` per real step, K,
   backup) or `--samples` sampled episodes;
3. arms, each SFT from the base and evaluated greedily on the same held-out tasks:
   OP (the operator's successes, OP = mcts or sampled), `OP+greedy` (plus the greedy successes on the
   same fit tasks: the policy's own solved behaviour as an anchor against drift), `greedy` (those
   alone: the control that says whether a gain comes from search's trajectories or from training on
   anything), `OP+corrections` / `corrections` (search-labelled corrections,
   `engine.datasets.corrections`: the first `--per-episode` failing steps of each greedy failure, the
   policy's own prompt there labelled with the step of an operator's win the env verified from that
   state; `--correct-from all` corrects the operator's failed episodes too).
`--episodes FILE` keeps the played episodes (JSONL), so arms can be trained again without playing.
Prints the data counts, simulations per second, each arm with its interval and the PAIRED interval
of its gain over the base.

    .venv/bin/python bench/exit_mcts.py --split val --test-tasks 0 --tasks 48 --constrained
        [--simulations 4] [--k 4] [--backup reward] [--sft-lr 1e-4] [--epochs 3] [--arms mcts,mcts+greedy,greedy]
    .venv/bin/python bench/exit_mcts.py --operator sampled --samples 8 --per-task 1 --tasks 192 ...
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    Table,
    add_common_args,
    greedy_config,
    held_out,
    ordering,
    print_val_alone,
    undrawn_fit,
)
from engine.datasets.corrections import CorrectionConfig, correction_samples
from engine.datasets.distill import episode_samples
from engine.datasets.pairs import Pair
from engine.datasets.renamed import renamed_samples
from engine.datasets.samples import to_step_rows
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import Episode, EvalConfig, evaluate
from engine.llm.registry import load_generator
from engine.train.common import resolve_model_path
from engine.train.dpo import DPOTrainConfig, train_dpo
from engine.train.sft import rft_config, train_sft

OPERATORS = ("mcts", "sampled")


def correction_pairs(corrections: list, failures: list) -> list[Pair]:
    """A step pair per correction row: at the failing state (the failure's own history and the latest
    observation, as the policy was prompted), the verified win's step chosen over the step the policy took."""
    by_key = {(e.task_id, e.seed): e for e in failures}
    pairs = []
    for r in corrections:
        (row,) = to_step_rows(r)
        failed = by_key[(r.source["task_id"], r.source["seed"])]
        rejected = failed.turns[r.source["step"]][0]
        pairs.append(Pair(id=f"cdpo:{r.id}", kind="step", run_id="", tree_id=None, task_id=r.source["task_id"],
                          node_id=0, chosen_node=0, rejected_node=0, prompt=row["prompt"],
                          chosen=r.turns[-1].text, rejected=rejected, q_chosen=1.0, q_rejected=0.0,
                          logprob_chosen=None, logprob_rejected=None, depth=r.source["step"]))
    return pairs


def interpolate(base: Path, trained: Path, alpha: float, out: Path) -> Path:
    """WiSE-FT: a copy of the `trained` folder whose weights are base + alpha x (trained - base) (alpha 1: the
    trained model, 0: the base), for a fine-tune that fits its rows but loses held-out tasks."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(trained, out)
    for f in sorted(trained.glob("*.safetensors")):
        tuned, start = load_file(str(f)), load_file(str(base / f.name))
        if set(tuned) != set(start):
            raise SystemExit(f"{f.name}: the trained and base models hold different tensors")
        mixed = {k: (start[k].float() + alpha * (v.float() - start[k].float())).to(v.dtype) for k, v in tuned.items()}
        save_file(mixed, str(out / f.name), metadata={"format": "pt"})
    return out


def shortest_per_task(episodes: list, per_task: int) -> list:
    """The `per_task` shortest distinct successful episodes of each task (ties: the lower seed), in task order."""
    by_task: dict[str, list] = {}
    for e in episodes:
        if e.success and e.turns and not e.prefix_steps:
            by_task.setdefault(e.task_id, []).append(e)
    kept = []
    for found in by_task.values():
        seen: set[tuple[str, ...]] = set()
        for e in sorted(found, key=lambda e: (e.steps, e.seed)):
            key = tuple(text for text, _ in e.turns)
            if key not in seen and len(seen) < per_task:
                seen.add(key)
                kept.append(e)
    return kept


def write_episodes(path: Path, phases: dict[str, list]) -> None:
    """Every played episode with its turns, one JSON line each (phase = greedy or the operator)."""
    with path.open("w", encoding="utf-8") as f:
        for phase, episodes in phases.items():
            for e in episodes:
                f.write(json.dumps({"phase": phase, **e.to_dict(), "turns": e.turns,
                                    "first_observation": e.first_observation}) + "\n")


def read_episodes(path: Path) -> dict[str, list]:
    """`write_episodes`' file back as Episodes by phase."""
    phases: dict[str, list] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            data = json.loads(line)
            phase = data.pop("phase")
            data["turns"] = [tuple(t) for t in data["turns"]]
            phases.setdefault(phase, []).append(Episode(**data))
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}:{n}: not an episode line ({exc})") from None
    return phases


def main(argv: list[str] | None = None) -> Table:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=0)
    ap.add_argument("--tasks", type=int, default=48, help="fit tasks played greedily; MCTS plays the failed ones")
    ap.add_argument("--simulations", type=int, default=4, help="MCTS simulations per real step")
    ap.add_argument("--k", type=int, default=4, help="candidate actions per expansion")
    ap.add_argument("--backup", choices=("progress", "reward"), default="reward")
    ap.add_argument("--sft-lr", type=float, default=1e-4)
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--operator", choices=OPERATORS, default="mcts",
                    help="the search on the greedy failures: MCTS at inference, or --samples sampled episodes")
    ap.add_argument("--samples", type=int, default=8, help="sampled operator: episodes per failed task")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampled operator: sampling temperature")
    ap.add_argument("--per-task", type=int, default=1, help="sampled operator: shortest distinct successes kept per task")
    ap.add_argument("--arms", default="", help="comma-separated arms of OP, OP+greedy, greedy, OP+corrections, "
                    "corrections, OP-refused-untrained (OP's rows with the env-refused steps as untrained context), "
                    "corrections-dpo (DPO: each correction's verified step chosen over the failure's own; "
                    "default: all)")
    ap.add_argument("--dpo-lr", type=float, default=5e-5, help="corrections-dpo: DPO learning rate (beta 0.1)")
    ap.add_argument("--per-episode", type=int, default=3, help="corrections arms: failing steps corrected per "
                                                                "greedy failure (the first ones)")
    ap.add_argument("--correct-from", choices=("greedy", "all"), default="greedy",
                    help="corrections arms: the failed episodes corrected (greedy's, or the operator's failures too)")
    ap.add_argument("--average", default="", help="comma-separated alphas: also evaluate each trained arm's "
                    "weights interpolated with the base's, base + alpha x (trained - base) (WiSE-FT)")
    ap.add_argument("--renamed", type=int, default=0, help="SFT arms: also N renamed copies of each trajectory "
                    "(item names swapped consistently, engine.datasets.renamed)")
    ap.add_argument("--select-fit", action="store_true", help="with --split val: evaluate also on the fit tasks "
                    "not drawn for the data (394 - --tasks), a larger selection set than val's 43; the shipped "
                    "base trained on those goals, so val's part is also printed alone")
    ap.add_argument("--episodes", default="", help="JSONL of the played episodes: read when it exists (the greedy "
                                                    "and operator play skipped; a file with the greedy phase alone "
                                                    "plays the operator and adds it), else written after playing")
    args = ap.parse_args(argv)
    op = args.operator
    known = (op, f"{op}+greedy", "greedy", f"{op}+corrections", "corrections", f"{op}-refused-untrained",
             "corrections-dpo")
    arms = [a.strip() for a in (args.arms or ",".join(known)).split(",") if a.strip()]
    if unknown := set(arms) - set(known):
        ap.error(f"unknown arm(s) {sorted(unknown)}")

    work = Path(tempfile.mkdtemp(prefix="orchard-exit-mcts-"))
    tasks = held_out(args.test_tasks, args.split)
    fit = random.Random(args.seed).sample(TextCraftEnv().tasks("fit"), args.tasks)
    if args.select_fit and args.split != "val":
        ap.error("--select-fit selects on train tasks: use it with --split val, never to report test figures")
    undrawn = undrawn_fit(fit) if args.select_fit else []
    tasks += undrawn
    table = Table("Expert iteration from MCTS at inference on the fit tasks greedy fails, greedy on held-out tasks",
                  {"model": args.model, "tasks": f"{args.split}[:{args.test_tasks or 'all'}]"
                   + (f" + {len(undrawn)} undrawn fit tasks" if undrawn else ""), "seed": args.seed,
                   "data": f"{args.tasks} fit tasks; " + (
                       f"MCTS {args.simulations} simulations per real step, K={args.k}, {args.backup} backup"
                       if op == "mcts" else f"{args.samples} sampled episodes at temperature {args.temperature}, "
                                            f"{args.per_task} shortest success(es) kept per task") + " on the greedy failures",
                   "sft": f"lr {args.sft_lr}, {args.epochs} epochs, batch 8"
                          + (f", {args.renamed} renamed copies per trajectory" if args.renamed else "")},
                  bootstrap=args.bootstrap, seed=args.seed, constrained=args.constrained)
    table.header()
    eval_config = greedy_config(args)
    base = resolve_model_path(args.model)
    generator = load_generator(args.model)
    table.evaluate("base", generator, TextCraftEnv, tasks, eval_config)
    description = TextCraftEnv().describe()

    cache = Path(args.episodes) if args.episodes else None
    cached = read_episodes(cache) if cache is not None and cache.exists() else None
    t = time.perf_counter()
    greedy = cached["greedy"] if cached else evaluate(generator, TextCraftEnv, fit, eval_config).episodes
    if [e.task_id for e in greedy] != [task.id for task in fit]:
        ap.error(f"{cache}: its greedy episodes are not the {len(fit)} fit tasks of seed {args.seed}")
    failed = [task for task, e in zip(fit, greedy, strict=True) if not e.success]
    print(f"  data: greedy solves {len(fit) - len(failed)}/{len(fit)} fit tasks ({time.perf_counter() - t:.0f} s)"
          + (f" (read from {cache})" if cached else ""), flush=True)
    t = time.perf_counter()
    if cached and op in cached:
        played = cached[op]
        work_done = f"{len(played)} episodes read from {cache}"
        kept = played if op == "mcts" else shortest_per_task(played, args.per_task)
    elif op == "mcts":
        op_config = EvalConfig(**{**eval_config.__dict__, "mode": "mcts", "mcts_simulations": args.simulations,
                                  "mcts_k": args.k, "mcts_backup": args.backup})
        played = evaluate(generator, TextCraftEnv, failed, op_config).episodes
        work_done = f"{sum(e.steps for e in played) * args.simulations} simulations"
        kept = played
    else:
        op_config = EvalConfig(**{**eval_config.__dict__, "mode": "sampled", "temperature": args.temperature,
                                  "seeds": tuple(args.seed * 1000 + i for i in range(args.samples))})
        played = evaluate(generator, TextCraftEnv, failed, op_config).episodes
        work_done = f"{len(played)} sampled episodes ({sum(e.steps for e in played)} steps)"
        kept = shortest_per_task(played, args.per_task)
    seconds = time.perf_counter() - t
    if cache is not None and not (cached and op in cached):
        write_episodes(cache, {"greedy": greedy, op: played})
    solved = {e.task_id for e in played if e.success}
    print(f"  data: {op} solves {len(solved)}/{len(failed)} of the greedy failures; {work_done} in {seconds:.0f} s",
          flush=True)
    del generator
    rows = {op: episode_samples(kept, failed, description),
            "greedy": episode_samples(greedy, fit, description, kind="rft")}
    rows[f"{op}+greedy"] = rows[op] + rows["greedy"]
    if f"{op}-refused-untrained" in arms:
        rows[f"{op}-refused-untrained"] = episode_samples(kept, failed, description, make_env=TextCraftEnv)
        untrained = sum(not t.trains for s in rows[f"{op}-refused-untrained"] for t in s.turns)
        print(f"  data: {untrained} of {sum(len(s.turns) for s in rows[op])} steps of {op}'s wins refused by the env "
              "(kept as untrained context)", flush=True)
    if any("corrections" in a for a in arms):
        t = time.perf_counter()
        failures = greedy + ([e for e in played if not e.success] if args.correct_from == "all" else [])
        rows["corrections"] = correction_samples(failures, played, fit, TextCraftEnv, description,
                                                 CorrectionConfig(per_episode=args.per_episode))
        rows[f"{op}+corrections"] = rows[op] + rows["corrections"]
        rows["corrections-dpo"] = rows["corrections"]
        tasks_corrected = {s.source["task_id"] for s in rows["corrections"]}
        print(f"  data: corrections at {len(rows['corrections'])} failing steps of {args.correct_from} failures of "
              f"{len(tasks_corrected)} tasks ({args.per_episode} per episode at most; {time.perf_counter() - t:.1f} s)",
              flush=True)
    if args.renamed:
        for name in arms:
            if name != "corrections-dpo":
                rows[name] = rows[name] + renamed_samples(rows[name], TextCraftEnv(), args.renamed, args.seed)
    copies = " (renamed copies included)" if args.renamed else ""
    print("  data: " + ", ".join(f"{name} {len(rows[name])} trajectories{copies} "
                                 f"({sum(len(s.turns) for s in rows[name])} steps)" for name in arms), flush=True)
    common = {"epochs": args.epochs, "batch_size": 8, "num_threads": 2, "device": "cpu", "precision": "fp32",
              "include_pending": True, "seed": args.seed}
    for name in arms:
        if not rows[name]:
            print(f"  {name}: no training data (not trained)")
            continue
        t = time.perf_counter()
        kinds = tuple(sorted({s.kind for s in rows[name]}))
        if name == "corrections-dpo":
            pairs = correction_pairs(rows[name], failures)
            result = train_dpo(base, pairs, DPOTrainConfig(learning_rate=args.dpo_lr, beta=0.1, **common),
                               work / "models" / name)
        else:
            result = train_sft(base, rows[name], rft_config(learning_rate=args.sft_lr, kinds=kinds, **common),
                               work / "models" / name.replace("+", "-"), kind="sft")
        trained = time.perf_counter() - t
        table.evaluate(name, load_generator(str(result.output)), TextCraftEnv, tasks, eval_config)
        table.annotate(name, f"(+ {trained:.0f} s training on {len(rows[name])} trajectories, "
                             f"{result.metrics.get('rows', '?')} step rows, {result.metrics.get('steps', '?')} optimizer steps)")
        for alpha in (float(a) for a in args.average.split(",") if a.strip()):
            mixed = interpolate(Path(base), Path(result.output), alpha, work / "models" / f"{name}-avg{alpha:g}")
            table.evaluate(f"{name}@{alpha:g}", load_generator(str(mixed)), TextCraftEnv, tasks, eval_config)
    trained_arms = [n for n in table.arms if n != "base"]
    if trained_arms:
        table.print_diffs([("base", n) for n in trained_arms])
        if args.select_fit:
            print_val_alone(table, [("base", n) for n in trained_arms])
    print(f"ordering by held-out success (ties by progress): {ordering(table, list(table.arms))}")
    table.footer()
    print(f"work folder {work}")
    return table


if __name__ == "__main__":
    main()
