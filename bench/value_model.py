"""Does a value model learned from one search's backed-up returns order the next search's siblings better
than the policy's own critic? (issue 27 item 1d; engine/train/value_model.py)

1. One search (critic off) of `--tasks` fit tasks with the base policy; its prm rows' visited steps
   (Q~ and N) train the value model from the policy's weights.
2. A second search (the policy critic on, so every expansion holds its ranks) of `--held-tasks` OTHER
   fit tasks: the held-out trees.
3. Every pair of visited, readable siblings of a held-out tree whose rollout-grounded Q~ differ is a
   test pair: *right* when the critic prefers the one with the higher Q~, *inverted* for the reverse,
   *tied* when it gives both the same. Printed for the value model and the policy critic on the SAME
   pairs, with counts (and, as a check that training fit anything, the value model on its own trees).

Fit tasks only (train minus val): the val and test splits are never searched. Sized for ~15 minutes
on 2 shared cores with the shipped 5.3M model:

    nice -n 10 .venv/bin/python bench/value_model.py --constrained [--tasks 8 --held-tasks 8 --simulations 8]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from itertools import combinations
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import add_common_args, add_loop_args
from engine.config import SearchConfig
from engine.datasets.prm import PRMConfig
from engine.datasets.samples import TreeRef, tree_refs
from engine.envs.textcraft import TextCraftEnv
from engine.llm.registry import load_generator
from engine.search.runner import new_run
from engine.search.value_critic import ValueCritic
from engine.store import Store
from engine.train.common import resolve_model_path
from engine.train.value_model import ValueTrainConfig, train_value_model, value_examples


def sibling_pairs(refs: list[TreeRef]) -> list[tuple[TreeRef, int, int]]:
    """(tree, better, worse): visited readable siblings whose Q~ differ, the higher-Q~ one first."""
    out = []
    for ref in refs:
        tree = ref.tree
        for parent in tree.nodes:
            kids = [tree.nodes[c] for c in parent.children]
            kids = [k for k in kids if k.N > 0 and not k.format_error and k.action is not None]
            for x, y in combinations(kids, 2):
                if abs(x.Q_mcts - y.Q_mcts) > 1e-9:
                    better, worse = (x, y) if x.Q_mcts > y.Q_mcts else (y, x)
                    out.append((ref, better.id, worse.id))
    return out


def verdict(better: float | None, worse: float | None) -> str:
    if better is None or worse is None:
        return "unscored"
    return "right" if better > worse else "inverted" if better < worse else "tied"


def judge(pairs: list[tuple[TreeRef, int, int]], critic: ValueCritic | None) -> Counter:
    """Counts of right / inverted / tied: the value model's predictions, or (critic None) the stored
    policy-critic ranks (a lower rank is preferred)."""
    counts: Counter = Counter()
    cache: dict[tuple[int, int], float] = {}
    for ref, b, w in pairs:
        tree = ref.tree
        if critic is None:
            rb, rw = tree.nodes[b].critic_rank, tree.nodes[w].critic_rank
            counts[verdict(None if rb is None else -rb, None if rw is None else -rw)] += 1
            continue
        for n in (b, w):
            if (id(tree), n) not in cache:
                cache[(id(tree), n)] = critic.score_nodes(tree, [n], ref.env_description)[0]
        counts[verdict(cache[(id(tree), b)], cache[(id(tree), w)])] += 1
    return counts


def show(name: str, counts: Counter) -> str:
    total = sum(counts.values())
    decided = counts["right"] + counts["inverted"]
    share = f"{counts['right'] / decided:.3f}" if decided else "n/a"
    return (f"  {name:<34} right {counts['right']:>4}  inverted {counts['inverted']:>4}  tied {counts['tied']:>4}"
            f"  unscored {counts['unscored']:>3}  of {total}  (right / decided {share})")


def main(argv: list[str] | None = None) -> dict[str, Counter]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, test_tasks=0)
    add_loop_args(ap, tasks=8, simulations=8)
    ap.set_defaults(backup="progress", lr=1e-4, epochs=4)
    ap.add_argument("--held-tasks", type=int, default=8, help="fit tasks searched for the held-out trees")
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print("value model from backed-up returns vs the policy critic, sibling order on held-out trees")
    print(f"  command: {' '.join(sys.argv)}")
    print(f"  model {args.model}, {args.tasks} + {args.held_tasks} fit tasks x {args.simulations} simulations, "
          f"K={args.k}, depth {args.depth_limit}, {args.backup} backup, "
          f"{'constrained' if args.constrained else 'unconstrained'}, seed {args.seed}", flush=True)
    fit = TextCraftEnv().tasks("fit")
    chosen = random.Random(args.seed).sample(fit, args.tasks + args.held_tasks)
    train_tasks, held_tasks = chosen[: args.tasks], chosen[args.tasks :]
    base = {"simulations": args.simulations, "k": args.k, "depth_limit": args.depth_limit,
            "max_tokens": args.max_tokens, "backup": args.backup, "constrained": args.constrained}
    work = Path(tempfile.mkdtemp(prefix="orchard-value-model-"))
    generator = load_generator(args.model)
    description = TextCraftEnv().describe()
    with Store(work / "bench.db") as store:
        refs = {}
        for name, tasks, config in (
            ("train", train_tasks, SearchConfig(**base, critic=False, alpha=1.0, seed=args.seed + 1)),
            ("held-out", held_tasks, SearchConfig(**base, critic=True, seed=args.seed + 2)),
        ):
            t = time.perf_counter()
            run_id, _ = new_run(store, "textcraft", tasks, generator, config, f"bench-value-{name}",
                                make_env=TextCraftEnv)
            refs[name] = tree_refs(store, run_id, description)
            print(f"  search {name}: {store.run(run_id).solved}/{len(tasks)} solved, critic "
                  f"{'policy' if config.critic else 'off'}, {time.perf_counter() - t:.0f} s", flush=True)
    del generator
    examples = value_examples(refs["train"], PRMConfig())
    t = time.perf_counter()
    meta = train_value_model(resolve_model_path(args.model), examples, work / "value-model",
                             ValueTrainConfig(epochs=int(args.epochs), learning_rate=args.lr,
                                              batch_size=args.batch_size, seed=args.seed))
    losses = ", ".join(f"{h['loss']:.3f}" for h in meta["history"])
    print(f"  value model: {len(examples)} visited steps (mean Q~ {meta['mean_target']:.3f}, {meta['visits']} "
          f"returns), {int(args.epochs)} epochs lr {args.lr}, loss by epoch {losses}, "
          f"{time.perf_counter() - t:.0f} s", flush=True)
    critic = ValueCritic(work / "value-model")
    held = sibling_pairs(refs["held-out"])
    own = sibling_pairs(refs["train"])
    print(f"sibling pairs with different Q~ (visited, readable): held-out {len(held)}, training trees {len(own)}")
    results = {"value model (held-out)": judge(held, critic), "policy critic (held-out)": judge(held, None),
               "value model (its training trees)": judge(own, critic)}
    for name, counts in results.items():
        print(show(name, counts))
    print(f"wall time {time.perf_counter() - t0:.0f} s; work folder {work}")
    return results


if __name__ == "__main__":
    main()
