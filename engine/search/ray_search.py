"""Search on a Ray cluster: shards of trees on workers, one store writer on the driver.

`new_run_on_ray` creates the run as `runner.new_run` does, splits the trees into shards (tree i
goes to shard i mod S; S = the cluster's CPUs, at most one per tree) and runs each shard as a Ray
streaming-generator task that runs the same MCTS scheduler with its own envs and model client and
yields every finished simulation as it ends: the nodes new since the last one, the visit counts
and value sums along its path, the simulation. The driver mirrors each tree, commits every
simulation as it arrives (it stays the single writer of the store; the simulations that arrived
together go in one transaction) and reports progress. The driver is `ShardedSearch`, whatever runs
the shards: `RaySearch` starts them as Ray tasks, engine/search/local_shards.py as worker processes
of this machine (`orchard search --shards N`).

A shard whose worker dies (process killed, node lost) is started again from the driver's mirrors,
which hold exactly what was committed, so nothing committed is lost or sent twice and at most
each tree's unfinished simulation is redone; with per-request seeds it is redone identically up to
float rounding (batch shapes and the prompt prefix cache change a logit's last bits, which can flip a
sampled token at a near tie), so the trees are those a local run grows. An error raised by the search itself (an env that fails) is
not retried: the run stops with that error, as a local one would. `resume_run_on_ray` continues an
interrupted run (local or Ray) the same way: the mirrors start as the committed trees.

The address is checked for its form here (`check_address`) and, before the driver joins, for an answer
(`probe_address`: `ray.init` waits over a minute on a HOST:PORT nothing answers); `connect` is the one
place Orchard joins Ray, and `prepare_*` join before the run is written. The model spec is the caller's
to check before anything is written (engine.search.stage does it on the driver: a bad spec would fail every
shard).

Workers are untrusted peers of the driver: their messages are unpickled with a class allowlist
(`loads_message`: tree nodes, simulations, actions, stats; nothing else is rebuilt) and checked like
the local steps `checked_step` checks (`check_sim_message`, `check_done_message`: types, finite
values in range, node ids, parents and depths consistent with the mirror) before anything is
committed; an invalid one stops the run in one line. Joining a cluster that is not on loopback needs
Ray's token auth (RAY_AUTH_MODE=token): without it anyone who reaches the cluster runs code on its
workers and feeds the driver, so Orchard refuses (`check_auth`) unless --allow-unauthenticated-ray
(ORCHARD_ALLOW_UNAUTHENTICATED_RAY=1) says the network is trusted.

Ray is an optional extra (`pip install "orchard[ray]"`), imported only here, only when asked for.
"""

from __future__ import annotations

import io
import ipaddress
import math
import os
import pickle
import queue
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.actions import CompositeAction
from engine.config import ConfigError, SearchConfig, from_dict
from engine.envs.base import TaskSpec, close_env, close_envs
from engine.llm.base import GeneratorError
from engine.search.mcts import SearchStats, TreeJob
from engine.store import Store, StoreError
from engine.store.runs import SimulationRows, simulation_rows
from engine.tree_nodes import TERMINALS, Node, SearchTree, Simulation

INSTALL_HINT = 'Ray is not installed: pip install "orchard[ray]" (or "ray[default]>=2.60")'
ADDRESS_HELP = "HOST:PORT, auto (the cluster this machine has joined) or empty (start a local Ray)"
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
PROBE_TIMEOUT_S = 3.0
_SUMMED = ("rounds", "requests", "completions", "critic_fallbacks", "replays", "restores",
           "gen_s", "env_s", "commit_s", "critic_s")

ALLOW_UNAUTHENTICATED_ENV = "ORCHARD_ALLOW_UNAUTHENTICATED_RAY"

Progress = Callable[[TreeJob, Simulation], None]
COMMIT_BATCH = 256  # simulations that arrived together are committed in one transaction, at most this many


