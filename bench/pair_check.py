"""Step pairs checked against the TextCraft expert: does the pair prefer the better command?

Agent Q's step pairs are ordered by the search's values (eq. 10: rollouts and the critic). On TextCraft
an exact judge exists: the expert planner. For each step pair the env is put in the pair's state (the
commands of its tree path replayed from reset) and the chosen and the rejected command are each run
from there; a command is *useful* when it wins or leaves a shorter expert plan (`plan()` from the new
inventory) than before (plans count commands: a get of part of the count still needed leaves the plan
as long, so it counts as useless, as does a get of what is already held). A pair is *right* when it
prefers a useful command over a useless one, *inverted* for the reverse, *tied* when both or neither are useful. A search whose values carry signal
gives many more right than inverted pairs; as many of each means DPO is fed noise.

    .venv/bin/python bench/pair_check.py DB [--run RUN_ID ...] [--alpha 0.5 --alpha 1.0] [--theta 0.1]

`bench/agentq_iteration.py` prints the same line for every iteration's pairs.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import plan

if TYPE_CHECKING:
    from engine.datasets.pairs import Pair
    from engine.store import Store
    from engine.tree_nodes import SearchTree


def command_helps(env: TextCraftEnv, command: str) -> bool:
    """Whether `command` from the env's current state wins or shortens the expert's plan (state kept)."""
    task = env.current_task
    if task is None:
        raise ValueError("command_helps needs a reset env")
    goal = task.meta["goal_item"]
    before = len(plan(goal, dict(env.inventory)))
    state = env.snapshot()
    try:
        step = env.step(command)
        return step.reward >= 1.0 or len(plan(goal, dict(env.inventory))) < before
    finally:
        env.restore(state)


def verdict(env: TextCraftEnv, task_id: str, history: Sequence[str], chosen: str, rejected: str) -> str:
    """'right', 'inverted' or 'tied' for one pair whose state is `history` run from reset."""
    env.reset(task_id)
    for command in history:
        env.step(command)
    good_chosen, good_rejected = command_helps(env, chosen), command_helps(env, rejected)
    if good_chosen == good_rejected:
        return "tied"
    return "right" if good_chosen else "inverted"


def check_pairs(store: Store, pairs: Iterable[Pair], trees: dict[int, SearchTree] | None = None) -> Counter[str]:
    """Verdicts of step pairs of stored TextCraft runs (their commands and states come from the trees:
    `trees` by tree id where the caller has them loaded, else read from `store` once each)."""
    env, out = TextCraftEnv(), Counter[str]()
    trees = dict(trees or {})
    for p in pairs:
        if p.kind != "step":
            continue
        if p.tree_id is not None and p.tree_id not in trees:
            tree = store.load_tree(p.tree_id)
            if tree is not None:
                trees[p.tree_id] = tree
        tree = trees.get(p.tree_id) if p.tree_id is not None else None
        chosen = tree.nodes[p.chosen_node].action if tree is not None else None
        rejected = tree.nodes[p.rejected_node].action if tree is not None else None
        if tree is None or chosen is None or rejected is None:
            out["unreadable"] += 1
            continue
        out[verdict(env, p.task_id, tree.commands(tree.nodes[p.node_id]), chosen.command, rejected.command)] += 1
    return out


def check_run(store: Store, run_id: str, alpha: float | None = None, theta: float = 0.1) -> Counter[str]:
    """The run's stored step pairs checked, or (`alpha` given) the pairs `build_pairs` makes from its
    trees at that eq. 10 weight (1.0: the MCTS value alone, no critic)."""
    if alpha is None:
        return check_pairs(store, store.pairs(run_id=run_id, kind=["step"]))
    from engine.datasets.pairs import PairsConfig, build_pairs
    from engine.datasets.samples import tree_refs

    refs = tree_refs(store, run_id, TextCraftEnv().describe())
    pairs = build_pairs(refs, PairsConfig(alpha=alpha, theta=theta)).step
    return check_pairs(store, pairs, {r.tree_id: r.tree for r in refs if r.tree_id is not None})


def greedy_choices(generator: Any, pairs: Sequence[Pair], constrained: bool, batch: int = 32) -> Counter[str]:
    """Where a policy's greedy command at each step pair's state (the pair's own prompt) lands: the
    chosen command, the rejected one, or another. Before and after DPO it says whether training moved
    the policy's choices at the very states it was trained on."""
    return Counter(greedy_labels(generator, pairs, constrained, batch))


def greedy_labels(generator: Any, pairs: Sequence[Pair], constrained: bool, batch: int = 32) -> list[str]:
    """Per step pair, in order: 'chosen', 'rejected' or 'other' (see `greedy_choices`)."""
    from engine.actions import normalize_command, parse
    from engine.grammar import grammar_for
    from engine.llm.base import SampleRequest, SamplingParams

    env = TextCraftEnv()
    tasks = {t.id: t for split in ("fit", "val", "test") for t in env.tasks(split)}

    def command(text: str) -> str | None:
        action = parse(text)
        return normalize_command(action.command) if action else None

    steps = [p for p in pairs if p.kind == "step"]
    out: list[str] = []
    for i in range(0, len(steps), batch):
        part = steps[i:i + batch]
        replies = generator.sample([
            SampleRequest(p.prompt, 1, SamplingParams(temperature=0.0, max_tokens=160, seed=0, grammar=grammar_for(
                env, tasks[p.task_id]) if constrained else None)) for p in part])
        for p, reply in zip(part, replies, strict=True):
            got = command(reply[0].text) if reply else None
            out.append("chosen" if got == command(p.chosen) else "rejected" if got == command(p.rejected) else "other")
    return out


def choices_summary(counts: Counter[str]) -> str:
    n = sum(counts.values())
    return (f"greedy at the {n} pairs' states: the chosen command {counts['chosen']}, the rejected "
            f"{counts['rejected']}, another {counts['other']}")


def summary(counts: Counter[str]) -> str:
    n = sum(counts.values())
    parts = [f"{k} {counts[k]} ({counts[k] / max(n, 1):.2f})" for k in ("right", "inverted", "tied")]
    extra = f", {counts['unreadable']} with an unreadable action" if counts["unreadable"] else ""
    return f"{n} step pairs checked against the expert: " + ", ".join(parts) + extra


def main(argv: list[str] | None = None) -> int:
    from engine.store import Store

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db", help="an Orchard store (e.g. a loop bench's work folder bench.db)")
    ap.add_argument("--run", action="append", help="run id(s); default: every run in the store")
    ap.add_argument("--alpha", type=float, action="append",
                    help="check the pairs built from the run's trees at this eq. 10 alpha (repeatable) "
                         "instead of the stored ones")
    ap.add_argument("--theta", type=float, default=0.1, help="with --alpha: the minimum value gap")
    args = ap.parse_args(argv)
    if not Path(args.db).is_file():
        print(f"error: {args.db}: no such store", file=sys.stderr)
        return 2
    with Store(args.db) as store:
        runs = args.run or [r.id for r in store.runs()]
        for alpha in args.alpha or [None]:
            total: Counter[str] = Counter()
            label = "stored pairs" if alpha is None else f"pairs at alpha {alpha}, theta {args.theta}"
            for run_id in runs:
                counts = check_run(store, run_id, alpha, args.theta)
                total += counts
                print(f"run {run_id}, {label}: {summary(counts)}")
            if len(runs) > 1:
                print(f"all runs, {label}: {summary(total)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
