"""Steering a stored tree from where a person looks at it (issue 28; docs/decisions.md "Steering the
search from the tree"): a human branch, "search here" and "more candidates".

All three grow the SAME tree through the MCTS of engine/search/mcts.py, one committed simulation at
a time (`Store.save_simulation`), so every invariant the search keeps holds on the grown tree:

- a human branch (`HumanBranch`): the typed command or composite action goes through the parser
  every completion goes through (`engine.actions.parse`), the env is restored at the node (replay
  of the path's commands from reset, then the session's snapshots where the env takes them) and
  stepped by `MCTS.step_child`, as an expansion's candidate is; the child is `author="human"`, and
  one simulation rolls out from it and backs its value up through every ancestor (eq. 8);
- "search here" (`SearchHere`): N simulations whose selection starts at the node (`TreeJob.start`);
  each one's path still runs from the root, so the ancestors' and the root's visits count it;
- "more candidates" (`MoreCandidates`): one simulation that expands the node again (`TreeJob.expand_at`):
  K more proposals, a repeat of an existing child dropped, the critic ranking the old and the new
  candidates together (the older siblings' new ranks are written with the simulation).

Bad input is one line naming what and where (the run, task and node), and nothing is stored: the
action is parsed and the env stepped before the model is loaded, and a node is committed only with
its simulation. While one of these runs, the run's status is `running` (the dashboard follows it
live; a second writer is refused), then back to what it was.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.actions import CompositeAction, FormatError, normalize_command, parse
from engine.config import ConfigError, SearchConfig, from_dict
from engine.errors import UsageError
from engine.progress import Reporter, StageResult, Units

if TYPE_CHECKING:
    from engine.envs.base import Env
    from engine.llm.base import Generator
    from engine.search.mcts import TreeJob
    from engine.store import RunInfo, Store
    from engine.tree_nodes import SearchTree

MAX_ACTION_CHARS = 4000  # a typed composite action; its command is limited by engine.actions
MAX_STEER_SIMULATIONS = 10_000
_HEADER = re.compile(r"^\s*[#>*_\-\s]*(plan|thoughts?|action|command|explanation|status)\b[^:\n]*:",
                     re.IGNORECASE | re.MULTILINE)


def _node_field(kind: str, at: int) -> None:
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise ConfigError(f"{kind} job: field 'at' must be a node id >= 0, got {at!r}")


def _text(kind: str, name: str, value: str | None) -> None:
    if value is not None and not value.strip():
        raise ConfigError(f"{kind} job: field {name!r} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class HumanBranch:
    """Add `action` (a command, or a whole composite action) as a human-authored child of node `at`
    of `run`'s tree for `task`, and roll it out once by `model` (default: the run's own)."""

    run: str
    task: str
    at: int
    action: str
    model: str | None = None
    allow_http_key: bool | None = None

    def __post_init__(self) -> None:
        for name in ("run", "task", "action", "model"):
            _text("add_action", name, getattr(self, name))
        _node_field("add_action", self.at)
        if len(self.action) > MAX_ACTION_CHARS:
            raise ConfigError(f"add_action job: field 'action' is {len(self.action)} characters "
                              f"(limit {MAX_ACTION_CHARS})")


@dataclass(frozen=True)
class SearchHere:
    """`simulations` more simulations of `run`'s tree for `task`, their selection starting at node `at`."""

    run: str
    task: str
    at: int
    simulations: int = 8
    model: str | None = None
    allow_http_key: bool | None = None

    def __post_init__(self) -> None:
        for name in ("run", "task", "model"):
            _text("search_here", name, getattr(self, name))
        _node_field("search_here", self.at)
        if not 1 <= self.simulations <= MAX_STEER_SIMULATIONS:
            raise ConfigError(f"search_here job: field 'simulations' must be 1..{MAX_STEER_SIMULATIONS}, "
                              f"got {self.simulations}")


@dataclass(frozen=True)
class MoreCandidates:
    """`k` more proposals of the policy at node `at` (default: the run's K), ranked by the critic with
    the node's other children, then one simulation rolled out from the best unvisited one."""

    run: str
    task: str
    at: int
    k: int | None = None
    model: str | None = None
    allow_http_key: bool | None = None

    def __post_init__(self) -> None:
        for name in ("run", "task", "model"):
            _text("more_candidates", name, getattr(self, name))
        _node_field("more_candidates", self.at)
        if self.k is not None and not 1 <= self.k <= 64:
            raise ConfigError(f"more_candidates job: field 'k' must be 1..64, got {self.k}")


