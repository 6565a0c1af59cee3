"""Local shards: a search's trees grown in worker processes of this machine, one store writer here.

Past what one process can drive (its client, scheduler and env steps share one interpreter lock),
the trees are split into S shards as on Ray (engine/search/ray_search.py, whose driver this is:
`ShardedSearch`): tree i goes to shard i mod S, each shard runs `shard_messages` (the same MCTS
scheduler with its own envs and model client) in a `multiprocessing` "spawn" process and sends every
finished simulation over a pipe; this process checks it like a Ray worker's message, mirrors it and
commits it, the single writer of the store. A worker that dies is started again from the mirrors
(exactly what was committed), so nothing committed is lost or sent twice; an interrupted run
resumes from the committed simulations, sharded or not.

The run's limits stay the run's: a shard gets its share of the model spec's `concurrency` (per
server) and of `trees_in_flight`, so S shards keep as many requests in flight against the servers
as one process would, only with S interpreters to drive them. S is `auto_shards`'s rule unless
given (`orchard search --shards N`, the search job's `shards` field).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from engine.envs import registry
from engine.envs.base import TaskSpec
from engine.search.mcts import SearchStats
from engine.search.ray_search import Events, ShardedSearch, new_mirrors, resume_mirrors, shard_messages
from engine.store import Store
from engine.tree_nodes import SearchTree

# Requests in flight one process drives at the no-barrier bound (docs/decisions.md "Local shards"): set
# when that took ~1.2 ms of client + scheduler CPU per request (about one core at 75-500 ms answers); the
# driven loop and the typed read have since made it 0.5-0.6 ms at 256 in flight (README, issue 30), so one
# process has headroom here; not re-tuned (two cores cannot show where the next shard starts to pay).
IN_FLIGHT_PER_SHARD = 256


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spec_concurrency(model_spec: str) -> tuple[int, int] | None:
    """(concurrency limit per server, servers) of an `openai:` spec; None for any other model (a
    model in the process is bound by the model, not by the driver: it is never sharded by default)."""
    from engine.llm.openai_http import default_concurrency, parse_spec
    from engine.llm.registry import parse_model_spec

    parsed = parse_model_spec(model_spec)
    if parsed.kind != "openai":
        return None
    try:
        urls, _, options = parse_spec(parsed.text)
    except ValueError:
        return None  # loading it says why
    return int(options.get("concurrency") or default_concurrency(urls[0])), len(urls)


def auto_shards(trees: int, trees_in_flight: int, model_spec: str, n_cores: int | None = None) -> int:
    """The shard count of a local search: min(cores, ceil(requests in flight / IN_FLIGHT_PER_SHARD)),
    requests in flight = min(trees, trees_in_flight, concurrency x servers); 1 for a model that is
    not an `openai:` server."""
    limits = spec_concurrency(model_spec)
    if limits is None:
        return 1
    in_flight = min(trees, trees_in_flight, limits[0] * limits[1])
    return max(1, min(n_cores or cores(), math.ceil(in_flight / IN_FLIGHT_PER_SHARD)))


def _share(total: int, shard: int, n_shards: int) -> int:
    """Shard `shard`'s part of `total` split as evenly as whole numbers go (at least 1)."""
    return max(1, total // n_shards + (1 if shard < total % n_shards else 0))


def shard_model_spec(model_spec: str, shard: int, n_shards: int) -> str:
    """`model_spec` with shard `shard`'s part of its concurrency limit (openai specs; others as given)."""
    from engine.llm.openai_http import parse_spec, spec_query
    from engine.llm.registry import parse_model_spec

    limits = spec_concurrency(model_spec)
    if limits is None or n_shards == 1:
        return model_spec
    text = parse_model_spec(model_spec).text
    urls, model, options = parse_spec(text)
    options = {**options, "concurrency": _share(limits[0], shard, n_shards)}
    return f"openai:{','.join(urls)}#{model}{spec_query(options)}"


def _worker(conn: Any, env_spec: str, model_spec: str, config: dict[str, Any],
            items: list[tuple[int, TaskSpec, SearchTree | None]], allow_http_key: bool | None,
            envs: dict[str, str] | None = None) -> None:
    """A worker process's body: the shard's messages down the pipe, each tagged by its kind's first
    letter (s: a simulation, d: done, e: an error line). `envs`: the parent's env table, so that an
    env registered at run time (`registry.BUILTIN[name] = "module:Class"`) is known here too: the
    worker starts without the parent's `__main__` (see `_bare_main`), which may be what registered it."""
    try:
        if envs:
            from engine.envs import registry

            for name, target in envs.items():
                registry.BUILTIN.setdefault(name, target)
        for kind, payload in shard_messages(env_spec, model_spec, config, items, allow_http_key):
            conn.send_bytes(kind[:1].encode() + payload)
    except BaseException as e:  # noqa: BLE001 - loading the model or the env failed: the driver reports it
        conn.send_bytes(b"e" + f"{type(e).__name__}: {e}".encode())
    finally:
        conn.close()


def _read(conn: Any, proc: Any, shard: int, attempt: int, events: Events) -> None:
    """Relay one worker's pipe into `events` (a driver thread; the main thread commits)."""
    try:
        while True:
            data = conn.recv_bytes()
            tag, payload = data[:1], data[1:]
            if tag == b"s":
                events.put((shard, attempt, "sim", payload))
            elif tag == b"d":
                events.put((shard, attempt, "done", payload))
                return
            else:
                text = " ".join(payload.decode(errors="replace").split())[:500]  # one line
                events.put((shard, attempt, "error", text or "the worker failed"))
                return
    except (EOFError, OSError):  # the worker died before its final message: start it again
        proc.join(timeout=5)
        why = f"worker process {proc.pid} ended (exit code {proc.exitcode}) before its final message"
        events.put((shard, attempt, "lost", why))
    finally:
        conn.close()


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """Start a spawned child without re-running this process's `__main__` file. WHY: spawn runs the
    parent's main script again in every child before the target; under Streamlit (or AppTest) that is
    the dashboard app, which fails outside a Streamlit runtime, and any script would run twice. The
    worker needs only this module, so an empty `__main__` stands in while the child is started."""
    with _MAIN_LOCK:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


@dataclass
class LocalShards(ShardedSearch):
    """Shards in worker processes of this machine ("spawn": a fresh interpreter, no state shared
    with this one); S defaults to `auto_shards`."""

    def __post_init__(self) -> None:
        self._procs: dict[int, Any] = {}  # shard -> its latest attempt's process
        self._context = multiprocessing.get_context("spawn")

    def _default_shards(self) -> int:
        return auto_shards(len(self.mirrors), self.config.trees_in_flight, self.model_spec)

    def _launch(self, shard: int, attempt: int, n_shards: int, items: list[tuple[int, TaskSpec, SearchTree | None]],
                events: Events) -> None:
        config = replace(self.config, trees_in_flight=_share(self.config.trees_in_flight, shard, n_shards))
        ours, theirs = self._context.Pipe(duplex=False)
        proc = self._context.Process(
            target=_worker, name=f"orchard-shard-{shard}", daemon=True,
            args=(theirs, self.env_spec, shard_model_spec(self.model_spec, shard, n_shards), asdict(config), items,
                  self.allow_http_key, dict(registry.BUILTIN)))
        with _bare_main():
            proc.start()
        theirs.close()  # the worker's end: only the worker holds it, so its death ends our reads
        self._procs[shard] = proc
        threading.Thread(target=_read, args=(ours, proc, shard, attempt, events), name=f"orchard-shard-{shard}-pipe",
                         daemon=True).start()

    def _stop(self) -> None:
        for proc in self._procs.values():
            if proc.is_alive():
                proc.kill()
        for proc in self._procs.values():
            proc.join(timeout=5)

    def run(self) -> SearchStats:
        try:
            return super().run()
        finally:
            for proc in self._procs.values():  # finished: each has sent its last message and exits
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()


def prepare_run(store: Store, env_spec: str, tasks: list[TaskSpec], model_spec: str, config: Any, name: str,
                **options: Any) -> LocalShards:
    """Create the run in the store and the local sharded search that grows it (options: LocalShards fields)."""
    run_id, mirrors = new_mirrors(store, env_spec, tasks, model_spec, config, name)
    return LocalShards(store, run_id, env_spec, model_spec, config, mirrors, **options)


def prepare_resume(store: Store, run_key: str, model_spec: str | None = None, **options: Any) -> LocalShards:
    """The local sharded search that continues run `run_key` (id, id prefix or name) from its committed
    simulations, with the run's model unless `model_spec`."""
    run_id = store.find_run(run_key)
    info, config, mirrors = resume_mirrors(store, run_id)
    return LocalShards(store, run_id, info.env, model_spec or info.model, config, mirrors, **options)