def import_ray() -> Any:
    """The `ray` module, or RayUnavailable saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(INSTALL_HINT) from None
    return ray


def check_address(address: str) -> str:
    """`address` as `--ray` takes it, stripped: "" (start a local Ray), "auto" or HOST:PORT (an IPv6
    host in brackets); ConfigError otherwise, before anything is written (`ray.init` waits over a
    minute on an address it cannot reach)."""
    if not isinstance(address, str):
        raise ConfigError(f"ray address {address!r}: expected {ADDRESS_HELP}")
    text = address.strip()
    if text in ("", "auto"):
        return text
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit() and 0 < int(port) < 65536:
        if host.startswith("[") and host.endswith("]"):
            try:
                ipaddress.IPv6Address(host[1:-1])
                return text
            except ValueError:
                pass
        elif len(host) <= 253 and _HOST.fullmatch(host):
            return text
    raise ConfigError(f"ray address {address!r}: expected {ADDRESS_HELP}")


def probe_address(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """RayUnavailable, in one line naming the address, unless something accepts a TCP connection at
    HOST:PORT within `timeout` seconds (name lookup included). WHY: `ray.init` on a HOST:PORT nothing
    answers waits over a minute. "" and "auto" are not probed (a local Ray is started; `auto` finds
    the cluster this machine has joined, and says so at once when there is none)."""
    text = check_address(address)
    if text in ("", "auto"):
        return
    host, _, port = text.rpartition(":")
    outcome: list[OSError | None] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                outcome.append(None)
        except OSError as e:
            outcome.append(e)

    thread = threading.Thread(target=attempt, name="orchard-ray-probe", daemon=True)
    thread.start()
    thread.join(timeout)  # a name lookup is not bounded by the socket's timeout: the wait is
    if outcome and outcome[0] is None:
        return
    error = outcome[0] if outcome else None
    if error is None or isinstance(error, TimeoutError):
        reason = f"no answer within {timeout:g}s"
    else:
        reason = (error.strerror or str(error) or type(error).__name__).lower()
    raise RayUnavailable(f"cannot reach the Ray cluster at {text}: {reason} (is its head started there with "
                         "`ray start --head`?)")


def check_auth(address: str, allow: bool | None = None) -> None:
    """RayUnavailable (one line) for a HOST:PORT that is not loopback while Ray's token auth is off
    (RAY_AUTH_MODE is not "token"), unless `allow` (None: ORCHARD_ALLOW_UNAUTHENTICATED_RAY=1). A host
    name other than localhost counts as remote (it is not looked up). "" (a local Ray) and "auto"
    (the cluster this machine has joined) are left alone."""
    text = check_address(address)
    if text in ("", "auto"):
        return
    host = text.rpartition(":")[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback or os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token":
        return
    if allow if allow is not None else os.environ.get(ALLOW_UNAUTHENTICATED_ENV, "").strip() == "1":
        return
    raise RayUnavailable(f"ray address {text}: not on loopback and Ray token auth is off (RAY_AUTH_MODE=token): "
                         "anyone reaching that cluster could run code there and send this driver results; "
                         f"turn token auth on, or pass --allow-unauthenticated-ray ({ALLOW_UNAUTHENTICATED_ENV}=1) "
                         "on a network you trust")


# --------------------------------------------------------------------- worker messages, untrusted

_ALLOWED_CLASSES = {("engine.tree_nodes", "Node"): Node, ("engine.tree_nodes", "Simulation"): Simulation,
                    ("engine.actions", "CompositeAction"): CompositeAction,
                    ("engine.search.mcts", "SearchStats"): SearchStats}


class _MessageUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        cls = _ALLOWED_CLASSES.get((module, name))
        if cls is None:
            raise pickle.UnpicklingError(f"a worker's message names {module}.{name}, which is not allowed")
        return cls


def loads_message(payload: Any) -> Any:
    """A worker's pickled message, rebuilt from plain values and the allowlisted classes only."""
    if not isinstance(payload, bytes):
        raise GeneratorError(f"invalid result from a search shard: a {type(payload).__name__}, not bytes")
    try:
        return _MessageUnpickler(io.BytesIO(payload)).load()
    except Exception as e:  # noqa: BLE001 - any unpickling failure is the worker's
        raise GeneratorError(f"invalid result from a search shard: {str(e).splitlines()[0] if str(e) else e!r}") from None