Steer = HumanBranch | SearchHere | MoreCandidates


@dataclass
class Target:
    """A stored tree opened at one node, with the run's settings."""

    run_id: str
    info: RunInfo
    config: SearchConfig
    tree_id: int
    tree: SearchTree
    node: int
    where: str  # "run R task T node N", the start of every error about it


def open_target(store: Store, run: str, task: str, at: int) -> Target:
    """The committed tree of `run` (id, prefix or name) for `task`, checked to hold node `at`."""
    run_id = store.find_run(run)
    info = store.run(run_id)
    tree_id = store.tree_id(run_id, task)
    where = f"run {run_id} task {task} node {at}"
    tree = store.load_tree(tree_id)
    if tree is None:
        raise UsageError(f"{where}: the tree has no committed nodes yet (search the run first)")
    if not 0 <= at < len(tree.nodes):
        raise UsageError(f"{where}: no such node (ids 0..{len(tree.nodes) - 1})")
    config = from_dict(SearchConfig, info.config, where=f"run {run_id} config")
    return Target(run_id, info, config, tree_id, tree, at, where)


def human_action(text: str, where: str) -> CompositeAction:
    """A typed command (one line) or composite action (PLAN/THOUGHT/ACTION/EXPLANATION/STATUS), read by
    the parser the policy's completions go through; UsageError (one line) when it cannot be read."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: the action is empty (type a command, or a composite action with ACTION:)")
    body = text.strip()
    if _HEADER.search(body) is None:  # a bare command: the ACTION of a composite action
        if "\n" in body:
            raise UsageError(f"{where}: a command is one line (or write a composite action with ACTION:)")
        body = f"ACTION: {body}"
    parsed = parse(body)
    if isinstance(parsed, FormatError):
        raise UsageError(f"{where}: action {text.strip()[:60]!r} cannot be read: {parsed.reason}")
    return parsed


def _busy(target: Target) -> UsageError:
    return UsageError(f"{target.where}: the run is being searched now (status running); steer it when "
                      f"that search has ended (or `orchard search --resume {target.run_id}` once it was killed)")


def _check_idle(target: Target) -> None:
    if target.info.status == "running":
        raise _busy(target)


def _check_open(target: Target) -> None:
    node = target.tree.nodes[target.node]
    if node.terminal is not None:
        raise UsageError(f"{target.where}: the node is terminal ({node.terminal}); nothing grows below it")


def _job(target: Target, make_env: Callable[[], Env] | None) -> TreeJob:
    """The tree as an MCTS job with its own env session (replay from reset, then snapshots)."""
    from engine.envs.registry import env_factory
    from engine.search.mcts import EnvSession, TreeJob

    make_env = make_env or env_factory(target.info.env)
    env = make_env()
    return TreeJob(tree=target.tree, make_env=make_env, env_description=env.describe(),
                   target=len(target.tree.simulations), tree_id=target.tree_id,
                   committed_nodes=len(target.tree.nodes), session=EnvSession(env, target.tree.task.id))


def _step_human(target: Target, job: TreeJob, action: CompositeAction, text: str) -> int:
    """Restore the env at the node and take the human step; the child (not yet stored) is returned."""
    from engine.envs.base import EnvError
    from engine.search.mcts import MCTS

    node = target.tree.nodes[target.node]
    for c in node.children:  # the same command twice would split one state's visits between two nodes
        other = target.tree.nodes[c].action
        if other is not None and normalize_command(other.command) == normalize_command(action.command):
            raise UsageError(f"{target.where}: the node already has the child {c} for {action.command[:60]!r} "
                             "(select it, or search there)")
    mcts = MCTS(_NoModel(), target.config, rounds=True)
    try:
        child = mcts.step_child(job, node, action, raw=text, author="human")
    except EnvError as e:
        raise EnvError(f"{target.where}: the env refused {action.command[:60]!r}: {' '.join(str(e).split())}") from None
    except Exception as e:  # noqa: BLE001 - an env plugin's own error, told in one line
        raise EnvError(f"{target.where}: the env failed on {action.command[:60]!r}: "
                       f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    return child.id


class _NoModel:
    """The generator of an MCTS that only steps the env (a human branch's step): never asked."""

    name = "none"

    def sample(self, requests: Any) -> Any:
        raise AssertionError("a human step asks no model")

    def logprobs(self, prompts: Any, completions: Any) -> Any:
        raise AssertionError("a human step asks no model")


def probe_action(store: Store, spec: HumanBranch, make_env: Callable[[], Env] | None = None) -> str:
    """Everything a human branch checks before a model is loaded (the run, task and node, the action
    read, the env restored and stepped), nothing stored; returns the observation the step gave."""
    target = open_target(store, spec.run, spec.task, spec.at)
    _check_idle(target)
    _check_open(target)
    action = human_action(spec.action, target.where)
    job = _job(target, make_env)
    try:
        child = _step_human(target, job, action, spec.action)
        return target.tree.nodes[child].observation
    finally:
        job.close()


def check_steer(store: Store, spec: Steer, make_env: Callable[[], Env] | None = None) -> None:
    """The checks a steering job's submission makes (nothing stored, no model loaded)."""
    if isinstance(spec, HumanBranch):
        probe_action(store, spec, make_env)
        return
    target = open_target(store, spec.run, spec.task, spec.at)
    _check_idle(target)
    _check_open(target)


def generator_for(target: Target, spec: Steer, reporter: Reporter) -> Generator:
    """The spec's model, else the run's own. A stored openai: spec comes from the database, not from
    the person asking: $OPENAI_API_KEY goes to its URL only when the spec is typed again (as
    `orchard search --resume` asks)."""
    from engine.llm.registry import load_generator, parse_model_spec

    if spec.model is None and parse_model_spec(target.info.model).kind == "openai" and os.environ.get("OPENAI_API_KEY"):
        raise UsageError(f"{target.where}: the run's model URL comes from the database; name the model again "
                         "(--model, or the form's Model field) to send $OPENAI_API_KEY there")
    return load_generator(spec.model or target.info.model, log=reporter.log, allow_http_key=spec.allow_http_key)


def run_steer(store: Store, spec: Steer, reporter: Reporter, generator: Generator | None = None,
              make_env: Callable[[], Env] | None = None) -> StageResult:
    """Grow the stored tree as `spec` asks; returns the run id (output) and a line saying what was done."""

    from engine.envs.registry import env_factory

    target = open_target(store, spec.run, spec.task, spec.at)
    _check_idle(target)
    _check_open(target)
    make_env = make_env or env_factory(target.info.env)  # an env this machine lacks fails before the claim
    previous = store.claim_run(target.run_id)  # now, not after the model loads: a second writer is refused
    if previous is None:
        raise _busy(target)
    try:
        target = open_target(store, spec.run, spec.task, spec.at)  # with what another steer committed meanwhile
        _check_open(target)
        return _grow(store, target, spec, reporter, generator, make_env)
    finally:
        store.set_run_status(target.run_id, previous)


def _grow(store: Store, target: Target, spec: Steer, reporter: Reporter, generator: Generator | None,
          make_env: Callable[[], Env] | None) -> StageResult:
    """`run_steer`'s work, on a run it has claimed."""
    from engine.search.mcts import MCTS
    from engine.tree_nodes import Simulation

    tree, config = target.tree, target.config
    first_new = len(tree.nodes)
    job = _job(target, make_env)
    try:
        if isinstance(spec, HumanBranch):
            action = human_action(spec.action, target.where)
            job.pending = _step_human(target, job, action, spec.action)
            count, phase = 1, f"add branch at node {target.node}"
        elif isinstance(spec, SearchHere):
            job.start, count, phase = target.node, spec.simulations, f"search at node {target.node}"
        else:
            job.expand_at, count, phase = target.node, 1, f"more candidates at node {target.node}"
            if spec.k is not None:
                config = replace(config, k=spec.k)
        job.target = len(tree.simulations) + count
        model = generator or generator_for(target, spec, reporter)
        units = Units(reporter, phase, count, run_id=target.run_id, task=tree.task.id, node=target.node)

        def on_simulation(j: TreeJob, sim: Simulation) -> None:
            store.save_simulation(target.tree_id, j.tree, sim, j.committed_nodes, j.reranked)
            j.reranked = []
            units.step(nodes=len(j.tree.nodes) - first_new)

        stats = MCTS(model, config, on_simulation=on_simulation).run([job])
        units.finish()
    finally:
        job.close()
    new = len(tree.nodes) - first_new
    what = (f"human branch node {first_new}" if isinstance(spec, HumanBranch)
            else f"{stats.simulations} simulations at node {target.node}" if isinstance(spec, SearchHere)
            else f"{sum(1 for n in tree.nodes[first_new:] if n.parent == target.node)} more candidates")
    line = (f"{target.where}: {what}, {new} new nodes, tree now {len(tree.nodes)} nodes / "
            f"{len(tree.simulations)} simulations; db {store.path}")
    return StageResult(target.run_id, [line])
