"""MCTS with AI process supervision (Agent Q, arXiv 2408.07199) over many trees at once
(docs/algorithms.md §2).

Each tree's simulation is a coroutine that yields the LLM requests it needs (expansion: K samples;
critic: one ranking question per round; rollout: one action per step) and receives completions.
Two schedulers drive them (docs/decisions.md "No round barrier for backends that serve requests
independently"): for a batched backend (HF) every tree in flight advances by one such step per round
and ALL their requests go to the Generator as ONE batched call, so the model always sees large
batches; for a backend with `submit` (an HTTP server with continuous batching) each request goes out
as soon as its tree needs it and that tree advances when ITS completions arrive, so the slowest
completion of a round holds no other tree. A tree's growth depends only on its own completions
(per-request seeds), so both give the same trees from a per-request-seeded model. Env restore uses
snapshot/restore where the env offers it, replay from reset otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import math
import queue
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Generator as Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from engine.actions import CompositeAction, FormatError, normalize_command, parse
from engine.config import SearchConfig
from engine.envs.base import Env, Step, SupportsSnapshot, TaskSpec, checked_step, close_env, env_label
from engine.grammar import ActionGrammar, grammar_for
from engine.llm.base import Completion, Generator, GeneratorError, SampleRequest, SamplingParams
from engine.prompts import HistoryStep, actor_prompt
from engine.search.critic import rank_candidates, rank_to_score
from engine.search.value_critic import value_critic
from engine.tree_nodes import Node, SearchTree, Simulation

Requests = list[SampleRequest]
Replies = list[list[Completion]]


def ucb_score(child: Node, parent_visits: int, c_exp: float, value: float) -> float:
    """Eq. 7: Q(h,a) + c_exp * sqrt(ln N(h) / (1 + N(h,a)))."""
    explore = math.sqrt(math.log(parent_visits) / (1 + child.N)) if parent_visits > 0 else 0.0
    return value + c_exp * explore


def select_child(tree: SearchTree, node: Node, config: SearchConfig) -> Node:
    """UCB1 choice among `node`'s children; unvisited children first, ties by critic score."""
    children = [tree.nodes[c] for c in node.children]
    unvisited = [c for c in children if c.N == 0]
    if unvisited:
        # max() keeps the first of equals, so sampling order breaks remaining ties
        return max(unvisited, key=lambda c: c.Q_critic if c.Q_critic is not None else -1.0)
    parent_visits = sum(c.N for c in children)  # N(h) as docs/algorithms.md §2.1 defines it
    alpha = config.alpha if config.selection_value == "combined" else 1.0
    return max(children, key=lambda c: ucb_score(c, parent_visits, config.c_exp, c.value(alpha)))


def request_seed(run_seed: int, *parts: Any) -> int:
    """A stable per-request seed (never Python's salted hash), so a run replays exactly."""
    return zlib.crc32(repr((run_seed, *parts)).encode()) & 0x7FFFFFFF


