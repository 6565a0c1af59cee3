"""Agent Q against its baselines at the SAME search budget, on the embedded default.

One MCTS search (critic on, reward backup) of B train tasks with the base policy; from those same
trees, four training sets and four models, each evaluated greedily on the SAME first `--test-tasks`
held-out tasks as the base (docs/algorithms.md §3, §7):
- agent-q: step pairs by eq. 10 (alpha 0.5: MCTS value and critic) and theta -> DPO, stored reference;
- tree-dpo-no-critic: step pairs with alpha = 1 (the MCTS value alone) -> the same DPO;
- trajectory-dpo: whole successful vs failed trajectories per task -> the same DPO;
- rft: SFT on the successful trajectories (rejection-sampling fine-tuning);
- exit: expert iteration, SFT on each solved tree's shortest successful trajectory
  (`engine.datasets.distill`, the loop's default method);
- visits: SFT toward the MCTS visit distribution at every node with 4+ visits (AlphaZero-style targets);
- exit-lr2: exit at twice `--sft-lr` (is the step sized right?);
- decisive: step pairs only at decisive nodes (issue item 1c): alpha 1 (the rollouts' value, no critic), both
  children with `--min-visits` rollouts or more and values apart by more than `--decisive-theta` -> the same DPO;
- decisive-sft: the decisive pairs -> DPO plus `--sft-weight` x the chosen completions' NLL (RPO);
- decisive-onpolicy: of the decisive pairs, those whose rejected command is the base policy's own greedy
  choice at that state (the mistakes greedy makes) -> the same DPO plus SFT term;
- hindsight: every searched task whose goal some tree's path held (its own tree or another's: a failed
  tree's intermediate item), the path cut to the commands that goal needs, the texts rewritten by the base
  policy with each command forced (`engine.datasets.hindsight`) -> SFT as exit;
- exit-hindsight: exit's rows plus hindsight's rows of the tasks exit has none for -> the same SFT;
- exit-rehearsal: exit's rows plus the base's own greedy episodes on the searched tasks exit has no row for, each
  cut before its first repeated command (rehearsal: the policy's own outputs as an anchor, so that a larger
  `--sft-lr` can move it toward search's wins without losing held-out tasks) -> the same SFT;
- exit-action: exit's rows, the loss on each step's command only (`SFTTrainConfig.loss_on` "action": the sampled
  PLAN / THOUGHT texts are context, not targets);
- exit-lora: exit's rows, a LoRA adapter (r 16) at `--lora-lr` instead of every weight at `--sft-lr`;
- exit-build: tiny builds only: exit's step rows x `--win-copies` trained the way the build's DAgger round trained
  its rows, beside every one of the build's own rows, its steps at its lr (`engine.llm.tiny.train_more`);
- build-rows: its control, the same round on the build's own rows alone;
- expert-won, expert-all: oracles for the build round, not methods (they read the scripted expert): the rows the
  build's own recipe makes for the searched goals search won (expert-won) or for every searched goal (expert-all),
  x 1, in the same round. How much the goals search reaches could teach at best, and how much is in the ones it
  does not reach; expert-alone: expert-all's rows in the round without the build's rows beside them.
`--arms` picks some; `--no-critic` searches without the critic (the agent-q arm then has no critic
value to mix and is left out). `--search-db` trains and evaluates from an earlier run's stored search (its
`work folder`/bench.db, the same --tasks, --seed and search flags) instead of searching again.
Prints each with its 95% interval, the PAIRED interval of its gain over the base, and the ordering
measured (by mean held-out success, ties by progress). No model is selected on the test split.

    .venv/bin/python bench/baselines.py [--model tiny] [--tasks 16] [--simulations 12] [--test-tasks 32]
        [--lr 5e-5] [--sft-lr 5e-5] [--epochs 2] [--seed 0]

Sized for the 30-minute bench budget on 2 CPU cores: 20 minutes with the shipped 5.3M tiny model on a
host shared with a second bench (the wall time it prints is the measure).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    Table,
    add_common_args,
    add_loop_args,
    fit_pool,
    greedy_settings,
    held_out,
    loop_search,
    ordering,
    print_val_alone,
    undrawn_fit,
)
from bench.pair_check import check_pairs, choices_summary, greedy_choices, greedy_labels, summary
from engine.actions import FormatError, normalize_command, parse
from engine.config import SearchConfig
from engine.datasets.distill import distill, episode_samples
from engine.datasets.hindsight import rationalize, relabel
from engine.datasets.pairs import PairsConfig, build_pairs
from engine.datasets.samples import Sample, to_step_rows, tree_refs
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig, evaluate
from engine.llm.registry import load_generator
from engine.llm.tiny import build_config, read_meta, train_more
from engine.llm.tiny_data import Row, build_rows
from engine.search.runner import new_run
from engine.store import Store
from engine.train.common import TrainError, resolve_model_path
from engine.train.dpo import DPOTrainConfig, train_dpo
from engine.train.sft import rft_config, train_sft

ARMS = ("agent-q", "tree-dpo-no-critic", "trajectory-dpo", "rft", "exit", "visits", "exit-lr2", "decisive",
        "decisive-sft", "decisive-onpolicy", "hindsight", "exit-hindsight", "exit-rehearsal", "exit-action", "exit-lora",
        "exit-build", "build-rows", "expert-won", "expert-all", "expert-alone")
ORACLE_ARMS = ("expert-won", "expert-all", "expert-alone")  # the scripted expert's rows in the build round
BUILD_ARMS = ("exit-build", "build-rows", *ORACLE_ARMS)  # a tiny build's own recipe, one more round (train_more)
SFT_ARMS = ("rft", "exit", "visits", "exit-lr2", "hindsight", "exit-hindsight", "exit-rehearsal", "exit-action",
            "exit-lora")
# Arms that train exit's rows with other SFT settings: the settings over the default (lr --sft-lr, whole completion).
EXIT_VARIANTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "exit-lr2": lambda args: {"learning_rate": 2 * args.sft_lr},
    "exit-action": lambda args: {"loss_on": "action"},
    "exit-lora": lambda args: {"lora": True, "learning_rate": args.lora_lr},
}
STEP_PAIR_ARMS = ("agent-q", "tree-dpo-no-critic", "decisive", "decisive-sft", "decisive-onpolicy")


def main(argv: list[str] | None = None) -> Table:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=32)
    add_loop_args(ap)
    ap.add_argument("--theta", type=float, default=0.1)
    ap.add_argument("--sft-lr", type=float, default=5e-5)
    ap.add_argument("--lora-lr", type=float, default=1e-3, help="exit-lora: the adapter's learning rate")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms of {', '.join(ARMS)}")
    ap.add_argument("--no-critic", action="store_true", help="search without the critic (no agent-q arm)")
    ap.add_argument("--decisive-theta", type=float, default=0.3, help="decisive arm: the value margin (strict)")
    ap.add_argument("--min-visits", type=int, default=3, help="decisive arm: rollouts through each compared child")
    ap.add_argument("--sft-weight", type=float, default=1.0, help="decisive-sft, decisive-onpolicy: the SFT term's weight")
    ap.add_argument("--choices", action="store_true", help="DPO arms: print where greedy lands at the pairs' "
                    "states (chosen / rejected / other command), base and trained")
    ap.add_argument("--unseen-every", type=int, default=0, metavar="N",
                    help="search only the fit tasks a tiny base built with val_every=N never trained on (use with "
                         "--model set to that build; 0: every fit task)")
    ap.add_argument("--build-steps", type=int, default=0, help="exit-build, build-rows: the round's steps (0: the "
                    "build's DAgger round's)")
    ap.add_argument("--build-lr", type=float, default=0.0, help="exit-build, build-rows, expert-*: the round's peak "
                    "lr (0: the build's DAgger round's)")
    ap.add_argument("--win-copies", type=int, default=3, help="exit-build: copies of each win step row (the build "
                    "shows each fit task in 3 episodes)")
    ap.add_argument("--search-db", type=Path, help="reuse this earlier run's stored search (its bench.db)")
    ap.add_argument("--select-fit", action="store_true", help="with --split val: evaluate also on the fit tasks "
                    "not searched (394 - --tasks), a larger selection set than val's 43; the shipped base trained on "
                    "those goals, so val's part is also printed alone (docs/experiments.md 2026-12-07)")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if unknown := set(arms) - set(ARMS):
        ap.error(f"unknown arm(s) {sorted(unknown)}")
    if args.no_critic:
        arms = [a for a in arms if a != "agent-q"]

    try:
        base = resolve_model_path(args.model)
    except TrainError as e:
        ap.error(str(e))
    if set(BUILD_ARMS) & set(arms) and read_meta(base) is None:
        ap.error(f"{', '.join(a for a in arms if a in BUILD_ARMS)}: --model must be a tiny build (its rows are "
                 "regenerated from its stored config)")
    tasks = held_out(args.test_tasks, args.split)
    # The tasks and search seed of agentq_iteration's first iteration (run_loop: Random(seed).sample,
    # search seed + 1), so its agent-q arm is that bench's iteration 1.
    pool = fit_pool(args.unseen_every)
    train = random.Random(args.seed).sample(pool, min(args.tasks, len(pool)))
    if args.select_fit:
        if args.split != "val":
            ap.error("--select-fit selects on train tasks: use it with --split val, never to report test figures")
        tasks += undrawn_fit(train, args.unseen_every)
    search = SearchConfig(**{**loop_search(args, alpha=0.5, seed=args.seed + 1),
                             **({"critic": False, "alpha": 1.0} if args.no_critic else {})})
    common = {"epochs": args.epochs, "batch_size": 8, "num_threads": 2, "device": "cpu", "precision": "fp32",
              "include_pending": True, "seed": args.seed}
    dpo = DPOTrainConfig(learning_rate=args.lr, beta=0.1, **common)
    table = Table("Agent Q vs baselines at the same search budget, greedy on the same held-out TextCraft tasks",
                  {"model": args.model, "tasks": f"{args.split}[:{args.test_tasks or 'all'}]"
                   + (f" + {len(tasks) - len(held_out(args.test_tasks, args.split))} unsearched fit tasks"
                      if args.select_fit else ""), "seed": args.seed,
                   "budget": f"one search: {args.tasks} train tasks x {args.simulations} simulations, K={args.k}, T={args.temperature}, "
                             f"depth {args.depth_limit}, "
                             f"critic {'off' if args.no_critic else 'on'}, {args.backup} backup",
                   "dpo": f"lr {args.lr}, {args.epochs} epochs, beta 0.1"
                          + (f", SFT term weight {args.sft_weight} (decisive-sft, decisive-onpolicy)"
                             if {"decisive-sft", "decisive-onpolicy"} & set(arms) else ""),
                   **({"search": f"reused from {args.search_db}"} if args.search_db else {}),
                   **({"build round (exit-build, build-rows)": f"the build's rows + exit's x {args.win_copies}, "
                       + (f"{args.build_steps} steps" if args.build_steps else "its DAgger round's steps")
                       + (f" at lr {args.build_lr}" if args.build_lr else " at its DAgger round's lr")}
                    if set(BUILD_ARMS) & set(arms) else {}),
                   "sft (rft, exit, visits)": f"lr {args.sft_lr}"
                                              + (f"; exit-lora: LoRA r 16 at lr {args.lora_lr}" if "exit-lora" in arms else "")},
                  bootstrap=args.bootstrap, seed=args.seed, constrained=args.constrained)
    table.header()
    eval_config = EvalConfig(**greedy_settings(args))
    generator = load_generator(args.model)
    work = Path(tempfile.mkdtemp(prefix="orchard-baselines-"))
    with Store(args.search_db or work / "bench.db") as store:
        run_id = stored_search(store, train, search) if args.search_db else None  # refused before the base's evaluation
        table.evaluate("base", generator, TextCraftEnv, tasks, eval_config)
        t = time.perf_counter()
        if run_id is None:
            run_id, _ = new_run(store, "textcraft", train, generator, search, "bench-baselines", make_env=TextCraftEnv)
        refs = tree_refs(store, run_id, TextCraftEnv().describe())
        print(f"  search: {store.run(run_id).solved}/{len(train)} train tasks solved, "
              f"{time.perf_counter() - t:.0f} s", flush=True)
        critic = build_pairs(refs, PairsConfig(alpha=0.5, theta=args.theta))
        no_critic = build_pairs(refs, PairsConfig(alpha=1.0, theta=args.theta))
        built = {"agent-q": critic.step, "tree-dpo-no-critic": no_critic.step, "trajectory-dpo": critic.trajectory,
                 "rft": critic.rft, "exit": distill(refs, "exit"), "visits": distill(refs, "visits")}
        built.update({name: built["exit"] for name in EXIT_VARIANTS})
        built["exit-build"] = built["exit"]
        built["build-rows"] = []  # no rows from search: the build's rows alone
        built["decisive"] = build_pairs(refs, PairsConfig(alpha=1.0, theta=args.decisive_theta,
                                                          min_visits=args.min_visits)).step
        built["decisive-sft"] = built["decisive"]
        if "decisive-onpolicy" in arms:
            labels = greedy_labels(generator, built["decisive"], args.constrained)
            built["decisive-onpolicy"] = [p for p, got in zip(built["decisive"], labels, strict=True) if got == "rejected"]
        won = {s.task.id for s in built["exit"]}  # the searched tasks with a win of their own
        if set(ORACLE_ARMS) & set(arms):
            recipe = build_config(base)
            if "expert-won" in arms:
                built["expert-won"] = build_rows(recipe, [t for t in train if t.id in won])
            if {"expert-all", "expert-alone"} & set(arms):
                built["expert-all"] = built["expert-alone"] = build_rows(recipe, train)
        if {"hindsight", "exit-hindsight"} & set(arms):
            t = time.perf_counter()
            found = relabel(refs, TextCraftEnv, train)
            built["hindsight"] = rationalize(generator, found, TextCraftEnv().describe())
            built["exit-hindsight"] = built["exit"] + [s for s in built["hindsight"] if s.task.id not in won]
            others = sum(not r.source["own_goal"] for r in found)
            print(f"  hindsight: {len(found)} searched tasks reached ({len({r.task.id for r in found} - won)} not "
                  f"solved by their own tree; the shortest solution kept came from another tree for {others}), "
                  f"{len(built['hindsight'])} rationalised, {sum(len(s.turns) for s in built['hindsight'])} steps, "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
        if "exit-rehearsal" in arms:
            t = time.perf_counter()
            played = evaluate(generator, TextCraftEnv, [task for task in train if task.id not in won], eval_config)
            own = rehearsal_samples(played.episodes, train, TextCraftEnv().describe())
            built["exit-rehearsal"] = built["exit"] + own
            print(f"  rehearsal: the base's greedy episodes on {len(played.episodes)} searched tasks without a win "
                  f"({played.metrics['success']['mean']:.3f} solved), {sum(len(s.turns) for s in own)} steps kept "
                  f"before the first repeat, {time.perf_counter() - t:.0f} s", flush=True)
        data = {name: built[name] for name in arms}
        print("  data: " + ", ".join(f"{name} {len(rows)} rows" for name, rows in data.items()), flush=True)
        trees = {r.tree_id: r.tree for r in refs if r.tree_id is not None}
        for name in [a for a in STEP_PAIR_ARMS if a in data]:
            print(f"  {name}: {summary(check_pairs(store, data[name], trees))}", flush=True)
        dpo_arms = [a for a in STEP_PAIR_ARMS if data.get(a)]
        if args.choices:
            first: dict[int, str] = {}
            for arm in dpo_arms:
                first.setdefault(id(data[arm]), arm)  # decisive-sft shares decisive's pairs: scored once
            for arm in first.values():
                print(f"  base at {arm}'s pairs: "
                      f"{choices_summary(greedy_choices(generator, data[arm], args.constrained))}", flush=True)
        del generator  # the base policy's last use: free it before training
        for name, rows in data.items():
            if not rows and name != "build-rows":
                print(f"  {name}: no training data from this search (not trained)")
                continue
            t = time.perf_counter()
            out = work / "models" / name
            if name in BUILD_ARMS:
                extra = build_extra(rows) if name == "exit-build" else list(rows)
                copies = args.win_copies if name == "exit-build" else 1
                record = train_more(base, extra, out, copies=copies, steps=args.build_steps or None,
                                    lr=args.build_lr or None, own_rows=name != "expert-alone")
                result = SimpleNamespace(output=out, metrics={"rows": len(extra), "steps": record["steps"]})
            elif name in SFT_ARMS:
                kinds = tuple(sorted({s.kind for s in rows}))
                how = {"learning_rate": args.sft_lr, **(EXIT_VARIANTS[name](args) if name in EXIT_VARIANTS else {})}
                result = train_sft(base, rows, rft_config(kinds=kinds, **common, **how), out, kind=kinds[0])
            else:
                cfg = replace(dpo, kinds=("trajectory",) if name == "trajectory-dpo" else ("step",),
                              sft_weight=args.sft_weight if name in ("decisive-sft", "decisive-onpolicy") else 0.0)
                tokens = store.node_token_counts([(p.tree_id, n) for p in rows for n in (p.chosen_node, p.rejected_node)])
                result = train_dpo(base, rows, cfg, out, node_tokens=tokens)
            trained = time.perf_counter() - t
            trained_gen = load_generator(str(result.output))
            if args.choices and name in dpo_arms:
                print(f"  {name}: {choices_summary(greedy_choices(trained_gen, rows, args.constrained))}", flush=True)
            table.evaluate(name, trained_gen, TextCraftEnv, tasks, eval_config)
            table.annotate(name, f"(+ {trained:.0f} s training on {len(rows)} rows, {result.metrics.get('rows', '?')} "
                                 f"steps' rows, {result.metrics.get('steps', '?')} optimizer steps)")
    trained_arms = [n for n in table.arms if n != "base"]
    if trained_arms:
        table.print_diffs([("base", n) for n in trained_arms]
                          + [pair for pair in (("build-rows", "exit-build"), ("build-rows", "expert-won"),
                                               ("build-rows", "expert-all"), ("exit-build", "expert-won"),
                                               ("expert-all", "expert-alone"))
                             if set(pair) <= set(trained_arms)])
        if args.select_fit:
            print_val_alone(table, [("base", n) for n in trained_arms])
    print(f"ordering by held-out success (ties by progress): {ordering(table, list(table.arms))}")
    table.footer()
    print(f"work folder {work}")
    return table


def build_extra(samples: list[Sample]) -> list[Row]:
    """Samples' trainable steps as tiny build rows (the actor prompt the policy sees, the turn's text)."""
    return [Row(r["prompt"], r["completion"][0]["content"], "actor", s.task.id)
            for s in samples for r in to_step_rows(s)]


def rehearsal_samples(episodes: list, tasks: list, description: str) -> list[Sample]:
    """The policy's own greedy episodes as exit-kind rows, each cut before its first repeated command (a loop
    is not what the anchor should keep); an episode left with no step gives no row."""
    cut = []
    for e in episodes:
        seen: set[str] = set()
        turns = []
        for text, observation in e.turns:
            parsed = parse(text)
            command = None if isinstance(parsed, FormatError) else normalize_command(parsed.command)
            if command is None or command in seen:
                break
            seen.add(command)
            turns.append((text, observation))
        cut.append(replace(e, turns=turns))
    return episode_samples(cut, tasks, description, wins_only=False, origin="the base's own greedy episode")


SHAPING = ("simulations", "k", "temperature", "depth_limit", "backup", "critic")  # what a stored search must match


def stored_search(store: Store, train: list, search: SearchConfig) -> str:
    """The one search run of an earlier run of this bench, refused unless it searched exactly `train` with
    `search`'s settings (those that shape the trees)."""
    runs = [r for r in store.runs() if r.name == "bench-baselines"]
    if len(runs) != 1:
        sys.exit(f"--search-db {store.path}: expected one bench-baselines run, found {len(runs)}")
    if runs[0].task_ids != [t.id for t in train]:
        sys.exit(f"--search-db {store.path}: its run searched other tasks than --tasks/--seed draw here")
    stored = runs[0].config
    if differ := [f"{key} {stored.get(key)!r} vs {getattr(search, key)!r}" for key in SHAPING
                  if key in stored and stored[key] != getattr(search, key)]:
        sys.exit(f"--search-db {store.path}: its search used other settings ({', '.join(differ)})")
    return runs[0].id


if __name__ == "__main__":
    main()
