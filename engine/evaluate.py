"""Evaluation of a policy on held-out tasks (docs/algorithms.md §7): AgentBoard-style success and progress
rate as in AgentRefine (arXiv 2501.01702), Agent-R's loop rate and recovery (arXiv 2501.11425), and Agent Q's
MCTS at test time (arXiv 2408.07199).

Metrics per evaluation, each with a bootstrap confidence interval over TASKS (episodes of one task
are averaged first, so more seeds narrow the per-task estimate without pretending tasks are more
numerous than they are):
- success rate: the episode reached reward >= `success_threshold`;
- progress rate: the env's latched progress at the end (max over the episode; AgentBoard style);
- loop rate: the share of episodes in which some run of L consecutive commands is immediately
  repeated (A B A B for L = 2), for L = 1..`loop_max_len`; per L also the mean number of repeats;
- recovery score: the success rate of episodes that START from an erroneous prefix (Agent-R's
  recovery set: a bad path through its first error; the prefix is replayed, the model continues).

Policy modes:
- greedy: temperature 0, one episode per task;
- sampled: temperature `temperature`, one episode per task and seed;
- mcts: search at inference (Agent Q). At every real step, `mcts_simulations` more MCTS simulations
  (the model as actor, critic and rollout policy) grow the tree below the current state; the agent
  then commits to the best explored child (eq. 10 value, visits break ties) and the tree is re-rooted
  there, keeping the subtree already searched. The search steps private env copies (replay or
  snapshots), so it assumes a resettable simulator, as MCTS at test time does; the real episode's env
  is stepped once per committed action and its outcome is what is scored.

All episodes advance in lock-step: one `Generator.sample` call per step serves every active episode
(greedy/sampled), and one MCTS scheduler grows every episode's tree with shared batches (mcts).
An episode ends at success (env done), a STATUS other than CONTINUE, a format error (as in search),
or `max_steps` model steps.
"""

from __future__ import annotations

import random
import statistics
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from engine.actions import FormatError, parse
from engine.config import ConfigError, SearchConfig, from_dict
from engine.envs.base import Env, Step, TaskSpec, checked_step, close_env, close_envs, env_label
from engine.grammar import grammar_for
from engine.llm.base import Generator, GeneratorError, SampleRequest, SamplingParams
from engine.progress import Reporter, Units
from engine.prompts import HistoryStep, actor_prompt
from engine.tree_nodes import Node, SearchTree, Simulation, reroot

if TYPE_CHECKING:
    from engine.store import Store