def _bad(what: str) -> GeneratorError:
    return GeneratorError(f"invalid result from a search shard: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any, what: str, lo: float | None = None, hi: float | None = None, optional: bool = False) -> None:
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _bad(f"{what} {v!r} is not a finite number")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise _bad(f"{what} {v!r} is outside [{lo}, {hi}]")


def _text(v: Any, what: str, optional: bool = True) -> None:
    if not (isinstance(v, str) or (optional and v is None)):
        raise _bad(f"{what} is a {type(v).__name__}, not text")


def _check_node(n: Any, want_id: int, depth_of: Callable[[int], int | None], where: str) -> None:
    if type(n) is not Node:
        raise _bad(f"{where}: a {type(n).__name__}, not a Node")
    if n.id != want_id:
        raise _bad(f"{where}: id {n.id!r}, expected {want_id}")
    where = f"{where.rsplit(' ', 1)[0]} {want_id}"
    if want_id == 0:
        if n.parent is not None or n.depth != 0:
            raise _bad(f"{where}: the root has parent {n.parent!r} and depth {n.depth!r}")
    else:
        parent = n.parent
        parent_depth = depth_of(parent) if isinstance(parent, int) and _is_int(parent) and 0 <= parent < want_id \
            else None
        if parent_depth is None:
            raise _bad(f"{where}: parent {n.parent!r} is not an earlier node")
        if n.depth != parent_depth + 1:
            raise _bad(f"{where}: depth {n.depth!r}, its parent's is {parent_depth}")
    _text(n.observation, f"{where}: observation", optional=False)
    for name in ("raw", "format_error", "critic_reason"):
        _text(getattr(n, name), f"{where}: {name}")
    if not (n.terminal is None or (isinstance(n.terminal, str) and n.terminal in TERMINALS)):
        raise _bad(f"{where}: terminal {str(n.terminal)[:40]!r} is not one of {', '.join(TERMINALS)}")
    if n.author != "policy":  # a shard's nodes are the policy's: human nodes come from steering, never a worker
        raise _bad(f"{where}: author {str(n.author)[:40]!r}, not 'policy'")
    if n.action is not None and (type(n.action) is not CompositeAction or not all(
            isinstance(getattr(n.action, f), str) for f in ("thought", "command", "explanation", "status"))
            or not (n.action.plan is None or isinstance(n.action.plan, str))):
        raise _bad(f"{where}: action is not a composite action")
    if not _is_int(n.N) or n.N < 0 or not _is_int(n.n_tokens) or n.n_tokens < 0:
        raise _bad(f"{where}: N {n.N!r} / n_tokens {n.n_tokens!r} is not a whole number >= 0")
    if not (n.critic_rank is None or _is_int(n.critic_rank)):
        raise _bad(f"{where}: critic_rank {n.critic_rank!r} is not a whole number")
    _number(n.value_sum, f"{where}: value_sum")
    for name in ("reward", "progress", "Q_critic"):
        _number(getattr(n, name), f"{where}: {name}", 0.0, 1.0, optional=True)
    _number(n.logprob, f"{where}: logprob", optional=True)
    _number(n.gen_ms, f"{where}: gen_ms", 0.0)
    _number(n.env_ms, f"{where}: env_ms", 0.0)
    if not (n.screenshot is None or isinstance(n.screenshot, bytes)):
        raise _bad(f"{where}: screenshot is not bytes")
    if not isinstance(n.children, list) or not all(_is_int(c) for c in n.children):
        raise _bad(f"{where}: children is not a list of node ids")


def check_sim_message(message: Any, mirrors: dict[int, _Mirror]) -> tuple[int, int, list[Node],
                                                                           list[tuple[int, int, float]],
                                                                           Simulation, tuple[int, str]]:
    """`_check_sim_message`, where an object rebuilt without one of its fields (pickle restores the state
    it is given) or a field of another type is a one-line error too."""
    try:
        return _check_sim_message(message, mirrors)
    except (AttributeError, TypeError) as e:
        raise _bad(f"a simulation message holds an incomplete object ({str(e)[:80]})") from None


def _check_sim_message(message: Any, mirrors: dict[int, _Mirror]) -> tuple[int, int, list[Node],
                                                                            list[tuple[int, int, float]],
                                                                            Simulation, tuple[int, str]]:
    """A worker's ("sim") message as untrusted input, before the driver commits it: its shape and
    types, a tree of this shard, new nodes numbered on from the mirror with parents and depths that
    fit and children that are theirs, finite values (reward, progress, Q^ in [0, 1], as
    `checked_step` holds local steps to), visit counts of existing nodes, and a simulation whose path
    runs down the tree. GeneratorError in one line otherwise."""
    if not isinstance(message, tuple) or len(message) != 6:
        raise _bad("a simulation message is not a 6-tuple")
    tree_id, first, new, values, sim, pid = message
    if not _is_int(tree_id) or tree_id not in mirrors:
        raise _bad(f"tree {tree_id!r} is not one of this shard's")
    mirror = mirrors[tree_id]
    have = mirror.job.tree.nodes if mirror.job is not None else []
    if not _is_int(first) or first != len(have):
        raise _bad(f"tree {tree_id}: new nodes start at {first!r}, the driver holds {len(have)}")
    if not isinstance(new, list):
        raise _bad(f"tree {tree_id}: new nodes are not a list")
    # Looked up in the mirror's nodes and the message's, never copied: the check costs what the
    # message holds, not what the tree has grown to (the driver checks every simulation).
    checked = 0  # new[:checked] passed _check_node

    def depth_of(i: int) -> int | None:
        if 0 <= i < first:
            return have[i].depth
        return new[i - first].depth if first <= i < first + checked else None

    for k, n in enumerate(new):
        _check_node(n, first + k, depth_of, f"tree {tree_id}: node {first + k}")
        checked += 1
    total = first + len(new)
    named: dict[int | None, list[int]] = {}  # node id -> the new nodes naming it as their parent, in order
    for m in new:
        named.setdefault(m.parent, []).append(m.id)
    for n in new:
        if sorted(n.children) != named.get(n.id, []):
            raise _bad(f"tree {tree_id}: node {n.id}: children {n.children[:10]!r} are not the nodes naming it")
    if not isinstance(values, list) or not values:
        raise _bad(f"tree {tree_id}: visit counts are not a list")
    for item in values:
        if not (isinstance(item, tuple) and len(item) == 3 and _is_int(item[0]) and 0 <= item[0] < total
                and _is_int(item[1]) and item[1] >= 0):
            raise _bad(f"tree {tree_id}: visit count entry {str(item)[:80]} is not (node id, N >= 0, value sum)")
        _number(item[2], f"tree {tree_id}: node {item[0]}: value_sum")
    if type(sim) is not Simulation:
        raise _bad(f"tree {tree_id}: a {type(sim).__name__}, not a Simulation")
    _number(sim.reward, f"tree {tree_id}: simulation reward", 0.0, 1.0)

    def parent_of(i: int) -> int | None:  # 0 < i < total
        return have[i].parent if i < first else new[i - first].parent

    if not isinstance(sim.path, tuple) or not all(_is_int(i) and 0 < i < total for i in sim.path) or any(
            parent_of(b) != a for a, b in zip((0, *sim.path), sim.path, strict=False)):
        raise _bad(f"tree {tree_id}: simulation path {str(sim.path)[:80]} does not run down the tree from its root")
    if not isinstance(sim.rollout, tuple) or not all(isinstance(c, str) for c in sim.rollout) or \
            not isinstance(sim.turns, tuple) or not all(isinstance(t, tuple) and len(t) == 2 and all(
                isinstance(x, str) for x in t) for t in sim.turns):
        raise _bad(f"tree {tree_id}: simulation rollout or turns are not text")
    if not (isinstance(pid, tuple) and len(pid) == 2 and _is_int(pid[0]) and isinstance(pid[1], str)):
        raise _bad("the worker's (process id, node id) is malformed")
    return tree_id, first, new, values, sim, pid


def check_done_message(message: Any) -> SearchStats:
    """A worker's final ("done", SearchStats) message, checked before its numbers are summed."""
    try:
        return _check_done_message(message)
    except (AttributeError, TypeError) as e:
        raise _bad(f"the final message holds an incomplete object ({str(e)[:80]})") from None


def _check_done_message(message: Any) -> SearchStats:
    if not (isinstance(message, tuple) and len(message) == 2 and message[0] == "done"
            and type(message[1]) is SearchStats):
        raise _bad("the final message is not (\"done\", SearchStats)")
    stats = message[1]
    for key in _SUMMED:
        _number(getattr(stats, key), f"stats {key}", 0.0)
    if not isinstance(stats.batch_sizes, list) or not all(_is_int(b) and b >= 0 for b in stats.batch_sizes):
        raise _bad("stats batch_sizes is not a list of whole numbers")
    return stats


class RayUnavailable(GeneratorError):
    """`--ray` without Ray installed, or a cluster that cannot be reached (a GeneratorError: like a
    model server that cannot be reached, the user's to fix, reported in one line)."""


# --------------------------------------------------------------------- worker side


def shard_messages(env_spec: str, model_spec: str, config: dict[str, Any],
                   items: list[tuple[int, TaskSpec, SearchTree | None]],
                   allow_http_key: bool | None = None) -> Iterator[tuple[str, bytes]]:
    """The body of a shard, anywhere (a Ray task, a local worker process, this process): MCTS over
    `items` (tree id, task, committed tree or None), yielding ("sim", pickled message) per finished
    simulation, then ("done", pickled ("done", stats)), or ("error", one line in UTF-8) and stop."""
    from engine.envs.registry import env_factory
    from engine.llm.registry import load_generator
    from engine.search.mcts import MCTS, start_tree

    cfg = from_dict(SearchConfig, config, where="shard config")
    make_env = env_factory(env_spec)
    generator = load_generator(model_spec, log=lambda *a, **k: None, allow_http_key=allow_http_key)
    out: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
    pid = (os.getpid(), _node_id())

    def on_simulation(job: TreeJob, sim: Simulation) -> None:
        tree, first = job.tree, job.committed_nodes
        touched = sorted({0, *sim.path})
        values = [(i, tree.nodes[i].N, tree.nodes[i].value_sum) for i in touched]
        # pickled now: the tree keeps changing in this thread after the callback returns
        out.put(("sim", pickle.dumps((job.tree_id, first, tree.nodes[first:], values, sim, pid))))

    def search() -> None:
        jobs: list[TreeJob] = []
        try:
            description = ""
            for tree_id, task, tree in items:
                if tree is None:
                    job = start_tree(task, make_env, cfg.simulations)
                else:
                    if not description:
                        env = make_env()
                        description = env.describe()
                        close_env(env)
                    job = TreeJob(tree=tree, make_env=make_env, env_description=description,
                                  target=cfg.simulations, committed_nodes=len(tree.nodes))
                job.tree_id = tree_id
                jobs.append(job)
            stats = MCTS(generator, cfg, on_simulation=on_simulation).run(jobs)
            out.put(("done", pickle.dumps(("done", stats))))
        except BaseException as e:  # noqa: BLE001 - sent to the driver, which reports it
            out.put(("error", f"{type(e).__name__}: {e}".encode()))
        finally:
            close_envs(jobs)
            close = getattr(generator, "close", None)
            if callable(close):
                close()

    thread = threading.Thread(target=search, name="orchard-shard", daemon=True)
    thread.start()
    while True:
        kind, payload = out.get()
        yield kind, payload
        if kind != "sim":
            break
    thread.join()


def run_shard(env_spec: str, model_spec: str, config: dict[str, Any],
              items: list[tuple[int, TaskSpec, SearchTree | None]],
              allow_http_key: bool | None = None) -> Iterator[bytes]:
    """A shard as a Ray streaming task (`shard_messages`): one pickled message per finished
    simulation, then ("done", stats); the search's own error is raised (a RayTaskError on the driver)."""
    for kind, payload in shard_messages(env_spec, model_spec, config, items, allow_http_key):
        if kind == "error":
            raise RuntimeError(payload.decode(errors="replace"))
        yield payload


def _node_id() -> str:
    ray = sys.modules.get("ray")  # a Ray worker has it; a local worker process never imports it
    try:
        return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - an API change: the id is only informative
        return ""


# --------------------------------------------------------------------- driver side


@dataclass
class _Mirror:
    """The driver's copy of a tree: exactly what has been committed."""

    tree_id: int
    task: TaskSpec
    job: TreeJob | None = None  # once the root has arrived

    def apply(self, first: int, new: list[Node], values: list[tuple[int, int, float]], sim: Simulation) -> None:
        if self.job is None:
            if first != 0:
                raise GeneratorError(f"tree {self.tree_id}: first message starts at node {first}, not 0")
            self.job = TreeJob(tree=SearchTree(task=self.task, nodes=[]), make_env=_no_env, env_description="",
                               target=0, tree_id=self.tree_id)
        tree = self.job.tree
        if first != len(tree.nodes):
            raise GeneratorError(f"tree {self.tree_id}: message starts at node {first}, mirror has {len(tree.nodes)}")
        for n in new:
            tree.nodes.append(n)
            if n.parent is not None and n.parent < first:
                tree.nodes[n.parent].children.append(n.id)
        for i, visits, value_sum in values:
            tree.nodes[i].N, tree.nodes[i].value_sum = visits, value_sum
        tree.simulations.append(sim)


def _no_env():
    raise RuntimeError("a mirrored tree has no env")


Events = queue.SimpleQueue  # of (shard, attempt, kind, payload): kind "sim" | "done" | "lost" | "error"


@dataclass
class ShardedSearch:
    """Drives the shards of one run, wherever they run (see the module docstring): tree i goes to
    shard i mod S; every shard's simulations are checked, mirrored and committed here, the one store
    writer. Subclasses say where a shard attempt runs (`_launch`), how many shards there are by
    default (`_default_shards`) and how running attempts are stopped (`_stop`): `RaySearch` here,
    `engine.search.local_shards.LocalShards` in worker processes of this machine. `pids[shard]` is
    (worker process id, Ray node id or "") of each shard's latest attempt; `attempts[shard]` counts
    its starts; `shard_stats[shard]` is the search statistics its last attempt reported."""

    store: Store
    run_id: str
    env_spec: str
    model_spec: str
    config: SearchConfig
    mirrors: list[_Mirror]
    shards: int | None = None
    max_retries: int = 3
    progress: Progress | None = None
    allow_http_key: bool | None = None  # the driver's --allow-http-key, for the workers' model (None: their env)
    pids: dict[int, tuple[int, str]] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    shard_stats: dict[int, SearchStats] = field(default_factory=dict)

    label = "shard"  # names a shard in errors

    def _default_shards(self) -> int:
        raise NotImplementedError

    def _launch(self, shard: int, attempt: int, n_shards: int, items: list[tuple[int, TaskSpec, SearchTree | None]],
                events: Events) -> None:
        """Start shard `shard`'s attempt `attempt` over `items`; its messages go to `events`."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Stop every running attempt (the run ends here; resume continues it)."""

    def run(self) -> SearchStats:
        n_shards = self.shards or self._default_shards()
        n_shards = max(1, min(n_shards, len(self.mirrors)))
        groups = [self.mirrors[s::n_shards] for s in range(n_shards)]
        events: Events = queue.SimpleQueue()
        stats = SearchStats()
        t0 = time.perf_counter()

        def start(shard: int) -> None:
            attempt = self.attempts.get(shard, 0) + 1
            self.attempts[shard] = attempt
            items = [(m.tree_id, m.task, pickle.loads(pickle.dumps(m.job.tree)) if m.job else None)
                     for m in groups[shard] if m.job is None or len(m.job.tree.simulations) < self.config.simulations]
            if not items:
                events.put((shard, attempt, "done", None))
                return
            self._launch(shard, attempt, n_shards, items, events)

        self.store.set_run_status(self.run_id, "running")
        try:
            running = set(range(n_shards))
            for s in range(n_shards):
                start(s)
            by_shard = [{m.tree_id: m for m in group} for group in groups]
            while running:
                batch = [events.get()]  # and everything that arrived meanwhile: one transaction for its simulations
                while len(batch) < COMMIT_BATCH:
                    try:
                        batch.append(events.get_nowait())
                    except queue.Empty:
                        break
                batch = [e for e in batch if e[1] == self.attempts[e[0]]]  # late messages of replaced attempts
                committed: list[tuple[TreeJob, Simulation]] = []
                rows: list[SimulationRows] = []
                t = time.perf_counter()
                for shard, _, kind, payload in batch:
                    if kind != "sim":
                        continue
                    mirrors = by_shard[shard]
                    tree_id, first, new, values, sim, pid = check_sim_message(loads_message(payload), mirrors)
                    self.pids[shard] = pid
                    mirror = mirrors[tree_id]
                    mirror.apply(first, new, values, sim)
                    assert mirror.job is not None
                    rows.append(simulation_rows(tree_id, mirror.job.tree, sim, first))
                    committed.append((mirror.job, sim))
                self.store.save_simulations(rows)  # what arrived together: one transaction
                stats.commit_s += time.perf_counter() - t
                stats.simulations += len(committed)  # committed ones: a lost attempt's work is not counted
                if self.progress is not None:
                    for job, sim in committed:
                        self.progress(job, sim)
                for shard, attempt, kind, payload in batch:
                    if kind == "done":
                        if payload is not None:
                            shard_stats = check_done_message(loads_message(payload))
                            self.shard_stats[shard] = shard_stats
                            for key in _SUMMED:
                                if key != "commit_s":
                                    setattr(stats, key, getattr(stats, key) + getattr(shard_stats, key))
                            stats.batch_sizes.extend(shard_stats.batch_sizes)
                        running.discard(shard)
                    elif kind == "lost":  # the worker died: start again from what was committed
                        if attempt > self.max_retries:
                            raise GeneratorError(f"{self.label} {shard} failed {attempt} times; the last: {payload}")
                        start(shard)
                    elif kind == "error":  # the search itself failed; not retried
                        raise GeneratorError(f"{self.label} {shard}: {payload}")
        except BaseException:
            self._stop()
            stats.wall_s = time.perf_counter() - t0
            self.store.set_run_status(self.run_id, "interrupted", stats.to_dict())
            raise
        stats.wall_s = time.perf_counter() - t0
        self.store.set_run_status(self.run_id, "finished", stats.to_dict())
        return stats


@dataclass
class RaySearch(ShardedSearch):
    """Shards as Ray streaming-generator tasks (`run_shard`) on the cluster at `address`; S defaults
    to the cluster's CPUs."""

    address: str | None = None
    label = "ray shard"

    def __post_init__(self) -> None:
        self._ray: Any = None
        self._remote: Any = None
        self._streams: dict[int, Any] = {}  # shard -> its latest attempt's stream

    def _connected(self) -> Any:
        if self._ray is None:
            self._ray = connect(self.address)
            self._remote = self._ray.remote(num_cpus=1, max_retries=0, num_returns="streaming")(run_shard)
        return self._ray

    def _default_shards(self) -> int:
        return max(1, int(self._connected().cluster_resources().get("CPU", 1)))

    def _launch(self, shard: int, attempt: int, n_shards: int, items: list[tuple[int, TaskSpec, SearchTree | None]],
                events: Events) -> None:
        ray = self._connected()
        if shard in self._streams:  # a retry: the lost attempt's task may still run (and use the servers)
            self._cancel(self._streams[shard])
        gen = self._remote.remote(self.env_spec, self.model_spec, asdict(self.config), items, self.allow_http_key)
        self._streams[shard] = gen
        threading.Thread(target=_consume, args=(ray, gen, shard, attempt, events), daemon=True).start()

    def _cancel(self, gen: Any) -> None:
        try:
            self._ray.cancel(gen, force=True)
        except Exception:  # noqa: BLE001, S110 - a finished or dead shard cannot be cancelled
            pass

    def _stop(self) -> None:
        for gen in self._streams.values():
            self._cancel(gen)


def _consume(ray: Any, gen: Any, shard: int, attempt: int, events: queue.SimpleQueue) -> None:
    """Read one shard attempt's stream into `events` (a driver thread; the main thread commits)."""
    try:
        for ref in gen:
            payload = ray.get(ref)
            message = loads_message(payload)
            if isinstance(message, tuple) and message and message[0] == "done":
                events.put((shard, attempt, "done", payload))
                return
            events.put((shard, attempt, "sim", payload))
        events.put((shard, attempt, "lost", "the stream ended without its final message"))
    except ray.exceptions.RayTaskError as e:  # raised by the search itself
        cause = e.cause if getattr(e, "cause", None) is not None else e
        events.put((shard, attempt, "error", str(cause).strip().splitlines()[-1] if str(cause).strip() else repr(e)))
    except ray.exceptions.RayError as e:  # worker or node died, object lost: retry
        events.put((shard, attempt, "lost", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    except BaseException as e:  # noqa: BLE001 - anything else stops the run
        events.put((shard, attempt, "error", f"{type(e).__name__}: {e}"))


def connect(address: str | None) -> Any:
    """The `ray` module, joined to the cluster at `address` ("auto" or HOST:PORT, which must answer
    first: `probe_address`; None or "" starts a local one). The one place Orchard joins Ray; the
    workers import this checkout's `engine` package (shipped as a py_module)."""
    ray = import_ray()
    check_auth(address or "")
    probe_address(address or "")  # also when joined already: the address asked for must answer
    if ray.is_initialized():
        return ray
    engine_dir = str(Path(__file__).resolve().parent.parent)
    try:
        ray.init(address=address or None, runtime_env={"py_modules": [engine_dir]}, log_to_driver=False,
                 logging_level="ERROR", configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayUnavailable(f"cannot join the Ray cluster at {address or '(local)'}: {e}") from None
    return ray


def prepare_run_on_ray(store: Store, env_spec: str, tasks: list[TaskSpec], model_spec: str,
                       config: SearchConfig, name: str, **options: Any) -> RaySearch:
    """Join the cluster, then create the run in the store and the search that grows it (options:
    RaySearch fields): a cluster that cannot be reached leaves no run behind."""
    connect(options.get("address"))
    run_id, mirrors = new_mirrors(store, env_spec, tasks, model_spec, config, name)
    return RaySearch(store, run_id, env_spec, model_spec, config, mirrors, **options)


def new_mirrors(store: Store, env_spec: str, tasks: list[TaskSpec], model_spec: str, config: SearchConfig,
                name: str) -> tuple[str, list[_Mirror]]:
    """Create the run in the store; (its id, an empty mirror per tree) for a sharded search."""
    run_id = store.create_run(name, env_spec, model_spec, asdict(config), tasks)
    by_task = {t.id: t for t in tasks}
    return run_id, [_Mirror(tree_id, by_task[task_id]) for tree_id, task_id in store.tree_ids(run_id)]


def new_run_on_ray(
    store: Store,
    env_spec: str,
    tasks: list[TaskSpec],
    model_spec: str,
    config: SearchConfig,
    name: str,
    progress: Progress | None = None,
    address: str | None = None,
    shards: int | None = None,
) -> tuple[str, SearchStats]:
    """`runner.new_run` on a Ray cluster: the same run in the store, trees grown by Ray workers."""
    search = prepare_run_on_ray(store, env_spec, tasks, model_spec, config, name, progress=progress,
                                address=address, shards=shards)
    return search.run_id, search.run()


def prepare_resume_on_ray(store: Store, run_key: str, model_spec: str | None = None, **options: Any) -> RaySearch:
    """The search that continues run `run_key` (id, id prefix or name) to its configured simulation
    count on Ray, with the run's model unless `model_spec`: its mirrors start as the committed trees,
    so the shards continue from exactly what was committed (`runner.resume_run` on Ray)."""
    run_id = store.find_run(run_key)
    connect(options.get("address"))  # before the run is touched
    info, config, mirrors = resume_mirrors(store, run_id)
    return RaySearch(store, run_id, info.env, model_spec or info.model, config, mirrors, **options)


def resume_mirrors(store: Store, run_id: str) -> tuple[Any, SearchConfig, list[_Mirror]]:
    """(run info, its config, a mirror per tree holding exactly what was committed) of run `run_id`,
    for a sharded search that continues it; a tree that never committed starts afresh from its task."""
    from engine.envs.registry import env_factory

    info = store.run(run_id)
    config = from_dict(SearchConfig, info.config, where=f"run {run_id} config")
    mirrors: list[_Mirror] = []
    catalogue: dict[str, TaskSpec] | None = None
    for tree_id, task_id in store.tree_ids(run_id):
        tree = store.load_tree(tree_id)
        if tree is not None:
            job = TreeJob(tree=tree, make_env=_no_env, env_description="", target=0, tree_id=tree_id,
                          committed_nodes=len(tree.nodes))
            mirrors.append(_Mirror(tree_id, tree.task, job))
            continue
        if catalogue is None:  # a tree that never committed a simulation starts afresh from its task
            env = env_factory(info.env)()
            try:
                catalogue = {t.id: t for split in ("train", "test") for t in env.tasks(split)}
            finally:
                close_env(env)
        if task_id not in catalogue:
            raise StoreError(f"run {run_id}: task {task_id!r} no longer exists in env {info.env}")
        mirrors.append(_Mirror(tree_id, catalogue[task_id]))
    return info, config, mirrors


def resume_run_on_ray(store: Store, run_key: str, model_spec: str | None = None, progress: Progress | None = None,
                      address: str | None = None, shards: int | None = None) -> tuple[str, SearchStats]:
    """`runner.resume_run` on a Ray cluster; returns (run id, stats of the simulations added)."""
    search = prepare_resume_on_ray(store, run_key, model_spec, progress=progress, address=address, shards=shards)
    return search.run_id, search.run()
