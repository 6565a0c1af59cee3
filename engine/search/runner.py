"""A search run end to end: env + tasks + generator + config -> trees in the store.

The glue between MCTS and the Store: every finished simulation's rows are taken when it ends and
committed on a clock (`COMMIT_EVERY_S`: all that finished since the last commit in one transaction,
checked after each batch of replies the scheduler hands out), and at once when the run ends or fails.
The run's status and stats are kept current, and `resume` continues an interrupted run from what was
committed (a kill -9 loses the simulations in progress and, with a clock above 0, those finished within
the last tick). The default clock is 0, a commit after every batch: measured, a 0.25 s clock halves the
commit share but does not shorten a search (docs/decisions.md, "Search commits after every batch").
Every env a run makes is closed when the run ends, also when it fails.

`writer="thread"` commits on a thread of its own with its own store connection (`CommitThread`): the
search's thread hands each batch over and goes on while SQLite or psycopg writes (both release the GIL
there); a batch that waits behind a write is merged into the next transaction. The run's end waits for
every batch, so the run is finished only once all of it is stored; a kill -9 loses the batches still
queued as well. Not the default: it did not shorten a search here (docs/decisions.md, "The search's commits stay on
its own thread by default; a commit thread is an option").
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

from engine.config import SearchConfig, from_dict
from engine.envs.base import Env, EnvError, TaskSpec, close_env, close_envs
from engine.envs.registry import env_factory
from engine.llm.base import Generator
from engine.search.mcts import MCTS, SearchStats, TreeJob, start_tree
from engine.store import Store, StoreError
from engine.store.runs import SimulationRows, simulation_rows
from engine.tree_nodes import Simulation

Progress = Callable[[TreeJob, Simulation], None]

# Finished simulations wait at most this long for their commit (the run's end and a failure commit at
# once). 0 commits after every batch of replies; see docs/decisions.md, "Search commits after every batch".
COMMIT_EVERY_S = 0.0


WRITERS = ("inline", "thread")


class CommitThread:
    """Finished simulations' rows committed on a thread of its own, in the order handed over: what queued
    up behind one transaction goes into the next together. A failure is raised on the search's thread at
    its next hand-over or at `close`, as a StoreError naming the cause."""

    def __init__(self, location: str) -> None:
        self._queue: queue.SimpleQueue[list[SimulationRows] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.busy_s = 0.0  # time spent in transactions (on its own thread)
        self._reported = False
        self._thread = threading.Thread(target=self._loop, args=(location,), name="orchard-commit", daemon=True)
        self._thread.start()

    def _loop(self, location: str) -> None:
        store: Store | None = None
        try:
            store = Store(location)
            while True:
                batch = self._queue.get()
                end = batch is None
                rows = list(batch or [])
                while not end and not self._queue.empty():  # everything queued meanwhile: one transaction
                    more = self._queue.get_nowait()
                    end = more is None
                    rows += more or []
                t = time.perf_counter()
                store.save_simulations(rows)
                self.busy_s += time.perf_counter() - t
                if end:
                    return
        except BaseException as e:  # noqa: BLE001 - raised on the search's thread (check)
            self.error = e
        finally:
            if store is not None:
                store.close()

    def check(self) -> None:
        """Raise the thread's failure, once: the run then stops as after an inline commit's failure (what the
        failed transaction held and what is handed over after it are not stored; resume searches them again)."""
        if self.error is not None and not self._reported:
            self._reported = True
            raise StoreError(f"committing the search's simulations: {' '.join(str(self.error).split())}") from self.error

    def put(self, batch: list[SimulationRows]) -> None:
        self.check()
        self._queue.put(batch)

    def close(self) -> None:
        """Wait until everything handed over is committed (or the thread failed), then `check`."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.check()