MODES = ("greedy", "sampled", "mcts")
OnEpisode = Callable[["Episode"], None]  # told each episode as it ends
FORMAT_ERROR_OBSERVATION = (
    "Invalid action: {reason}. Answer with THOUGHT, ACTION, EXPLANATION and STATUS lines; nothing happened."
)


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate. `seeds`: episodes per task for sampled/mcts (greedy uses the first only)."""

    mode: str = field(default="greedy", metadata={"help": "policy mode", "choices": MODES})
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "episodes per task for sampled/mcts, e.g. 0,1,2"})
    max_steps: int = field(default=15, metadata={"help": "model steps per episode at most"})
    temperature: float = field(default=1.0, metadata={"help": "sampled mode temperature"})
    max_tokens: int = field(default=256, metadata={"help": "tokens per action"})
    success_threshold: float = 1.0
    loop_max_len: int = 4
    bootstrap: int = 1000
    confidence: float = 0.95
    mcts_simulations: int = field(default=8, metadata={"help": "mcts mode: simulations per real step"})
    mcts_k: int = 4
    mcts_critic: bool = True
    mcts_alpha: float = 0.5
    mcts_rollout_temperature: float = 1.0
    mcts_backup: str = field(default="reward", metadata={  # SearchConfig.backup
        "help": "mcts mode: value backed up, the terminal reward or max(reward, latched progress)",
        "choices": ("reward", "progress")})
    mcts_value_model: str = field(default="", metadata={  # SearchConfig.value_model
        "help": "mcts mode: a value-model folder (trained by engine/train/value_model.py) as the critic "
                "in place of the policy's ranking"})
    # What an unreadable completion does (greedy/sampled): "terminal" ends the episode, as search does
    # (the headline); "observe" answers it with FORMAT_ERROR_OBSERVATION and goes on, as AgentGym's
    # servers answer an invalid action. It still counts as a step and a format error.
    format_errors: str = field(default="terminal", metadata={
        "help": "an unreadable action ends the episode (terminal) or is answered with an error observation "
                "and the episode goes on (observe, as AgentGym servers do)",
        "choices": ("terminal", "observe")})
    constrained: bool = field(default=False, metadata={
        "help": "decode actions under the composite-action grammar, commands from the env's own pattern "
                "(engine/grammar.py)"})

    def __post_init__(self) -> None:
        checks = {
            "mode": self.mode in MODES,
            "seeds": len(self.seeds) >= 1,
            "max_steps": self.max_steps >= 1,
            "temperature": self.temperature >= 0,
            "max_tokens": self.max_tokens >= 1,
            "loop_max_len": self.loop_max_len >= 1,
            "bootstrap": self.bootstrap >= 0,
            "confidence": 0 < self.confidence < 1,
            "mcts_simulations": self.mcts_simulations >= 1,
            "mcts_k": self.mcts_k >= 1,
            "mcts_alpha": 0 <= self.mcts_alpha <= 1,
            "mcts_backup": self.mcts_backup in ("reward", "progress"),
            "format_errors": self.format_errors in ("terminal", "observe"),
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"EvalConfig.{name}: invalid value {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "eval config") -> EvalConfig:
        """engine.config.from_dict for this class (types checked, unknown keys named)."""
        return from_dict(cls, data, where=where)

    @property
    def episode_seeds(self) -> tuple[int, ...]:
        return self.seeds[:1] if self.mode == "greedy" else self.seeds


DEFAULT_EVAL = EvalConfig(mode="greedy", max_steps=10, max_tokens=160, constrained=True)
"""The evaluation `orchard demo` runs and the dashboard's launch form starts from (with no baseline to
copy): greedy, under the grammar the demo's search decodes with, 10 steps of at most 160 tokens. One
definition, so two evaluations made with one click each are comparable. `EvalConfig()`'s own field
defaults (the CLI's and a job config's) are unchanged."""


@dataclass(frozen=True)
class Start:
    """Where an episode starts: a task, optionally after a prefix (recovery): the env commands to
    replay and the history the prompts show for it."""

    task: TaskSpec
    commands: tuple[str, ...] = ()
    history: tuple[HistoryStep, ...] = ()
    label: str = ""


@dataclass
class Episode:
    task_id: str
    seed: int
    label: str = ""
    success: bool = False
    reward: float = 0.0
    progress: float = 0.0
    steps: int = 0
    commands: list[str] = field(default_factory=list)
    terminal: str = ""
    format_errors: int = 0
    prefix_steps: int = 0
    # (completion, the env's answer) per model step: what a distillation of these episodes trains on
    # (`engine.datasets.distill.episode_samples`); not stored with the evaluation.
    turns: list[tuple[str, str]] = field(default_factory=list, repr=False)
    first_observation: str = field(default="", repr=False)  # the env's answer to reset (not stored either)
    # mcts mode: every step's search stitched into one tree rooted at the start (`played_tree`), the
    # committed path through it; a search run can store it like any tree (not stored with the evaluation).
    tree: Any = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["turns"], data["first_observation"], data["tree"]
        return data


# ------------------------------------------------------------------ metrics


def repeats(commands: Sequence[str], length: int) -> int:
    """How many times a run of `length` commands immediately repeats the run before it, scanning
    left to right and skipping past each repeat found (A B A B A B has 2 repeats of length 2)."""
    count, i = 0, length
    while i + length <= len(commands):
        if list(commands[i : i + length]) == list(commands[i - length : i]):
            count += 1
            i += length
        else:
            i += 1
    return count


def bootstrap_ci(groups: dict[str, list[float]], n: int, confidence: float, seed: int = 0) -> dict[str, float]:
    """Mean of per-group means and a percentile bootstrap interval resampling groups (tasks)."""
    means = [statistics.fmean(v) for v in groups.values() if v]
    if not means:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    mean = statistics.fmean(means)
    if n == 0 or len(means) == 1:
        return {"mean": mean, "low": mean, "high": mean, "n": len(means)}
    rng = random.Random(seed)
    k = len(means)
    low, high = _percentiles([statistics.fmean(rng.choices(means, k=k)) for _ in range(n)], confidence)
    return {"mean": mean, "low": low, "high": high, "n": k}


def _percentiles(stats: list[float], confidence: float) -> tuple[float, float]:
    """The percentile interval of bootstrap statistics."""
    stats = sorted(stats)
    tail, n = (1 - confidence) / 2, len(stats)
    return stats[int(tail * (n - 1))], stats[round((1 - tail) * (n - 1))]


def _get(e: Any, key: str) -> Any:
    return e[key] if isinstance(e, dict) else getattr(e, key)


def by_task(episodes: Sequence[Any], metric: str, loop_max_len: int = 4) -> dict[str, list[float]]:
    """Per task (label for recovery starts), the episodes' values of `metric` (success, progress,
    loop_rate), scored as `summarize` scores them: what `paired_bootstrap_diff` takes. Episodes are
    `Episode`s or the stored rows of an evaluation (the benches, the dashboard and the demo share it)."""
    def value(e: Any) -> float:
        if metric == "success":
            return 1.0 if _get(e, "success") else 0.0
        if metric == "progress":
            return float(_get(e, "progress"))
        commands = _get(e, "commands")
        return 1.0 if any(repeats(commands, L) for L in range(1, loop_max_len + 1)) else 0.0

    out: dict[str, list[float]] = {}
    for e in episodes:
        out.setdefault(_get(e, "label") or _get(e, "task_id"), []).append(value(e))
    return out


def paired_bootstrap_diff(a_by_task: dict[str, list[float]], b_by_task: dict[str, list[float]], n: int = 1000,
                          confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """The mean over tasks of (b - a) (per-task means first) and a percentile bootstrap interval that
    resamples TASKS, the same resampled tasks for both arms (docs/algorithms.md §7).

    WHY paired: two policies on the same tasks share each task's difficulty; differencing per task
    removes it, so the interval of the gain is much narrower than one built from two independent
    intervals (and the two independent intervals overlapping says little about the difference).
    Both arms must cover the same tasks: a task scored by only one arm is an error, not a silent drop."""
    a = {t: statistics.fmean(v) for t, v in a_by_task.items() if v}
    b = {t: statistics.fmean(v) for t, v in b_by_task.items() if v}
    if a.keys() != b.keys():
        only = sorted(a.keys() ^ b.keys())
        raise ValueError(f"paired bootstrap: the arms cover different tasks ({len(only)} in one arm only, "
                         f"e.g. {only[0]!r})")
    diffs = [b[t] - a[t] for t in sorted(a)]
    if not diffs:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    mean = statistics.fmean(diffs)
    if n == 0 or len(diffs) == 1:
        return {"mean": mean, "low": mean, "high": mean, "n": len(diffs)}
    rng = random.Random(seed)
    k = len(diffs)
    low, high = _percentiles([statistics.fmean(rng.choices(diffs, k=k)) for _ in range(n)], confidence)
    return {"mean": mean, "low": low, "high": high, "n": k}


def summarize(episodes: Sequence[Episode], config: EvalConfig) -> dict[str, Any]:
    """Every metric with its interval (see the module docstring)."""

    def per_task(value: Callable[[Episode], float]) -> dict[str, list[float]]:
        groups: dict[str, list[float]] = {}
        for e in episodes:
            groups.setdefault(e.label or e.task_id, []).append(value(e))
        return groups

    def ci(value: Callable[[Episode], float]) -> dict[str, float]:
        return bootstrap_ci(per_task(value), config.bootstrap, config.confidence)

    lengths = range(1, config.loop_max_len + 1)
    loops = {
        str(L): {
            "episodes": statistics.fmean(1.0 if repeats(e.commands, L) else 0.0 for e in episodes) if episodes else 0.0,
            "mean_repeats": statistics.fmean(repeats(e.commands, L) for e in episodes) if episodes else 0.0,
        }
        for L in lengths
    }
    terminals: dict[str, int] = {}
    for e in episodes:
        terminals[e.terminal] = terminals.get(e.terminal, 0) + 1
    return {
        "episodes": len(episodes),
        "tasks": len({e.label or e.task_id for e in episodes}),
        "success": ci(lambda e: 1.0 if e.success else 0.0),
        "progress": ci(lambda e: e.progress),
        "loop_rate": ci(lambda e: 1.0 if any(repeats(e.commands, L) for L in lengths) else 0.0),
        "loops_by_length": loops,
        "mean_steps": statistics.fmean(e.steps for e in episodes) if episodes else 0.0,
        "format_error_rate": (sum(e.format_errors for e in episodes) / max(1, sum(e.steps for e in episodes))),
        "terminals": terminals,
    }


# ------------------------------------------------------------------ episodes


@dataclass
class _Live:
    """An episode in progress: its env, prompt history and current observation."""

    episode: Episode
    env: Env
    task: TaskSpec
    history: list[HistoryStep]
    observation: str
    tree: Any = None  # mcts mode: the search tree rooted at the episode's start
    searched: list[tuple[Any, int, int]] = field(default_factory=list)  # mcts: (tree, current, chosen) per step


def _seed(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _description(make_env: Callable[[], Env]) -> str:
    env = make_env()
    try:
        return env.describe()
    finally:
        close_env(env)


def _step(env: Env, task_id: str, step_no: int, command: str) -> Step:
    """Every env step of an evaluation: reward and progress validated (a NaN is a clear error)."""
    return checked_step(env.step(command), env_label(env), task_id, step_no, command)


def _begin(start: Start, seed: int, make_env: Callable[[], Env], config: EvalConfig) -> _Live:
    """A started episode; its env is the caller's to close (closed here if the start fails)."""
    env = make_env()
    episode = Episode(task_id=start.task.id, seed=seed, label=start.label, prefix_steps=len(start.commands))
    try:
        obs = episode.first_observation = env.reset(start.task.id)
        for i, command in enumerate(start.commands, 1):
            step = _step(env, start.task.id, i, command)
            obs = step.observation
            episode.progress = max(episode.progress, step.progress or 0.0)
            if step.done:
                episode.reward = step.reward
                episode.success = step.reward >= config.success_threshold
                episode.terminal = "done_in_prefix"
    except BaseException:
        close_env(env)
        raise
    return _Live(episode, env, start.task, list(start.history), obs)


