"""MCTS at inference as a search run: the operator measured to beat the policy, played where it fails.

WHY a run of its own: expert iteration ("exit-mcts" in engine/loop.py) distils the episodes
MCTS at inference plays (`EvalConfig(mode="mcts")`: a search before every real step, then one step
committed) on the tasks the greedy policy fails. Storing each episode's stitched tree
(`engine.evaluate.played_tree`) as a run's tree makes that data collection what every other search
is: listed on the Runs page, drawn in the Tree explorer (the committed path and the candidates each
step passed over), owner of the rows trained on.

The cheapest search is played the same way: N sampled episodes from each task's start ("sampled"
mode, best-of-N). Merged on their common prefixes they are a Monte Carlo tree (`sampled_tree`): every
step a node, visit counts and mean returns backed up along each episode, each episode one simulation,
so the tree's data builders (shortest successful path, visit targets, pairs at decisive nodes) read it
as they read a search's tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.progress import Reporter, Units

if TYPE_CHECKING:
    from engine.envs.base import Env, TaskSpec
    from engine.evaluate import Episode, EvalConfig
    from engine.llm.base import Generator
    from engine.store import Store
    from engine.tree_nodes import SearchTree


@dataclass(frozen=True)
class PlayStats:
    """What one play run did: tasks offered, solved greedily (not played), played, solved by MCTS."""

    tasks: int
    greedy_solved: int
    played: int
    solved: int
    simulations: int
    greedy_s: float
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "simulations_per_s": self.simulations / self.wall_s if self.wall_s else 0.0}


def sampled_tree(task: TaskSpec, episodes: Sequence[Episode]) -> tuple[SearchTree, list[int]]:
    """The Monte Carlo tree of `episodes` (one task's, played from its start): each episode's steps as a
    path from the root, equal completions at a node merged; along each path N += 1 and the episode's
    reward added (reward backup), one Simulation per episode. Returns the tree and, per simulation, the
    first node it writes (the node count before it; 0 for the first, which writes the root too): what
    `Store.save_simulations` needs to write each one's new nodes."""
    from engine.actions import FormatError, parse
    from engine.tree_nodes import SearchTree, Simulation

    tree = SearchTree.new(task, episodes[0].first_observation if episodes else "")
    firsts: list[int] = []
    for e in episodes:
        firsts.append(len(tree.nodes) if firsts else 0)
        node, path = tree.root, []
        for k, (text, observation) in enumerate(e.turns):
            last = k == len(e.turns) - 1
            child = next((tree.nodes[c] for c in node.children if tree.nodes[c].raw == text), None)
            if child is None:
                parsed = parse(text)
                bad = isinstance(parsed, FormatError)
                child = tree.add_child(node, observation=observation, raw=text,
                                       action=None if isinstance(parsed, FormatError) else parsed,
                                       format_error=parsed.reason if isinstance(parsed, FormatError) else None,
                                       terminal=EPISODE_ENDS.get(e.terminal, "stopped") if last else None,
                                       reward=e.reward if last else None)
                if bad and not last:  # an episode answered a format error and went on ("observe")
                    child.terminal = None
            path.append(child.id)
            node = child
        for nid in (0, *path):
            tree.nodes[nid].N += 1
            tree.nodes[nid].value_sum += e.reward
        tree.simulations.append(Simulation(tuple(path), e.reward))
    return tree, firsts


# An episode's end (engine.evaluate) as a tree node's terminal (engine.tree_nodes.TERMINALS).
EPISODE_ENDS = {"success": "success", "failure": "failure", "format_error": "format_error", "stopped": "stopped",
                "max_steps": "depth_limit"}


def play_run(store: Store, env_spec: str, tasks: Sequence[TaskSpec], generator: Generator, config: EvalConfig,
             name: str, make_env: Callable[[], Env], skip_greedy_solved: bool = True,
             reporter: Reporter | None = None) -> tuple[str, PlayStats, list[Episode], list[Episode]]:
    """Play `tasks` with MCTS at inference (`config`, mode "mcts", one seed), or sample `config.seeds`
    episodes of each from its start (mode "sampled": best-of-N, stored as `sampled_tree`s), and store a
    run whose trees are the played episodes' trees; with `skip_greedy_solved`, a greedy pass first and
    only the tasks greedy fails are played (the others add nothing the policy lacks). Returns (run id,
    stats, episodes, the greedy pass's episodes: the policy's own failures, which
    `engine.datasets.corrections` labels with the played wins). `reporter`: each pass's episodes as they end (the run's units; the searches inside
    each real step are too small to count)."""
    from engine.config import ConfigError
    from engine.evaluate import evaluate
    from engine.store.runs import simulation_rows
    from engine.tree_nodes import SearchTree

    if config.mode not in ("mcts", "sampled"):
        raise ConfigError(f"play_run: EvalConfig.mode must be 'mcts' or 'sampled', got {config.mode!r}")
    sampled = config.mode == "sampled"
    began = time.perf_counter()
    todo = list(tasks)
    greedy: list[Episode] = []
    if skip_greedy_solved and todo:
        counted = _counter(reporter, "greedy pass", len(todo))
        greedy = evaluate(generator, make_env, todo, replace(config, mode="greedy", seeds=config.seeds[:1]),
                          on_episode=counted).episodes
        todo = [t for t, e in zip(todo, greedy, strict=True) if not e.success]
    greedy_s = time.perf_counter() - began
    play = config if sampled else replace(config, seeds=config.seeds[:1])
    counted = _counter(reporter, "sampled play" if sampled else "mcts play", len(todo) * len(play.seeds))
    episodes = evaluate(generator, make_env, todo, play, on_episode=counted).episodes if todo else []
    run_config = {"mode": "sampled episodes" if sampled else "mcts at inference",
                  **({"samples": len(play.seeds), "temperature": config.temperature} if sampled else
                     {k: v for k, v in asdict(config).items() if k.startswith("mcts_")}),
                  "max_steps": config.max_steps, "max_tokens": config.max_tokens, "constrained": config.constrained,
                  "seed": config.seeds[0], "skip_greedy_solved": skip_greedy_solved}
    run_id = store.create_run(name, env_spec, generator.name, run_config, todo)
    per_task = len(play.seeds)
    for k, (tree_id, _) in enumerate(store.tree_ids(run_id)):
        if sampled:  # evaluate returns each task's episodes together, in seed order
            tree, firsts = sampled_tree(todo[k], episodes[k * per_task:(k + 1) * per_task])
            ends = [*firsts[1:], len(tree.nodes)]  # simulation i wrote nodes firsts[i] .. ends[i] - 1
            store.save_simulations([
                simulation_rows(tree_id, SearchTree(tree.task, tree.nodes[:end], tree.simulations[:i + 1]), sim, first)
                for i, (sim, first, end) in enumerate(zip(tree.simulations, firsts, ends, strict=True))])
        elif (played := episodes[k].tree) is not None and played.simulations:
            store.save_simulation(tree_id, played, played.simulations[-1], 0)
    wall = time.perf_counter() - began
    stats = PlayStats(tasks=len(tasks), greedy_solved=len(tasks) - len(todo), played=len(todo),
                      solved=len({e.task_id for e in episodes if e.success}),
                      simulations=len(episodes) if sampled else sum(e.steps for e in episodes) * config.mcts_simulations,
                      greedy_s=greedy_s, wall_s=wall)
    store.set_run_status(run_id, "finished", stats.to_dict())
    return run_id, stats, episodes, greedy


def _counter(reporter: Reporter | None, phase: str, total: int) -> Callable[[Episode], None] | None:
    """An `on_episode` counting episodes (and the solved ones) as `phase`'s units; None without a reporter."""
    if reporter is None:
        return None
    units = Units(reporter, phase, total, unit="episodes", solved=0)
    return lambda episode: units.step(solved=units.extra["solved"] + int(episode.success))