def _run(store: Store, run_id: str, jobs: list[TreeJob], generator: Generator, config: SearchConfig,
         progress: Progress | None, commit_every: float = COMMIT_EVERY_S, writer: str = "inline") -> SearchStats:
    if writer not in WRITERS:
        raise ValueError(f"writer must be one of {', '.join(WRITERS)}, not {writer!r}")
    pending: list[SimulationRows] = []
    last_commit = [time.monotonic()]
    thread: CommitThread | None = None  # started just before the search (closed by commit_rest)

    def on_simulation(job: TreeJob, sim: Simulation) -> None:
        assert job.tree_id is not None
        pending.append(simulation_rows(job.tree_id, job.tree, sim, job.committed_nodes))
        if progress is not None:
            # Per simulation, so a cancel (raised here) stops at the next one; the run's forced commit
            # (`commit_rest`) then stores everything that finished, this one included.
            progress(job, sim)

    def commit(force: bool = False) -> None:
        """Every simulation finished since the last commit, in one transaction, once `commit_every`
        seconds have passed since it (or when `force`d: the run's end, also after a failure)."""
        if pending and (force or time.monotonic() - last_commit[0] >= commit_every):
            batch = list(pending)
            pending.clear()
            if thread is not None:
                thread.put(batch)
            else:
                store.save_simulations(batch)
            last_commit[0] = time.monotonic()

    def commit_rest() -> None:
        t = time.perf_counter()
        try:
            commit(force=True)
        finally:
            if thread is not None:
                try:
                    thread.close()
                finally:
                    mcts.stats.writer_s = thread.busy_s
        spent = time.perf_counter() - t
        mcts.stats.commit_s += spent
        mcts.stats.wall_s += spent

    mcts = MCTS(generator, config, on_simulation=on_simulation, on_batch=commit)
    store.set_run_status(run_id, "running")
    try:
        try:
            if writer == "thread":
                thread = CommitThread(store.location)
            stats = mcts.run(jobs)
            commit_rest()
        except BaseException as e:
            unsaved = None
            try:
                commit_rest()
            except Exception as c:  # noqa: BLE001 - the run is left interrupted whatever; `e` is what stopped it
                unsaved = " ".join(str(c).split())[:300]
            # Resumable once the cause is fixed; the reason is kept with the run (one line).
            reason = " ".join(str(e).split())[:500]
            why = [reason] if isinstance(e, Exception) else []
            why += [f"and the last simulations were not stored: {unsaved}"] if unsaved else []
            store.set_run_status(run_id, "interrupted",
                                 {**mcts.stats.to_dict(), **({"error": "; ".join(why)} if why else {})})
            if isinstance(e, EnvError):  # a broken env (e.g. a NaN reward): say how to go on once it is fixed
                raise EnvError(f"{reason}; run {run_id} is left interrupted: fix the env, then "
                               f"`orchard search --resume {run_id}`") from None
            raise
        store.set_run_status(run_id, "finished", stats.to_dict())
    finally:
        close_envs(jobs)  # each job's env (TreeJob.close is idempotent)
    return stats


def _start_trees(tasks: list[TaskSpec], make_env: Callable[[], Env], target: int) -> list[TreeJob]:
    """One started tree per task; if one cannot start, the envs already made are closed."""
    jobs: list[TreeJob] = []
    try:
        for task in tasks:
            jobs.append(start_tree(task, make_env, target))
    except BaseException:
        close_envs(jobs)
        raise
    return jobs


def new_run(
    store: Store,
    env_spec: str,
    tasks: list[TaskSpec],
    generator: Generator,
    config: SearchConfig,
    name: str,
    progress: Progress | None = None,
    make_env: Callable[[], Env] | None = None,
    created: Callable[[str], None] | None = None,
    commit_every: float = COMMIT_EVERY_S,
    writer: str = "inline",
) -> tuple[str, SearchStats]:
    """Create a run for `tasks` and search them; returns (run id, stats). `created` is told the run
    id as soon as the run is recorded, before the first simulation (a caller's progress names it).
    `writer`: "inline" commits on the search's thread, "thread" on a commit thread (module docstring)."""
    make_env = make_env or env_factory(env_spec)
    # Every tree's env is reset before the run is recorded: an env that cannot start (no browser,
    # no Java) is an error that leaves no half-made run behind.
    jobs = _start_trees(tasks, make_env, config.simulations)
    try:
        run_id = store.create_run(name, env_spec, generator.name, asdict(config), tasks)
        ids = {task_id: tree_id for tree_id, task_id in store.tree_ids(run_id)}
        for job in jobs:
            job.tree_id = ids[job.tree.task.id]
    except BaseException:
        close_envs(jobs)
        raise
    if created is not None:
        created(run_id)
    return run_id, _run(store, run_id, jobs, generator, config, progress, commit_every, writer)


def resume_run(
    store: Store,
    run_key: str,
    generator: Generator,
    progress: Progress | None = None,
    make_env: Callable[[], Env] | None = None,
) -> tuple[str, SearchStats]:
    """Continue run `run_key` (id, id prefix or name) to its configured simulation count."""
    run_id = store.find_run(run_key)
    info = store.run(run_id)
    config = from_dict(SearchConfig, info.config, where=f"run {run_id} config")
    make_env = make_env or env_factory(info.env)
    env = make_env()
    jobs: list[TreeJob] = []
    try:
        by_id = {}
        for split in ("train", "test"):
            by_id.update({t.id: t for t in env.tasks(split)})
        description = env.describe()
        for tree_id, task_id in store.tree_ids(run_id):
            tree = store.load_tree(tree_id)
            if tree is None:  # never committed a simulation: start it afresh
                if task_id not in by_id:
                    raise StoreError(f"run {run_id}: task {task_id!r} no longer exists in env {info.env}")
                job = start_tree(by_id[task_id], make_env, config.simulations)
                job.committed_nodes = 0
            else:
                job = TreeJob(tree=tree, make_env=make_env, env_description=description,
                              target=config.simulations, committed_nodes=len(tree.nodes))
            job.tree_id = tree_id
            jobs.append(job)
    except BaseException:
        close_envs(jobs)
        raise
    finally:
        close_env(env)  # the catalogue env: each tree has its own
    return run_id, _run(store, run_id, jobs, generator, config, progress)