def _apply(live: _Live, text: str, config: EvalConfig) -> bool:
    """Act on one completion; True while the episode goes on."""
    e = live.episode
    e.steps += 1
    parsed = parse(text)
    if isinstance(parsed, FormatError):
        e.format_errors += 1
        if config.format_errors == "observe" and e.steps < config.max_steps:
            live.observation = FORMAT_ERROR_OBSERVATION.format(reason=parsed.reason)
            e.turns.append((text, live.observation))
            return True
        e.turns.append((text, ""))
        e.terminal = "format_error"
        return False
    step = _step(live.env, live.task.id, e.prefix_steps + len(e.commands) + 1, parsed.command)
    e.commands.append(parsed.command)
    e.progress = max(e.progress, step.progress or 0.0)
    live.history.append(HistoryStep(parsed, step.observation))
    live.observation = step.observation
    e.turns.append((text, step.observation))
    if step.done or step.reward >= config.success_threshold:
        e.reward = step.reward
        e.success = step.reward >= config.success_threshold
        e.terminal = "success" if e.success else "failure"
        return False
    if parsed.status != "CONTINUE":
        e.terminal = "stopped"
        return False
    if e.steps >= config.max_steps:
        e.terminal = "max_steps"
        return False
    return True


def _policy_episodes(generator: Generator, make_env: Callable[[], Env], starts: Sequence[Start],
                     config: EvalConfig, on_episode: OnEpisode | None = None) -> list[Episode]:
    description = _description(make_env)
    lives: list[_Live] = []
    try:
        for s in starts:
            for seed in config.episode_seeds:
                lives.append(_begin(s, seed, make_env, config))
                if lives[-1].episode.terminal and on_episode is not None:  # ended in its prefix
                    on_episode(lives[-1].episode)
        _policy_loop(generator, description, lives, config, on_episode)
    finally:
        close_envs(lv.env for lv in lives)
    return [lv.episode for lv in lives]


