"""MCTS at inference as a search run: the operator measured to beat the policy, played where it fails.

WHY a run of its own: expert iteration ("exit-mcts" in engine/loop.py) distils the episodes
MCTS at inference plays (`EvalConfig(mode="mcts")`: a search before every real step, then one step
committed) on the tasks the greedy policy fails. Storing each episode's stitched tree
(`engine.evaluate.played_tree`) as a run's tree makes that data collection what every other search
is: listed on the Runs page, drawn in the Tree explorer (the committed path and the candidates each
step passed over), owner of the rows trained on.
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


def play_run(store: Store, env_spec: str, tasks: Sequence[TaskSpec], generator: Generator, config: EvalConfig,
             name: str, make_env: Callable[[], Env], skip_greedy_solved: bool = True,
             reporter: Reporter | None = None) -> tuple[str, PlayStats, list[Episode]]:
    """Play `tasks` with MCTS at inference (`config`, mode "mcts", one seed) and store a run whose trees
    are the played episodes' trees; with `skip_greedy_solved`, a greedy pass first and only the tasks
    greedy fails are played (the others add nothing the policy lacks). Returns (run id, stats, episodes).
    `reporter`: each pass's episodes as they end (the run's units; the searches inside each real step
    are too small to count)."""
    from engine.config import ConfigError
    from engine.evaluate import evaluate
    from engine.tree_nodes import SearchTree

    if config.mode != "mcts":
        raise ConfigError(f"play_run: EvalConfig.mode must be 'mcts', got {config.mode!r}")
    began = time.perf_counter()
    todo = list(tasks)
    if skip_greedy_solved and todo:
        counted = _counter(reporter, "greedy pass", len(todo))
        greedy = evaluate(generator, make_env, todo, replace(config, mode="greedy", seeds=config.seeds[:1]),
                          on_episode=counted).episodes
        todo = [t for t, e in zip(todo, greedy, strict=True) if not e.success]
    greedy_s = time.perf_counter() - began
    counted = _counter(reporter, "mcts play", len(todo))
    episodes = evaluate(generator, make_env, todo, replace(config, seeds=config.seeds[:1]),
                        on_episode=counted).episodes if todo else []
    run_config = {"mode": "mcts at inference", **{k: v for k, v in asdict(config).items() if k.startswith("mcts_")},
                  "max_steps": config.max_steps, "max_tokens": config.max_tokens, "constrained": config.constrained,
                  "seed": config.seeds[0], "skip_greedy_solved": skip_greedy_solved}
    run_id = store.create_run(name, env_spec, generator.name, run_config, todo)
    for (tree_id, _), episode in zip(store.tree_ids(run_id), episodes, strict=True):
        tree: SearchTree | None = episode.tree
        if tree is not None and tree.simulations:
            store.save_simulation(tree_id, tree, tree.simulations[-1], 0)
    wall = time.perf_counter() - began
    stats = PlayStats(tasks=len(tasks), greedy_solved=len(tasks) - len(todo), played=len(todo),
                      solved=sum(e.success for e in episodes),
                      simulations=sum(e.steps for e in episodes) * config.mcts_simulations,
                      greedy_s=greedy_s, wall_s=wall)
    store.set_run_status(run_id, "finished", stats.to_dict())
    return run_id, stats, episodes


def _counter(reporter: Reporter | None, phase: str, total: int) -> Callable[[Episode], None] | None:
    """An `on_episode` counting episodes (and the solved ones) as `phase`'s units; None without a reporter."""
    if reporter is None:
        return None
    units = Units(reporter, phase, total, unit="episodes", solved=0)
    return lambda episode: units.step(solved=units.extra["solved"] + int(episode.success))
