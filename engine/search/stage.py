"""The search stage: a search job's spec (`SearchJob`, `ResumeSearch`) and its body, `run_search`.

The CLI's `orchard search`, the dashboard's New search / Resume forms and the job worker all run a
search through `run_search` with one of these specs; a job's JSON is a spec's fields (left-out
fields take their defaults) and is read by the one config loader (engine.config.from_dict), so the
`SearchConfig` a form or a flag sets reaches the MCTS as that dataclass. A spec checks its own
fields; `check()` checks the world it names (the env starts, the task selection exists, Ray is
installed and the address well formed) without loading a model or writing anything.

Unit of progress: one simulation. A cancel (the reporter's `should_stop`) stops at the next one by
raising `Cancelled`, leaving the run `interrupted`, resumable like any other. `ray` (null: a local
search) is the address `orchard search --ray` takes: HOST:PORT, auto, or "" (start a local Ray); the
trees then grow on Ray workers and this process is the one store writer. `shards` (null: the rule of
engine.search.local_shards.auto_shards, 1 below 256 requests in flight) grows a local search's trees in
that many worker processes feeding this one, the store's one writer; on Ray it is the number of Ray tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError, SearchConfig
from engine.progress import Reporter, StageResult, Units

if TYPE_CHECKING:
    from engine.envs.base import Env, TaskSpec
    from engine.llm.base import Generator
    from engine.store import Store

DEFAULT_TASKS = 8  # a search job with no task selection searches the split's first tasks

Prepared = tuple["Callable[[], Env] | None", "list[TaskSpec]", "Generator | None"]


def check_ray(address: str | None) -> None:
    """An address of the form `--ray` takes, token auth where the cluster is remote, Ray importable
    (RayUnavailable says how to install it). Nothing is started or joined. None: not on Ray."""
    if address is None:
        return
    from engine.search.ray_search import check_address, check_auth, import_ray

    check_address(address)
    check_auth(address)  # a remote cluster without token auth: refused unless allowed
    import_ray()


def _text(field_name: str, value: str | None) -> None:
    if value is not None and not value.strip():
        raise ConfigError(f"search job: field {field_name!r} must be a non-empty string, got {value!r}")


def _shards(value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"search job: field 'shards' must be a whole number >= 1 (or left out), got {value!r}")


@dataclass(frozen=True)
class SearchJob:
    """A new search: `tasks` of `env`'s `split` ("" = its first `DEFAULT_TASKS`), grown by `model`
    with `search`'s settings into a run called `name` (default: env and time)."""

    env: str = "textcraft"
    tasks: str = ""
    split: str = "train"
    model: str = "tiny"
    name: str | None = None
    search: SearchConfig = field(default_factory=SearchConfig)
    allow_http_key: bool | None = None  # on Ray or in shards the workers load the model: the driver's choice
    ray: str | None = None
    shards: int | None = None  # None: engine.search.local_shards.auto_shards (or the Ray cluster's CPUs)

    def __post_init__(self) -> None:
        _text("model", self.model)
        _text("env", self.env)
        _shards(self.shards)

    def check(self) -> None:
        check_ray(self.ray)
        search_tasks(self)

    def run_name(self) -> str:
        return self.name or f"{self.env}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass(frozen=True)
class ResumeSearch:
    """The rest of an interrupted run `resume` (id, id prefix or name), by `model` (default: the run's own)."""

    resume: str
    model: str | None = None
    allow_http_key: bool | None = None
    ray: str | None = None
    shards: int | None = None

    def __post_init__(self) -> None:
        _text("resume", self.resume)
        _text("model", self.model)
        _shards(self.shards)

    def check(self) -> None:
        check_ray(self.ray)