def _policy_loop(generator: Generator, description: str, lives: list[_Live], config: EvalConfig,
                 on_episode: OnEpisode | None = None) -> None:
    active = [lv for lv in lives if not lv.episode.terminal]
    temperature = 0.0 if config.mode == "greedy" else config.temperature
    while active:
        requests = [
            SampleRequest(
                actor_prompt(description, lv.task.goal, lv.task.context, lv.history, lv.observation), 1,
                SamplingParams(temperature=temperature, max_tokens=config.max_tokens,
                               seed=_seed(lv.episode.seed, lv.episode.label, lv.task.id, lv.episode.steps),
                               grammar=grammar_for(lv.env, lv.task) if config.constrained else None),
            )
            for lv in active
        ]
        replies = generator.sample(requests)
        if len(replies) != len(requests):
            raise GeneratorError(f"generator returned {len(replies)} results for {len(requests)} requests")
        going = []
        for lv, reply in zip(active, replies, strict=True):
            if _apply(lv, reply[0].text if reply else "", config):
                going.append(lv)
            elif on_episode is not None:
                on_episode(lv.episode)
        active = going


# ------------------------------------------------------------------ MCTS at inference


def played_tree(searched: Sequence[tuple[Any, int, int]]) -> Any:
    """One tree of an MCTS-at-inference episode: every real step searched a re-rooted copy (`reroot`:
    the committed path, then the subtree below the current node); `searched[k]` is step k's tree
    after its search, its current node and the child committed to. Below each committed child the
    next step's (grown) copy takes over; every other explored child keeps the subtree it had when it
    was passed over; the committed path's visit counts are the last step's. Nodes are numbered
    depth-first, parents before children; the one simulation recorded is the committed path."""
    nodes: list[Node] = []
    committed: dict[int, int] = {}  # step -> the new id of the child committed to at that step

    def copy(k: int, nid: int, parent: int | None) -> int:
        tree, _, chosen = searched[k]
        n = tree.nodes[nid]
        new = Node(**{f: v for f, v in n.__dict__.items() if f not in ("children", "id", "parent", "depth")},
                   id=len(nodes), parent=parent, depth=0 if parent is None else nodes[parent].depth + 1)
        nodes.append(new)
        if parent is not None:
            nodes[parent].children.append(new.id)
        for c in n.children:
            if c != chosen:
                copy(k, c, new.id)
            elif k + 1 < len(searched):
                committed[k] = copy(k + 1, searched[k + 1][1], new.id)  # the same node, searched again
            else:
                committed[k] = copy(k, c, new.id)
        return new.id

    copy(0, searched[0][1], None)
    path = tuple(committed[k] for k in range(len(searched)))
    # Later steps' simulations also passed through the committed path's earlier nodes: their visit
    # counts and values are the last searched tree's (its chain root .. current node).
    last, current, _ = searched[-1]
    chain = [last.nodes[0], *last.path(last.nodes[current])]
    for new_id, old in zip((0, *path), chain, strict=False):
        nodes[new_id].N, nodes[new_id].value_sum = old.N, old.value_sum
    return SearchTree(task=searched[0][0].task, nodes=nodes,
                      simulations=[Simulation(path, float(nodes[path[-1]].reward or 0.0))])


