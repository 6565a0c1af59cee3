"""Search distilled into SFT rows: what the next policy should imitate, read off a stored tree.

WHY apart from pairs.py: step pairs teach an ORDER between two candidates (and measured on the tiny
model, the order is as often wrong as right); the rows here teach the policy what search itself
chose, the operator that measurably beats the policy (MCTS at inference). Two targets:

- `best_path_samples` (expert iteration, ExIt / ReST-style): per solved tree, its shortest
  successful trajectories (tree path, then the rollout's own steps), every turn trained. The
  shortest one is kept because it carries the fewest wasted steps (a failed command, a repeat):
  search's detours are not what the policy should copy.
- `visit_samples` (AlphaZero-style visit-count targets): at every expanded node with at least
  `min_visits` visits, the policy's distribution over the node's candidates is pulled toward the
  MCTS visit distribution. SFT has no soft targets, so each node contributes `rows_per_node` rows
  drawn from its children with probability N(child) / sum N — in expectation exactly the
  cross-entropy to the visit distribution (deterministic per seed).

Both produce `Sample`s with the search's own completions as targets, so they reach training
through the same per-step rows (`to_step_rows`) as every other SFT set.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.config import ConfigError
from engine.datasets.corrections import refused_turns
from engine.datasets.samples import (
    Sample,
    Task,
    TreeRef,
    Turn,
    path_turns,
    rollout_samples,
    stable_id,
    system_prompt,
    trajectory_sample,
    tree_task,
)


@dataclass(frozen=True)
class DistillConfig:
    """`per_tree`: successful trajectories kept per solved tree (shortest first); `min_visits`,
    `rows_per_node`: the visit-count targets' node filter and sample size."""

    per_tree: int = 1
    min_visits: int = 4
    rows_per_node: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("per_tree", "min_visits", "rows_per_node"):
            if getattr(self, name) < 1:
                raise ConfigError(f"DistillConfig.{name}: must be >= 1, got {getattr(self, name)!r}")


def best_path_samples(ref: TreeRef, config: DistillConfig = DistillConfig(), kind: str = "exit") -> list[Sample]:
    """Expert-iteration rows of one tree: its `per_tree` shortest successful trajectories (ties by
    path), built as the RFT rows are (`trajectory_sample` for a success node, `rollout_samples` for a
    successful rollout, each ending on the assistant)."""
    wins = [n.id for n in ref.tree.nodes if n.terminal == "success" and n.parent is not None]
    found = [trajectory_sample(ref, leaf, kind) for leaf in wins] + rollout_samples(ref, kind)
    found.sort(key=lambda s: (len(s.turns), s.source["path"]))
    return [replace(s, source={**s.source, "steps": len(s.turns), "target": "shortest successful trajectory"})
            for s in found[: config.per_tree]]


def visit_targets(ref: TreeRef, config: DistillConfig = DistillConfig()) -> list[tuple[int, dict[int, float]]]:
    """(node, {child: visit share}) for each expanded node with >= `min_visits` visits whose visited
    children are readable actions; the shares sum to 1."""
    tree, out = ref.tree, []
    for node in tree.nodes:
        if node.N < config.min_visits or node.terminal is not None:
            continue
        kids = [tree.nodes[c] for c in node.children if tree.nodes[c].N > 0 and not tree.nodes[c].format_error
                and tree.nodes[c].action is not None]
        total = sum(k.N for k in kids)
        if total:
            out.append((node.id, {k.id: k.N / total for k in kids}))
    return out