def search_tasks(spec: SearchJob) -> tuple[Callable[[], Env], list[TaskSpec]]:
    """(env factory, tasks) of a new search; an unknown env, a bad selection or an env that cannot
    start (reset) is an error here, before anything is loaded or written."""
    from engine.envs.base import close_env
    from engine.envs.registry import env_factory, select_tasks

    make_env = env_factory(spec.env)
    env = make_env()
    try:
        selection = spec.tasks.strip()
        tasks = select_tasks(env, selection, spec.split) if selection else env.tasks(spec.split)[:DEFAULT_TASKS]
        if tasks:
            env.reset(tasks[0].id)
    finally:
        close_env(env)  # the probe; every tree makes its own env
    return make_env, tasks


def count_simulations(units: Units, threshold: float) -> Callable[[Any, Any], None]:
    """A run's progress callback (engine.search.runner.Progress): one unit per simulation, with the
    number of trees solved so far (a simulation reaching `threshold`) as `solved`."""
    solved: set[Any] = set()

    def on_sim(job: Any, sim: Any) -> None:
        if sim.reward >= threshold:
            solved.add(job.tree_id)
        units.step(solved=len(solved))

    return on_sim


def run_search(store: Store, spec: SearchJob | ResumeSearch, reporter: Reporter,
               make_env: Callable[[], Any] | None = None, prepared: Prepared | None = None) -> StageResult:
    """Search a new run, or resume one; returns the run's id (its output) and a line saying what was
    done. `prepared`: (env factory, tasks, generator) already checked and loaded by the caller (the
    CLI loads them before it opens the database)."""
    from engine.llm.registry import load_generator
    from engine.search.runner import new_run, resume_run

    if spec.ray is not None:
        return _run_search_on_ray(store, spec, reporter, prepared)
    model_spec, n_shards = _local_shards(store, spec, prepared, make_env)
    if n_shards > 1:
        return _run_search_in_shards(store, spec, reporter, prepared, model_spec, n_shards)
    if isinstance(spec, ResumeSearch):
        run_id = store.find_run(spec.resume)
        info = store.run(run_id)
        generator = prepared[2] if prepared and prepared[2] else load_generator(
            spec.model or info.model, log=reporter.log, allow_http_key=spec.allow_http_key)
        total = max(0, int(info.config.get("simulations", 0)) * info.trees - info.simulations)
        units = Units(reporter, f"resume {run_id}", total, run_id=run_id)
        run_id, stats = resume_run(store, run_id, generator, progress=lambda job, sim: units.step(),
                                   make_env=make_env)
        units.finish()
    else:
        cfg = spec.search
        if prepared:
            make_env, tasks, loaded = prepared
        else:
            factory, tasks = search_tasks(spec)
            make_env, loaded = make_env or factory, None
        generator = loaded or load_generator(spec.model, log=reporter.log, allow_http_key=spec.allow_http_key)
        units = Units(reporter, "search", cfg.simulations * len(tasks))
        run_id, stats = new_run(store, spec.env, tasks, generator, cfg, spec.run_name(),
                                count_simulations(units, cfg.success_threshold), make_env,
                                created=lambda made: units.extra.update(run_id=made))
        units.finish()
    info = store.run(run_id)
    line = (f"run {run_id} ({info.name}): {info.trees} trees, {stats.simulations} simulations, {info.solved} solved, "
            f"{stats.wall_s:.1f}s; db {store.path}")
    return StageResult(run_id, [line])


def _local_shards(store: Store, spec: SearchJob | ResumeSearch, prepared: Prepared | None,
                  make_env: Callable[[], Any] | None) -> tuple[str, int]:
    """(model spec, shard count) of a local search: the spec's `shards`, else `auto_shards`'s rule
    (1 when the caller passes its own env factory: worker processes can only build the run's env by name)."""
    from engine.search.local_shards import auto_shards

    loaded = prepared[2] if prepared else None
    if isinstance(spec, ResumeSearch):
        info = store.run(store.find_run(spec.resume))
        model = loaded.name if loaded is not None else spec.model or info.model
        trees, in_flight = info.trees, int(info.config.get("trees_in_flight") or SearchConfig().trees_in_flight)
    else:
        model = loaded.name if loaded is not None else spec.model
        trees = len(prepared[1]) if prepared else -1
        in_flight = spec.search.trees_in_flight
    if spec.shards is not None:
        return model, spec.shards
    if make_env is not None or auto_shards(trees if trees >= 0 else in_flight, in_flight, model) == 1:
        return model, 1  # (the tree count only lowers the rule's answer: a job's tasks are not read for a 1)
    if trees < 0:  # a job: its tasks are read (and the env started) once, here
        trees = len(search_tasks(spec)[1]) if isinstance(spec, SearchJob) else 0
    return model, auto_shards(trees, in_flight, model)