def _mcts_episodes(generator: Generator, make_env: Callable[[], Env], starts: Sequence[Start],
                   config: EvalConfig, on_episode: OnEpisode | None = None) -> list[Episode]:
    from engine.search.mcts import start_tree

    if any(s.commands for s in starts):
        raise ConfigError("mcts mode evaluates from the task start only (recovery starts need greedy or sampled)")
    lives: list[_Live] = []
    description = _description(make_env)
    try:
        for s in starts:
            for seed in config.episode_seeds:
                lives.append(_begin(s, seed, make_env, config))
                job = start_tree(s.task, make_env, 0)
                job.close()  # only its root observation is needed; each search step makes its own envs
                lives[-1].tree = job.tree
        _mcts_loop(generator, make_env, description, lives, config, on_episode)
        for lv in lives:
            lv.episode.tree = played_tree(lv.searched) if lv.searched else None
    finally:
        close_envs(lv.env for lv in lives)
    return [lv.episode for lv in lives]


def _mcts_loop(generator: Generator, make_env: Callable[[], Env], description: str, lives: list[_Live],
               config: EvalConfig, on_episode: OnEpisode | None = None) -> None:
    from engine.search.mcts import MCTS, TreeJob

    jobs: list[tuple[_Live, Any, int]] = [(lv, lv.tree, 0) for lv in lives]  # (episode, tree, current node id)
    active = list(range(len(jobs)))
    for step in range(config.max_steps):
        if not active:
            break
        batch = []
        for i in active:
            live, tree, current = jobs[i]
            rooted, current = reroot(tree, current)
            jobs[i] = (live, rooted, current)
            batch.append(TreeJob(tree=rooted, make_env=make_env, env_description=description,
                                 target=config.mcts_simulations))
        # Episodes of different seeds need different search randomness (the search config's seed),
        # so each seed's trees share one scheduler; every tree of a seed shares its batches.
        by_seed: dict[int, list[int]] = {}
        for k, i in enumerate(active):
            by_seed.setdefault(jobs[i][0].episode.seed, []).append(k)
        for seed, ks in by_seed.items():
            search = SearchConfig(simulations=config.mcts_simulations, k=config.mcts_k,
                                  depth_limit=config.max_steps, max_tokens=config.max_tokens,
                                  critic=config.mcts_critic, alpha=config.mcts_alpha,
                                  rollout_temperature=config.mcts_rollout_temperature,
                                  backup=config.mcts_backup, success_threshold=config.success_threshold, seed=_seed(seed, step),
                                  constrained=config.constrained, value_model=config.mcts_value_model)
            MCTS(generator, search).run([batch[k] for k in ks])
        still = []
        for i in active:
            live, tree, current = jobs[i]
            chosen = tree.best_child(current, config.mcts_alpha)
            e = live.episode
            if chosen is None:
                e.terminal = "no_candidate"
                continue
            best = tree.nodes[chosen]
            live.searched.append((tree, current, best.id))
            go_on = _apply(live, best.raw if best.raw is not None else "", config)
            jobs[i] = (live, tree, best.id)
            if go_on and best.terminal is None:
                still.append(i)
            elif go_on:  # the tree says terminal (depth limit) but the real env goes on: stop here
                e.terminal = best.terminal or "stopped"
        if on_episode is not None:
            for i in set(active) - set(still):
                on_episode(jobs[i][0].episode)
        active = still
    for i in active:
        jobs[i][0].episode.terminal = jobs[i][0].episode.terminal or "max_steps"
        if on_episode is not None:
            on_episode(jobs[i][0].episode)