class EnvSession:
    """One env instance bound to one tree: moves the env to any node's state."""

    def __init__(self, env: Env, task_id: str) -> None:
        self.env = env
        self.task_id = task_id
        self.snapshots: dict[int, Any] | None = {} if isinstance(env, SupportsSnapshot) else None
        self.current: int | None = None
        self.depth = 0  # steps from the task's start to the env's current state
        self.replays = 0
        self.restores = 0
        self.env_s = 0.0
        self.step_s = 0.0  # the last step's time (a node's env_ms)
        self.label = env_label(env)  # named in a bad step's error; looked up once, not per step

    def reset(self) -> str:
        t = time.perf_counter()
        obs = self.env.reset(self.task_id)
        self.current, self.depth = 0, 0
        if self.snapshots is not None:
            self.snapshots[0] = self.env.snapshot()  # type: ignore[attr-defined]
        self.env_s += time.perf_counter() - t
        return obs

    def goto(self, tree: SearchTree, node: Node) -> None:
        if self.current == node.id:
            return
        t = time.perf_counter()
        if self.snapshots is not None and node.id in self.snapshots:
            self.env.restore(self.snapshots[node.id])  # type: ignore[attr-defined]
            self.restores += 1
        else:
            self.env.reset(self.task_id)
            for command in tree.commands(node):
                self.env.step(command)
            self.replays += 1
            if self.snapshots is not None:
                self.snapshots[node.id] = self.env.snapshot()  # type: ignore[attr-defined]
        self.current, self.depth = node.id, node.depth
        self.env_s += time.perf_counter() - t

    def step(self, command: str) -> Step:
        """One env step, its reward and progress validated (`checked_step`: a NaN is a clear error)."""
        t = time.perf_counter()
        out = self.env.step(command)
        self.step_s = time.perf_counter() - t
        self.current = None
        self.depth += 1
        self.env_s += self.step_s
        return checked_step(out, self.label, self.task_id, self.depth, command)

    def screenshot(self) -> bytes | None:
        """An image of the env's current state, where the env can take one (the web env: a JPEG)."""
        take = getattr(self.env, "screenshot", None)
        if not callable(take):
            return None
        t = time.perf_counter()
        image = take()
        self.env_s += time.perf_counter() - t
        return image if isinstance(image, bytes) else None

    def close(self) -> None:
        """Close the env and drop the snapshots (the tree is done or the run failed)."""
        self.snapshots = {} if self.snapshots is not None else None
        self.current = None
        close_env(self.env)

    def arrived(self, node: Node) -> None:
        """The env now holds `node`'s state (just stepped into it): remember it."""
        self.current = node.id
        if self.snapshots is not None:
            t = time.perf_counter()
            self.snapshots[node.id] = self.env.snapshot()  # type: ignore[attr-defined]
            self.env_s += time.perf_counter() - t


@dataclass
class TreeJob:
    """A tree to grow to `target` simulations, with what it needs to act."""

    tree: SearchTree
    make_env: Callable[[], Env]
    env_description: str
    target: int
    tree_id: int | None = None  # the store's id
    committed_nodes: int = 0  # nodes[:committed_nodes] are in the store
    session: EnvSession | None = None
    share_ms: float = 0.0  # per-completion share of the last generation call
    grammar: ActionGrammar | None = None  # the task's, on a constrained run's first actor request
    # Steering from the tree (engine/search/steer.py; docs/decisions.md "Steering the search from the tree"):
    start: int = 0  # selection starts here ("search here"); its path from the root is backed up too
    pending: int | None = None  # a child added outside the policy (a human branch): the next simulation rolls out from it
    expand_at: int | None = None  # the next simulation expands this node again ("more candidates")
    reranked: list[int] = field(default_factory=list)  # older nodes whose critic ranks the last expansion rewrote

    @property
    def remaining(self) -> int:
        return self.target - len(self.tree.simulations)

    def close(self) -> None:
        """Close the session's env, if any (idempotent: the session is dropped)."""
        session, self.session = self.session, None
        if session is not None:
            session.close()


@dataclass(slots=True)
class _Wait:
    """A tree waiting for the completions of the requests it yielded (no-barrier scheduler)."""

    job: TreeJob
    coro: Coroutine[Requests, Replies, Simulation]
    replies: Replies
    left: int
    t0: float


@dataclass
class SearchStats:
    simulations: int = 0
    rounds: int = 0
    requests: int = 0
    completions: int = 0
    critic_fallbacks: int = 0
    replays: int = 0
    restores: int = 0
    gen_s: float = 0.0
    env_s: float = 0.0
    commit_s: float = 0.0
    critic_s: float = 0.0  # the value critic's forward passes (no generator request)
    writer_s: float = 0.0  # commits on the run's commit thread (runner writer="thread"): not on the search's
    wall_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def engine_s(self) -> float:
        """Wall time spent neither generating, stepping envs nor committing: search overhead."""
        return max(self.wall_s - self.gen_s - self.env_s - self.commit_s - self.critic_s, 0.0)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "batch_sizes"}
        d["engine_s"] = self.engine_s
        d["mean_batch"] = sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0
        return d