def visit_samples(ref: TreeRef, config: DistillConfig = DistillConfig(), kind: str = "visits") -> list[Sample]:
    """Visit-count rows of one tree: per target node, `rows_per_node` children drawn by visit share,
    each as the path to the node (untrained context) and the child's action (trained)."""
    tree = ref.tree
    rng = random.Random(f"{config.seed}:{ref.run_id}:{tree.task.id}")
    out = []
    for node_id, shares in visit_targets(ref, config):
        kids = sorted(shares)
        drawn = rng.choices(kids, weights=[shares[k] for k in kids], k=config.rows_per_node)
        prefix = [n.id for n in tree.path(tree.nodes[node_id])]
        context = path_turns(tree, prefix, False, "prefix")
        for draw, child in enumerate(drawn):
            turns = [*context, *path_turns(tree, [child], True, "good")]
            turns[-1] = replace(turns[-1], observation=None)
            out.append(Sample(
                id=stable_id(kind, ref.run_id, tree.task.id, node_id, child, draw),
                kind=kind, task=tree_task(ref), turns=tuple(turns), run_id=ref.run_id,
                source={"tree_id": ref.tree_id, "task_id": tree.task.id, "node": node_id, "child": child,
                        "share": shares[child], "target": "MCTS visit distribution"},
            ))
    return out


def distill(refs: Sequence[TreeRef], target: str, config: DistillConfig = DistillConfig(),
            on_tree: Callable[[list[Sample]], None] | None = None) -> list[Sample]:
    """The rows of `target` ("exit" or "visits") from many trees; `on_tree` is told the rows so far
    after each tree (a stage's progress)."""
    build = {"exit": best_path_samples, "visits": visit_samples}
    if target not in build:
        raise ConfigError(f"unknown distillation target {target!r} (expected one of {', '.join(build)})")
    out: list[Sample] = []
    for ref in refs:
        out.extend(build[target](ref, config))
        if on_tree is not None:
            on_tree(out)
    return out


def episode_samples(episodes: Sequence[Any], tasks: Sequence[Any], env_description: str, kind: str = "exit",
                    run_id: str | None = None, make_env: Callable[[], Any] | None = None, wins_only: bool = True,
                    origin: str = "mcts at inference") -> list[Sample]:
    """Expert-iteration rows from played episodes (MCTS at inference: the operator measured to beat the
    policy): each successful episode becomes one trajectory, every committed step a target. Unlike a
    stored tree's best path, these are the steps search committed to one real step at a time, so they
    carry the recoveries (an env refusal, then the missing ingredient fetched) the greedy policy lacks.
    Episodes started after a prefix (recovery starts) are skipped: their turns do not begin at reset.
    With `make_env` (an env that can snapshot), the turns the env refused (replayed: the state did not
    change) stay in the trajectory as untrained context: the recovery after a refusal is learnt, the
    refused command is not (a sampled win at temperature 1 refuses about one step in four).
    `wins_only=False` keeps every episode (a bench's rehearsal of the policy's own steps); `origin` names
    where the episodes came from in each row's source."""
    by_id = {t.id: t for t in tasks}
    system = system_prompt(env_description)
    env = make_env() if make_env is not None else None
    out, seen = [], set()
    for e in episodes:
        if (wins_only and not e.success) or not e.turns or e.prefix_steps or e.task_id not in by_id:
            continue
        key = (e.task_id, tuple(text for text, _ in e.turns))
        if key in seen:
            continue
        seen.add(key)
        spec = by_id[e.task_id]
        task = Task(id=spec.id, goal=spec.goal, context=spec.context, first_observation=e.first_observation,
                    system=system)
        refused = refused_turns(env, e) if env is not None else set()
        turns = [Turn(text=text, observation=obs, loss=i not in refused, segment="bad" if i in refused else "good")
                 for i, (text, obs) in enumerate(e.turns)]
        turns[-1] = replace(turns[-1], observation=None)
        out.append(Sample(id=stable_id(kind, run_id, e.task_id, e.seed, *key[1]), kind=kind, task=task,
                          turns=tuple(turns), run_id=run_id,
                          source={"task_id": e.task_id, "seed": e.seed, "steps": e.steps, "reward": e.reward,
                                  "terminal": e.terminal, "from": origin,
                                  **({"refused_untrained": len(refused)} if env is not None else {})}))
    if env is not None and hasattr(env, "close"):
        env.close()
    return out