# ------------------------------------------------------------------ entry points


def run_episodes(generator: Generator, make_env: Callable[[], Env], starts: Sequence[Start],
                 config: EvalConfig, on_episode: OnEpisode | None = None) -> list[Episode]:
    """Episodes for every start and seed, batched (see the module docstring); `on_episode` is told
    each episode as it ends (a loop's evaluation counts them: `episode_count`)."""
    if config.mode == "mcts":
        return _mcts_episodes(generator, make_env, starts, config, on_episode)
    return _policy_episodes(generator, make_env, starts, config, on_episode)


def episode_count(tasks: Sequence[Any], config: EvalConfig) -> int:
    """How many episodes `evaluate` plays on `tasks` (one per task and seed; greedy: one per task)."""
    return len(tasks) * len(config.episode_seeds)


def recovery_starts(samples: Sequence[Any]) -> list[Start]:
    """Starts from Agent-R recovery samples (kind "recovery": the bad prefix through t', with the
    commands that replay it)."""
    out = []
    for s in samples:
        history = []
        for turn in s.turns:
            parsed = parse(turn.text)
            if not isinstance(parsed, FormatError):
                history.append(HistoryStep(parsed, turn.observation or ""))
        task = TaskSpec(id=s.task.id, goal=s.task.goal, context=s.task.context)
        out.append(Start(task=task, commands=tuple(s.source.get("commands", ())), history=tuple(history),
                         label=s.id))
    return out


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    episodes: list[Episode]
    recovery: list[Episode] = field(default_factory=list)
    eval_id: str | None = None