def start_tree(task: TaskSpec, make_env: Callable[[], Env], target: int) -> TreeJob:
    """A new tree for `task`: resets a fresh env for the root observation (the job owns the env:
    `job.close()`; closed here if the reset fails)."""
    env = make_env()
    session = EnvSession(env, task.id)
    try:
        tree = SearchTree.new(task, session.reset())
    except BaseException:
        session.close()
        raise
    return TreeJob(tree=tree, make_env=make_env, env_description=env.describe(), target=target, session=session)


class MCTS:
    """Runs simulations on many trees: one batched generator call per round, or (a generator with
    `submit`) each request on its own with no round barrier."""

    def __init__(
        self,
        generator: Generator,
        config: SearchConfig,
        on_simulation: Callable[[TreeJob, Simulation], None] | None = None,
        on_tree_done: Callable[[TreeJob], None] | None = None,
        rounds: bool | None = None,
        on_batch: Callable[[], None] | None = None,
    ) -> None:
        """`rounds`: True forces the round-barrier scheduler, False needs a generator with `submit`;
        None (default) uses `submit` where the generator has it. `on_batch`: called after the scheduler
        has handed out one batch of replies (a round, or what landed together) and once at the end, also
        after a failure: the point where the simulations `on_simulation` saw since the last call can
        be committed together."""
        self.generator = generator
        submit = getattr(generator, "submit", None)
        if rounds is False and not callable(submit):
            raise GeneratorError(f"generator {getattr(generator, 'name', generator)!r} has no submit()")
        self.submit = submit if callable(submit) and not rounds else None
        self.config = config
        self.on_simulation = on_simulation
        self.on_tree_done = on_tree_done
        self.on_batch = on_batch
        self.stats = SearchStats()

    # --- scheduler ---------------------------------------------------------------------------

    def run(self, jobs: Iterable[TreeJob]) -> SearchStats:
        if self.submit is not None:
            return self._run_streaming(jobs, self.submit)
        return self._run_rounds(jobs)

    def _run_streaming(self, jobs: Iterable[TreeJob], submit: Callable[..., Future]) -> SearchStats:
        """No round barrier: a tree's requests go out when it yields them; it advances when they land.
        A backend this thread can drive (`SupportsDriven`) runs its I/O here, between batches: the
        answers land on this thread, with no hand-off per request."""
        driven = getattr(self.generator, "driven", None)
        with driven() if callable(driven) else contextlib.nullcontext() as driver:
            return self._stream(jobs, submit, driver)

    def _stream(self, jobs: Iterable[TreeJob], submit: Callable[..., Future], driver: Any) -> SearchStats:
        cfg, stats = self.config, self.stats
        t_start = time.perf_counter()
        waiting = deque(j for j in jobs if j.remaining > 0)
        landed: queue.SimpleQueue[tuple[_Wait, int, Any, BaseException | None]] = queue.SimpleQueue()
        here: deque[tuple[_Wait, int, Any, BaseException | None]] = deque()  # what landed on this thread (driven)
        put = here.append if driver is not None else landed.put
        started: list[TreeJob] = []
        in_flight = 0  # trees waiting for completions

        def advance(job: TreeJob, coro, reply: Replies | None) -> None:
            nonlocal in_flight
            while True:
                try:
                    requests = coro.send(reply) if reply is not None else next(coro)
                except StopIteration as done:
                    reply, coro = None, self._next_simulation(job, done.value)
                    if coro is None:
                        return
                    continue
                if not requests:  # nothing to wait for (as a round with no requests gives)
                    reply = []
                    continue
                t = time.perf_counter()
                w = _Wait(job, coro, [None] * len(requests), len(requests), t)  # type: ignore[list-item]
                key = job.tree.task.id
                for i, request in enumerate(requests):
                    submit(request, affinity=key).add_done_callback(functools.partial(_landed, put, w, i))
                stats.gen_s += time.perf_counter() - t  # time in the backend, as `sample` in rounds
                stats.requests += len(requests)
                in_flight += 1
                return

        try:
            while waiting or in_flight:
                while waiting and in_flight < cfg.trees_in_flight:
                    job = waiting.popleft()
                    started.append(job)
                    if job.session is None:
                        job.session = EnvSession(job.make_env(), job.tree.task.id)
                    advance(job, self._simulate(job), None)
                if not in_flight:
                    continue
                t = time.perf_counter()
                if driver is not None:
                    driver.wait(here.__len__)  # this thread runs the I/O until something landed
                    items = list(here)
                    here.clear()
                else:
                    items = [landed.get()]
                    while not landed.empty():  # everything that landed meanwhile
                        items.append(landed.get_nowait())
                now = time.perf_counter()
                stats.gen_s += now - t
                stats.rounds += 1
                stats.batch_sizes.append(len(items))
                for w, i, result, error in items:
                    if error is not None:  # a failed request
                        raise error
                    w.replies[i] = result
                    w.left -= 1
                    if w.left:
                        continue
                    in_flight -= 1
                    n_completions = len(w.replies[0]) if len(w.replies) == 1 else sum(map(len, w.replies))
                    stats.completions += n_completions
                    w.job.share_ms = 1000.0 * (now - w.t0) / max(n_completions, 1)
                    advance(w.job, w.coro, w.replies)
                if driver is not None:
                    t = time.perf_counter()
                    driver.send()  # the new requests go out before the commit, not after it
                    stats.gen_s += time.perf_counter() - t
                self._end_batch()
        finally:
            self._end_batch()
            for job in started:  # only after a failure: a finished tree's env was closed already
                if job.session is not None:
                    self._collect(job)
                    job.close()
            stats.wall_s += time.perf_counter() - t_start
        return stats

    def _run_rounds(self, jobs: Iterable[TreeJob]) -> SearchStats:
        """Round barrier: every tree in flight advances one step per ONE batched generator call."""
        cfg, stats = self.config, self.stats
        t_start = time.perf_counter()
        waiting = deque(j for j in jobs if j.remaining > 0)
        active: list[tuple[TreeJob, Coroutine[Requests, Replies, Simulation], Requests]] = []
        started: list[TreeJob] = []

        def advance(job: TreeJob, coro, reply: Replies | None) -> None:
            """Drive `coro` to its next request, finishing (and starting) simulations as they end."""
            while True:
                try:
                    requests = coro.send(reply) if reply is not None else next(coro)
                    active.append((job, coro, requests))
                    return
                except StopIteration as done:
                    reply, coro = None, self._next_simulation(job, done.value)
                    if coro is None:
                        return

        try:
            while waiting or active:
                while waiting and len(active) < cfg.trees_in_flight:
                    job = waiting.popleft()
                    started.append(job)
                    if job.session is None:
                        job.session = EnvSession(job.make_env(), job.tree.task.id)
                    advance(job, self._simulate(job), None)
                if not active:
                    continue
                batch = [r for _, _, reqs in active for r in reqs]
                t = time.perf_counter()
                replies = self.generator.sample(batch)
                dt = time.perf_counter() - t
                if len(replies) != len(batch):
                    raise GeneratorError(f"generator returned {len(replies)} results for {len(batch)} requests")
                n_completions = sum(len(r) for r in replies)
                stats.gen_s += dt
                stats.rounds += 1
                stats.requests += len(batch)
                stats.completions += n_completions
                stats.batch_sizes.append(n_completions)
                share = 1000.0 * dt / max(n_completions, 1)
                current, active[:] = list(active), []
                offset = 0
                for job, coro, reqs in current:
                    reply = replies[offset : offset + len(reqs)]
                    offset += len(reqs)
                    job.share_ms = share
                    advance(job, coro, reply)
                self._end_batch()
        finally:
            self._end_batch()
            for job in started:  # only after a failure: a finished tree's env was closed already
                if job.session is not None:
                    self._collect(job)
                    job.close()
            stats.wall_s += time.perf_counter() - t_start
        return stats

    def _next_simulation(self, job: TreeJob, sim: Simulation) -> Coroutine[Requests, Replies, Simulation] | None:
        """`sim` has ended: record it, then the tree's next simulation, or None (closed) at its target.
        Both schedulers call it, so they finish and start simulations alike."""
        self._finish(job, sim)
        if job.remaining <= 0:
            self._close(job)
            return None
        return self._simulate(job)

    def _finish(self, job: TreeJob, sim: Simulation) -> None:
        self.stats.simulations += 1
        if self.on_simulation is not None:
            t = time.perf_counter()
            self.on_simulation(job, sim)
            self.stats.commit_s += time.perf_counter() - t
        job.committed_nodes = len(job.tree.nodes)

    def _end_batch(self) -> None:
        if self.on_batch is not None:
            t = time.perf_counter()
            self.on_batch()
            self.stats.commit_s += time.perf_counter() - t

    def _collect(self, job: TreeJob) -> None:
        s = job.session
        if s is not None:
            self.stats.env_s += s.env_s
            self.stats.replays += s.replays
            self.stats.restores += s.restores
            s.env_s, s.replays, s.restores = 0.0, 0, 0

    def _close(self, job: TreeJob) -> None:
        self._collect(job)
        job.close()  # release the env (and its snapshots)
        if self.on_tree_done is not None:
            self.on_tree_done(job)

    # --- one simulation ----------------------------------------------------------------------

    def _simulate(self, job: TreeJob) -> Coroutine[Requests, Replies, Simulation]:
        tree, cfg = job.tree, self.config
        node = tree.nodes[job.start]
        path = [n.id for n in tree.path(node)]  # the start's ancestors count this simulation too (eq. 8)
        if job.pending is not None:  # a child added from outside the policy: rolled out like a new expansion's
            node, job.pending = tree.nodes[job.pending], None
            path = [n.id for n in tree.path(node)]
        elif job.expand_at is not None:  # more candidates at a node that has some already
            node, job.expand_at = tree.nodes[job.expand_at], None
            path = [n.id for n in tree.path(node)]
            yield from self._expand(job, node)
            node = select_child(tree, node, cfg)
            path.append(node.id)
        else:
            while node.children and node.terminal is None:  # selection
                node = select_child(tree, node, cfg)
                path.append(node.id)
            if node.terminal is None:
                yield from self._expand(job, node)
                node = select_child(tree, node, cfg)
                path.append(node.id)
        rollout: tuple[str, ...] = ()
        turns: tuple[tuple[str, str], ...] = ()
        if node.terminal is not None:
            reward = self._value(node.reward, node.progress)
        else:
            reward, rollout, turns = yield from self._rollout(job, node)
        tree.backpropagate(path, reward)
        sim = Simulation(tuple(path), reward, rollout, turns)
        tree.simulations.append(sim)
        return sim

    def _params(self, job: TreeJob, temperature: float, max_tokens: int, *key: Any) -> SamplingParams:
        seed = request_seed(self.config.seed, job.tree.task.id, len(job.tree.simulations), *key)
        return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)

    def _actor_params(self, job: TreeJob, temperature: float, *key: Any) -> SamplingParams:
        """An actor request's settings: under the task's grammar when the run is `constrained`."""
        params = self._params(job, temperature, self.config.max_tokens, *key)
        if not self.config.constrained:
            return params
        if job.grammar is None:
            assert job.session is not None
            job.grammar = grammar_for(job.session.env, job.tree.task)
        return replace(params, grammar=job.grammar)

    def _value(self, reward: float | None, progress: float | None) -> float:
        """The value an episode that ended here backs up (config `backup`)."""
        if self.config.backup == "progress":
            return max(reward or 0.0, progress or 0.0)
        return reward or 0.0

    def _terminal(self, step: Step, action: CompositeAction, depth: int) -> str | None:
        if step.done:
            return "success" if step.reward >= self.config.success_threshold else "failure"
        if action.status != "CONTINUE":
            return "stopped"
        if depth >= self.config.depth_limit:
            return "depth_limit"
        return None

    def step_child(self, job: TreeJob, node: Node, action: CompositeAction, **fields: Any) -> Node:
        """Restore the env at `node`, take `action`'s step and add the child it leads to (`fields`:
        the proposal's own, e.g. raw text and log-prob, or author="human"). Every expansion's
        candidates and a human branch (engine/search/steer.py) come in through here."""
        tree, session = job.tree, job.session
        assert session is not None
        session.goto(tree, node)
        step = session.step(action.command)
        env_ms = 1000.0 * session.step_s
        terminal = self._terminal(step, action, node.depth + 1)
        # Every terminal node keeps a picture of its final state where the env takes one: the
        # env's own at episode end, else one taken now (a STOP or depth-limit leaf's page).
        screenshot = step.info.get("screenshot") if step.done else None
        if terminal is not None and screenshot is None:
            screenshot = session.screenshot()
        child = tree.add_child(
            node,
            observation=step.observation,
            action=action,
            reward=step.reward,
            progress=step.progress,
            terminal=terminal,
            env_ms=env_ms,
            screenshot=screenshot,
            **fields,
        )
        session.arrived(child)
        return child

    def _expand(self, job: TreeJob, node: Node) -> Coroutine[Requests, Replies, None]:
        tree, cfg, session = job.tree, self.config, job.session
        assert session is not None
        task = tree.task
        history = tree.history(node)
        prompt = actor_prompt(job.env_description, task.goal, task.context, history, node.observation)
        params = self._actor_params(job, cfg.temperature, "expand", node.id)
        (completions,) = yield [SampleRequest(prompt, cfg.k, params)]
        share = job.share_ms
        if not completions:  # a backend that answered nothing still yields a visible node
            completions = [Completion(text="", finish_reason="error")]
        # A node expanded again ("more candidates") keeps its children: a proposal repeating one is
        # dropped, and the critic ranks the old and the new candidates together (ranks stay 0..K-1).
        older = [tree.nodes[c] for c in node.children]
        valid: list[Node] = [n for n in older if not n.format_error and n.action is not None]
        actions: list[CompositeAction] = [n.action for n in valid if n.action is not None]
        errors: list[Node] = [n for n in older if n.format_error or n.action is None]
        seen: set[Any] = {normalize_command(a.command) for a in actions} | {("error", n.raw) for n in errors}
        job.reranked = [n.id for n in older]
        for c in completions:
            parsed = parse(c.text)
            # A sample whose ids are not the canonical encoding of its text keeps no log-prob: it is
            # another sequence's, and DPO would take it for the reference (docs/algorithms.md §3).
            logprob = c.logprob if c.canonical is not False else None
            gen = {"raw": c.text, "logprob": logprob, "gen_ms": share, "n_tokens": c.n_tokens}
            if isinstance(parsed, FormatError):
                if ("error", c.text) in seen:
                    continue
                seen.add(("error", c.text))
                obs = f"Format error: {parsed.reason}. The environment was not stepped."
                errors.append(
                    tree.add_child(
                        node, observation=obs, format_error=parsed.reason, terminal="format_error", reward=0.0, **gen
                    )
                )
                continue
            key = normalize_command(parsed.command)
            if key in seen:  # dedupe identical env commands
                continue
            seen.add(key)
            child = self.step_child(job, node, parsed, **gen)
            valid.append(child)
            actions.append(parsed)
        if cfg.critic:
            total = len(valid) + len(errors)
            if cfg.value_model and valid:
                self._value_rank(job, valid)
            elif len(valid) > 1:
                critic_params = self._params(job, 0.0, cfg.critic_max_tokens, "critic", node.id)
                ranking = yield from rank_candidates(
                    task.goal, task.context, history, node.observation, actions, critic_params
                )
                self.stats.critic_fallbacks += ranking.fallbacks
                for rank, idx in enumerate(ranking.order):
                    valid[idx].critic_rank = rank
                    valid[idx].Q_critic = rank_to_score(rank, total, cfg.critic_mapping)
                    valid[idx].critic_reason = ranking.reasons[idx]
            elif valid:
                valid[0].critic_rank = 0
                valid[0].Q_critic = 1.0
                valid[0].critic_reason = "(only valid candidate)"
            # Unreadable candidates tie for last place, rank K-1 of the K candidates, and score what
            # the mapping gives that rank (docs/decisions.md "Format-error candidates and the critic"),
            # so any consumer recomputing Q^ from the rank agrees with the stored value.
            for e in errors:
                e.critic_rank = total - 1
                # the value critic's Q^ is a value, not a rank's score: an unreadable candidate backs up 0
                e.Q_critic = 0.0 if cfg.value_model else rank_to_score(total - 1, total, cfg.critic_mapping)
                e.critic_reason = "(format error: not shown to the critic)"

    def _value_rank(self, job: TreeJob, valid: list[Node]) -> None:
        """The value critic (`SearchConfig.value_model`; docs/decisions.md "A value model from the trees'
        returns"): Q^ of each readable candidate is the value model's prediction, ranks by it (ties in
        sampling order). Synchronous: a forward pass of K short rows asks the generator for nothing."""
        t = time.perf_counter()
        scores = value_critic(self.config.value_model).score_nodes(
            job.tree, [n.id for n in valid], job.env_description)
        order = sorted(range(len(valid)), key=lambda i: -scores[i])
        for rank, idx in enumerate(order):
            valid[idx].critic_rank = rank
            valid[idx].Q_critic = scores[idx]
            valid[idx].critic_reason = f"(value model: predicted value {scores[idx]:.3f})"
        self.stats.critic_s += time.perf_counter() - t

    def _rollout(
        self, job: TreeJob, node: Node
    ) -> Coroutine[Requests, Replies, tuple[float, tuple[str, ...], tuple[tuple[str, str], ...]]]:
        """(backed-up value, commands, and — only when the episode succeeded — its turns)."""
        tree, cfg, session = job.tree, self.config, job.session
        assert session is not None
        task = tree.task
        session.goto(tree, node)
        history: list[HistoryStep] = tree.history(node)
        observation, depth, commands = node.observation, node.depth, []
        turns: list[tuple[str, str]] = []
        progress = node.progress  # latched: the last step's progress is the episode's
        while depth < cfg.depth_limit:
            prompt = actor_prompt(job.env_description, task.goal, task.context, history, observation)
            params = self._actor_params(job, cfg.rollout_temperature, "rollout", node.id, depth)
            (completions,) = yield [SampleRequest(prompt, 1, params)]
            parsed = parse(completions[0].text) if completions else FormatError("no completion returned")
            if isinstance(parsed, FormatError):
                commands.append(f"<format error: {parsed.reason}>")
                return self._value(0.0, progress), tuple(commands), ()
            step = session.step(parsed.command)
            depth += 1
            commands.append(parsed.command)
            turns.append((completions[0].text, step.observation))
            if step.progress is not None:
                progress = step.progress
            if step.done or parsed.status != "CONTINUE":
                won = step.reward >= cfg.success_threshold
                return self._value(step.reward, progress), tuple(commands), tuple(turns) if won else ()
            history.append(HistoryStep(parsed, step.observation))
            observation = step.observation
        return self._value(0.0, progress), tuple(commands), ()


def _landed(put: Callable[[Any], None], wait: Any, index: int, fut: Future) -> None:
    """A done callback: hand the request's completions (or its error) to the scheduler's queue (index:
    the request's place). It runs in the backend's thread (driven: in the scheduler's own, inside the
    driver's wait), so the scheduler's thread never takes the future's lock (or, for a future done
    already, at once inside `add_done_callback`)."""
    try:
        put((wait, index, fut.result(), None))
    except BaseException as e:  # noqa: BLE001 - the scheduler raises it
        put((wait, index, None, e))