def _run_search_in_shards(store: Store, spec: SearchJob | ResumeSearch, reporter: Reporter, prepared: Prepared | None,
                          model_spec: str, n_shards: int) -> StageResult:
    """`run_search` with the trees grown by `n_shards` worker processes of this machine
    (engine/search/local_shards.py); this process is the one store writer. The workers load the model:
    a generator the caller loaded is closed unused, a spec nobody loaded yet is checked first."""
    from engine.llm.registry import check_model
    from engine.search.local_shards import prepare_resume, prepare_run

    loaded = prepared[2] if prepared else None
    if loaded is not None:
        close = getattr(loaded, "close", None)
        if callable(close):
            close()
    else:
        check_model(model_spec)
    options = {"shards": n_shards, "allow_http_key": spec.allow_http_key}
    if isinstance(spec, ResumeSearch):
        search = prepare_resume(store, spec.resume, model_spec, **options)
    else:
        tasks = prepared[1] if prepared else search_tasks(spec)[1]
        search = prepare_run(store, spec.env, tasks, model_spec, spec.search, spec.run_name(), **options)
    return _drive(store, spec, reporter, search, f"in {n_shards} local shards")


def _drive(store: Store, spec: SearchJob | ResumeSearch, reporter: Reporter, search: Any, where: str) -> StageResult:
    """Run a sharded search (engine.search.ray_search.ShardedSearch) with progress; the stage's result."""
    if isinstance(spec, ResumeSearch):
        done = sum(len(m.job.tree.simulations) for m in search.mirrors if m.job)
        units = Units(reporter, f"resume {search.run_id}",
                      max(0, search.config.simulations * len(search.mirrors) - done), run_id=search.run_id)
        search.progress = lambda job, sim: units.step()
    else:
        units = Units(reporter, "search", search.config.simulations * len(search.mirrors), run_id=search.run_id)
        search.progress = count_simulations(units, search.config.success_threshold)
    stats = search.run()
    units.finish()
    info = store.run(search.run_id)
    line = (f"run {search.run_id} ({info.name}): {info.trees} trees, {stats.simulations} simulations {where}, "
            f"{info.solved} solved, {stats.wall_s:.1f}s; db {store.path}")
    return StageResult(search.run_id, [line])


def _run_search_on_ray(store: Store, spec: SearchJob | ResumeSearch, reporter: Reporter,
                       prepared: Prepared | None) -> StageResult:
    """`run_search` with the trees grown by Ray workers (engine/search/ray_search.py). The workers
    load the model, so its spec is checked here on the driver first: a bad one is refused in one line
    before the run is written or a worker starts, as a local search refuses it before loading."""
    from engine.llm.registry import check_model
    from engine.search.ray_search import prepare_resume_on_ray, prepare_run_on_ray

    assert spec.ray is not None
    check_ray(spec.ray)
    address = spec.ray.strip() or None
    if isinstance(spec, ResumeSearch):
        run_id = store.find_run(spec.resume)
        model = spec.model or store.run(run_id).model
        check_model(model)
        search = prepare_resume_on_ray(store, run_id, model, address=address, allow_http_key=spec.allow_http_key,
                                       shards=spec.shards)
    else:
        if not prepared:  # the CLI checks the model and the tasks before it opens the database
            check_model(spec.model)
        tasks = prepared[1] if prepared else search_tasks(spec)[1]
        search = prepare_run_on_ray(store, spec.env, tasks, spec.model, spec.search, spec.run_name(),
                                    address=address, allow_http_key=spec.allow_http_key, shards=spec.shards)
    return _drive(store, spec, reporter, search, "on Ray")