def evaluate(generator: Generator, make_env: Callable[[], Env], tasks: Sequence[TaskSpec], config: EvalConfig,
             recovery: Sequence[Start] = (), on_episode: OnEpisode | None = None) -> EvalResult:
    """Episodes on `tasks` (and on recovery starts, if any) with every metric and interval;
    `on_episode`: told each episode of `tasks` as it ends."""
    episodes = run_episodes(generator, make_env, [Start(t) for t in tasks], config, on_episode)
    metrics = summarize(episodes, config)
    metrics["mode"] = config.mode
    rec: list[Episode] = []
    if recovery:
        rec_config = config if config.mode != "mcts" else EvalConfig(**{**asdict(config), "mode": "greedy"})
        rec = run_episodes(generator, make_env, recovery, rec_config)
        metrics["recovery"] = summarize(rec, config)["success"]
        metrics["recovery_mode"] = rec_config.mode
    return EvalResult(metrics=metrics, episodes=episodes, recovery=rec)


def evaluate_and_store(store: Store, generator: Generator, env_spec: str, split: str, tasks: Sequence[TaskSpec],
                       config: EvalConfig, recovery: Sequence[Start] = (), model: str | None = None,
                       job_id: str | None = None, make_env: Callable[[], Env] | None = None,
                       on_episode: OnEpisode | None = None) -> EvalResult:
    """`evaluate` and record it in the store under `model` (default: the generator's name)."""
    from engine.envs.registry import env_factory

    result = evaluate(generator, make_env or env_factory(env_spec), tasks, config, recovery, on_episode)
    rows = [e.to_dict() for e in result.episodes] + [{**e.to_dict(), "recovery": True} for e in result.recovery]
    result.eval_id = store.save_evaluation(model or generator.name, env_spec, split, [t.id for t in tasks],
                                           config.mode, asdict(config), result.metrics, rows, job_id=job_id)
    return result


def format_metrics(metrics: dict[str, Any]) -> str:
    """One line per headline metric: `success 0.25 [0.10, 0.40] (n=20 tasks)`."""

    def ci(name: str, m: dict[str, float]) -> str:
        return f"{name:<10} {m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"

    lines = [ci("success", metrics["success"]), ci("progress", metrics["progress"]), ci("loop rate", metrics["loop_rate"])]
    if "recovery" in metrics:
        lines.append(ci("recovery", metrics["recovery"]))
    lines.append(f"episodes {metrics['episodes']} on {metrics['tasks']} tasks, mean steps {metrics['mean_steps']:.2f}, "
                 f"format errors {metrics['format_error_rate']:.3f} per step")
    return "\n".join(lines)


@dataclass(frozen=True)
class EvalJob:
    """An evaluation: `model` on `tasks` of `env`'s `split` ("" or None: the whole split; "train" /
    "test" name a split) with `eval`'s settings, and optionally recovery starts from `recovery_runs`'
    recovery samples. An eval job's JSON is these fields, read by engine.config.from_dict."""

    model: str
    env: str = "textcraft"
    split: str = "test"
    tasks: str | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    recovery_runs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise ConfigError(f"eval job: field 'model' must be a non-empty string, got {self.model!r}")

    def check(self) -> None:
        eval_tasks(self)


def run_eval(store: Store, spec: EvalJob, log: Callable[[str], None] = print, job_id: str | None = None,
             selection: tuple[str, Callable[[], Env], str, list[TaskSpec]] | None = None,
             wrap: Callable[[Any], Any] | None = None) -> str:
    """Evaluate per an eval job's spec; returns the evaluation id. Used by `orchard eval` and by the
    job worker (`run_eval_job`). `selection`: `eval_tasks(spec)` when the caller has it already;
    `wrap`: applied to the loaded generator (a job's progress and cancel: `CountedGenerator`)."""
    from engine.llm.registry import load_generator

    config = spec.eval
    env_spec, make_env, split, tasks = selection or eval_tasks(spec)
    recovery = []
    for run in spec.recovery_runs:
        recovery.extend(recovery_starts(store.samples(run_id=store.find_run(run), kind="recovery")))
    generator = load_generator(spec.model, log=log)
    if wrap is not None:
        generator = wrap(generator)
    result = evaluate_and_store(store, generator, env_spec, split, tasks, config, recovery=recovery,
                                model=spec.model, job_id=job_id, make_env=make_env)
    log(f"evaluation {result.eval_id}: {spec.model} on {len(tasks)} {split} tasks, mode {config.mode}\n"
        + format_metrics(result.metrics))
    return str(result.eval_id)


def eval_tasks(spec: EvalJob) -> tuple[str, Callable[[], Env], str, list[TaskSpec]]:
    """(env spec, env factory, split, tasks) of an eval job; EnvError for a bad selection."""
    from engine.envs.registry import env_factory, select_tasks

    env_spec = spec.env or "textcraft"
    make_env = env_factory(env_spec)
    env = make_env()
    split, tasks_spec = spec.split or "test", spec.tasks or ""
    if tasks_spec in ("train", "test"):
        split, tasks_spec = tasks_spec, ""
    tasks = select_tasks(env, tasks_spec, split) if tasks_spec else env.tasks(split)
    return env_spec, make_env, split, tasks


class CountedGenerator:
    """A Generator whose batched calls are an evaluation's units: progress after each, and a cancel
    honoured before the next (an eval job's `Cancelled`). With policy modes one call advances every
    episode one step, so the total is the step budget; MCTS makes many calls per step (no total)."""

    def __init__(self, inner: Any, units: Units) -> None:
        self.inner, self.units, self.name = inner, units, inner.name

    def sample(self, requests: Any) -> Any:
        self.units.check()
        out = self.inner.sample(requests)
        self.units.step()
        return out

    def logprobs(self, prompts: Any, completions: Any) -> Any:
        return self.inner.logprobs(prompts, completions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_eval_job(store: Store, spec: EvalJob, reporter: Reporter, job_id: str | None = None) -> str:
    """An eval job: `run_eval` with its generator counted (progress, cancel at the next model call);
    returns the evaluation id."""
    mode = spec.eval.mode
    if mode == "mcts":
        units = Units(reporter, "evaluate (mcts): model calls", 0)
    else:
        steps = spec.eval.max_steps * (2 if spec.recovery_runs else 1)
        units = Units(reporter, f"evaluate ({mode}): steps", steps)
    eval_id = run_eval(store, spec, log=reporter.log, job_id=job_id,
                       wrap=lambda generator: CountedGenerator(generator, units))
    units.finish()
    return eval_id
