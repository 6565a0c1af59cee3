"""The long stages besides training — search, pairs build, revisions build, refine generate — as jobs.

WHY one module: a stage's body (`run_search`, `run_pairs`, `run_revisions`, `run_refine`) is the one
place its work is done; the job worker (`python -m engine.train.worker`, kinds search / pairs /
revisions / refine) and the CLI's foreground commands both call it, with different Reporters
(the store's, or a progress bar on stderr). Each body reports units done / total with an ETA
(simulations, trees, trees, personas), logs through the reporter, and stops at the next unit when
`reporter.should_stop()` (a cancel: SIGTERM or the store's flag) by raising `Cancelled`. A cancelled
search leaves its run `interrupted`, resumable like any other.

`submit_<stage>(store, ...)` checks a job's inputs before anything is queued (the same checks the
worker repeats: fields and ranges, the env and the task selection, the model spec — a folder that
exists, a server that answers within `MODEL_TIMEOUT_S`) and returns the queued job's id.

Devices: every job goes through the one queue, whose slots are devices. Pairs builds need none and
take the `cpu` slot; search, revisions and refine take the `cpu` slot when their model is `tiny` or
a remote server (`openai:`) or run on Ray (the workers load the model), else the machine's default
device (`cuda:0` where there is one).

Job configs (JSON):
- search: {"env", "tasks" ("" = the first 8), "split", "model", "name", "search": {SearchConfig fields},
  "allow_http_key", "ray"} or {"resume": RUN, "model": spec | null (the run's own), "ray"}; "ray" (absent
  or null: a local search) is the address `orchard search --ray` takes: HOST:PORT, auto, or "" (start a
  local Ray); the trees then grow on Ray workers and this job's process is the one store writer;
- pairs: {"run", "alpha" (null = the run's), "theta", "trajectory_pairs"};
- revisions: {"run", "model" (the judge), RevisionConfig fields (alpha_good, beta_gap, ...)};
- refine: {"model", "n", "out", "personas", "seed", "refine": {RefineConfig fields}}.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.config import ConfigError
from engine.paths import runs_dir

STAGE_KINDS = ("search", "pairs", "revisions", "refine")
MODEL_TIMEOUT_S = 2.0
REVISION_CHUNK = 8  # trees judged together: one batch of judge requests per step index across them
DEFAULT_TASKS = 8

_FIELDS = {
    "search": {"env", "tasks", "split", "model", "name", "search", "allow_http_key", "resume", "ray"},
    "pairs": {"run", "alpha", "theta", "trajectory_pairs"},
    "revisions": {"run", "model", "alpha_good", "beta_gap", "max_per_task", "noop_command", "judge_max_tokens",
                  "seed"},
    "refine": {"model", "n", "out", "personas", "seed", "refine"},
}


class Cancelled(Exception):
    """A stage stopped at a unit boundary because a cancel was requested."""


@dataclass
class StageResult:
    """What a stage made (`output`: a run id or a file) and the lines that say so."""

    output: str | None
    lines: list[str] = field(default_factory=list)


class _Units:
    """Units done / total with an ETA, sent to a reporter; a cancel request raises `Cancelled`."""

    def __init__(self, reporter: Any, phase: str, total: int, **extra: Any) -> None:
        self.reporter, self.phase, self.total, self.extra = reporter, phase, total, extra
        self.done, self.began = 0, time.monotonic()
        reporter.progress({"phase": phase, "step": 0, "total": total, **extra})

    def step(self, n: int = 1, **extra: Any) -> None:
        self.done += n
        self.extra.update(extra)
        elapsed = time.monotonic() - self.began
        eta = elapsed / self.done * max(0, self.total - self.done) if self.done else None
        self.reporter.progress({"phase": self.phase, "step": min(self.done, self.total) if self.total else self.done,
                                "total": self.total, "eta_s": eta if self.total else None, **self.extra})
        self.check()

    def finish(self) -> None:
        """The stage is done: the units it did are the whole (a search can end early, e.g. a tree exhausted)."""
        self.reporter.progress({"phase": self.phase, "step": self.done, "total": self.done, "eta_s": 0.0,
                                **self.extra})

    def check(self) -> None:
        if self.reporter.should_stop():
            raise Cancelled(f"{self.phase}: cancelled after {self.done} of {self.total}")


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "orchard"


# ------------------------------------------------------------------ checks


def _fields(kind: str, config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ConfigError(f"{kind} job: config must be a JSON object")
    unknown = sorted(set(config) - _FIELDS[kind])
    if unknown:
        raise ConfigError(f"{kind} job: unknown field(s) {', '.join(unknown)}")
    return config


def _text(kind: str, config: dict[str, Any], key: str, required: bool = True) -> str | None:
    value = config.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{kind} job: field {key!r} must be a non-empty string, got {value!r}")
    return value


def search_config(config: dict[str, Any]) -> Any:
    """The SearchConfig of a search job (defaults for what it leaves out)."""
    from engine.config import SearchConfig, from_dict

    settings = config.get("search") or {}
    if not isinstance(settings, dict):
        raise ConfigError("search job: field 'search' must be a table of SearchConfig settings")
    return from_dict(SearchConfig, settings, where="search job settings")


def pairs_config(config: dict[str, Any], run_alpha: float = 0.5) -> Any:
    from engine.config import from_dict
    from engine.datasets.pairs import PairsConfig

    data = {k: config[k] for k in ("alpha", "theta", "trajectory_pairs") if config.get(k) is not None}
    return from_dict(PairsConfig, {"alpha": run_alpha, **data}, where="pairs job")


def revision_config(config: dict[str, Any]) -> Any:
    from engine.config import from_dict
    from engine.datasets.revisions import RevisionConfig

    data = {k: v for k, v in config.items() if k not in ("run", "model") and v is not None}
    return from_dict(RevisionConfig, data, where="revisions job")


def refine_config(config: dict[str, Any]) -> Any:
    from engine.config import from_dict
    from engine.datasets.refine import RefineConfig

    settings = dict(config.get("refine") or {})
    if config.get("seed") is not None:
        settings["seed"] = config["seed"]
    return from_dict(RefineConfig, settings, where="refine job settings")


def search_tasks(config: dict[str, Any]) -> tuple[Callable[[], Any], list[Any]]:
    """(env factory, tasks) of a new search; an unknown env, a bad selection or an env that cannot
    start (reset) is an error here, before anything is loaded or written."""
    from engine.envs.base import close_env
    from engine.envs.registry import env_factory, select_tasks

    make_env = env_factory(config.get("env") or "textcraft")
    env = make_env()
    try:
        split = config.get("split") or "train"
        spec = (config.get("tasks") or "").strip()
        tasks = select_tasks(env, spec, split) if spec else env.tasks(split)[:DEFAULT_TASKS]
        if tasks:
            env.reset(tasks[0].id)
    finally:
        close_env(env)  # the probe; every tree makes its own env
    return make_env, tasks


def validate_stage(kind: str, config: Any) -> None:
    """Raise ConfigError (or EnvError) for a stage job config that could not run. Cheap: no model
    is loaded and nothing is written (a search's env is made and reset once, then closed)."""
    config = _fields(kind, config)
    if kind == "search":
        if config.get("resume") is not None:
            _text(kind, config, "resume")
            extra = sorted(set(config) - {"resume", "model", "allow_http_key", "ray"})
            if extra:
                raise ConfigError(f"search job: a resume takes only 'model' and 'ray', not {', '.join(extra)}")
            _text(kind, config, "model", required=False)
            check_ray(config)
            return
        _text(kind, config, "model", required=False)
        check_ray(config)
        search_config(config)
        search_tasks(config)
    elif kind == "pairs":
        _text(kind, config, "run")
        pairs_config(config)
    elif kind == "revisions":
        _text(kind, config, "run")
        _text(kind, config, "model")
        revision_config(config)
    elif kind == "refine":
        _text(kind, config, "model")
        n = config.get("n", 30)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"refine job: field 'n' must be an integer >= 1, got {n!r}")
        refine_config(config)
        out = config.get("out")
        if out is not None and (not isinstance(out, str) or Path(out).is_dir()):
            raise ConfigError(f"refine job: field 'out' must be a file name, got {out!r}")
    else:
        raise ConfigError(f"unknown stage {kind!r} (expected one of {', '.join(STAGE_KINDS)})")


def check_ray(config: dict[str, Any]) -> None:
    """A search job's "ray" field (absent or null: not on Ray): an address of the form `--ray` takes,
    and Ray importable (RayUnavailable says how to install it). Nothing is started or joined."""
    if config.get("ray") is None:
        return
    from engine.search.ray_search import check_address, check_auth, import_ray

    check_address(config["ray"])
    check_auth(config["ray"])  # a remote cluster without token auth: refused unless allowed
    import_ray()


def check_model(spec: str, timeout: float = MODEL_TIMEOUT_S) -> None:
    """GeneratorError unless `spec` names a model that can be loaded: `tiny`, a model folder, or an
    `openai:URL#MODEL` server that answers (any HTTP status) within `timeout` seconds."""
    from engine.llm.base import GeneratorError
    from engine.llm.registry import _model_dir, parse_model_spec

    parsed = parse_model_spec(spec)
    spec = parsed.text
    if parsed.kind == "tiny":
        return
    if parsed.kind == "openai":
        import urllib.error
        import urllib.parse
        import urllib.request

        url, sep, model = parsed.target.partition("#")
        parts = urllib.parse.urlsplit(url)
        if not sep or not model or parts.scheme not in ("http", "https") or not parts.hostname:
            raise GeneratorError(f"model {spec!r}: expected openai:http(s)://HOST[:PORT]/PATH#MODEL")
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout):
                pass
        except urllib.error.HTTPError:
            return  # it answered (an auth error or a 404 is still a server)
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise GeneratorError(f"model {spec!r}: the server at {url} did not answer within {timeout:g}s "
                                 f"({reason})") from None
        return
    _model_dir(parsed.target)


# ------------------------------------------------------------------ bodies


def run_search(store: Any, config: dict[str, Any], reporter: Any, make_env: Callable[[], Any] | None = None,
               prepared: tuple[Callable[[], Any] | None, list[Any], Any] | None = None) -> StageResult:
    """Search a new run, or resume one (`config["resume"]`); unit: one simulation. `prepared`:
    (env factory, tasks, generator) already checked and loaded by the caller (the CLI loads them
    before it opens the database)."""
    from engine.llm.registry import load_generator
    from engine.search.runner import new_run, resume_run

    allow = config.get("allow_http_key")
    if config.get("ray") is not None:
        return _run_search_on_ray(store, config, reporter, prepared)
    if config.get("resume"):
        run_id = store.find_run(config["resume"])
        info = store.run(run_id)
        generator = prepared[2] if prepared else load_generator(config.get("model") or info.model, log=reporter.log,
                                                                 allow_http_key=allow)
        total = max(0, int(info.config.get("simulations", 0)) * info.trees - info.simulations)
        units = _Units(reporter, f"resume {run_id}", total, run_id=run_id)

        def on_sim_resume(job: Any, sim: Any) -> None:
            units.step()

        run_id, stats = resume_run(store, run_id, generator, progress=on_sim_resume, make_env=make_env)
        units.finish()
    else:
        cfg = search_config(config)
        if prepared:
            make_env, tasks, generator = prepared
        else:
            factory, tasks = search_tasks(config)
            make_env = make_env or factory
            generator = load_generator(config.get("model") or "tiny", log=reporter.log, allow_http_key=allow)
        env_spec = config.get("env") or "textcraft"
        name = config.get("name") or f"{env_spec}-{time.strftime('%Y%m%d-%H%M%S')}"
        units = _Units(reporter, "search", cfg.simulations * len(tasks))
        solved = set()
        known: dict[str, str] = {}

        def on_sim(job: Any, sim: Any) -> None:
            if "run_id" not in known:  # the run exists once the first simulation is committed: the newest of its name
                known["run_id"] = max((r for r in store.runs() if r.name == name), key=lambda r: r.created_at).id
            if sim.reward >= cfg.success_threshold:
                solved.add(job.tree_id)
            units.step(solved=len(solved), run_id=known["run_id"])

        run_id, stats = new_run(store, env_spec, tasks, generator, cfg, name, on_sim, make_env)
        units.finish()
    info = store.run(run_id)
    line = (f"run {run_id} ({info.name}): {info.trees} trees, {stats.simulations} simulations, {info.solved} solved, "
            f"{stats.wall_s:.1f}s; db {store.path}")
    return StageResult(run_id, [line])


def _run_search_on_ray(store: Any, config: dict[str, Any], reporter: Any,
                       prepared: tuple[Callable[[], Any] | None, list[Any], Any] | None) -> StageResult:
    """`run_search` with the trees grown by Ray workers (engine/search/ray_search.py). The workers
    load the model, so its spec is checked here on the driver first: a bad one is refused in one line
    before the run is written or a worker starts, as a local search refuses it before loading."""
    from engine.search.ray_search import prepare_resume_on_ray, prepare_run_on_ray

    check_ray(config)
    address = config["ray"].strip() or None
    if config.get("resume"):
        run_id = store.find_run(config["resume"])
        info = store.run(run_id)
        model = config.get("model") or info.model
        check_model(model)
        search = prepare_resume_on_ray(store, run_id, model, address=address,
                                       allow_http_key=config.get("allow_http_key"))
        done = sum(len(m.job.tree.simulations) for m in search.mirrors if m.job)
        units = _Units(reporter, f"resume {run_id}", max(0, search.config.simulations * len(search.mirrors) - done),
                       run_id=run_id)
    else:
        cfg = search_config(config)
        model = config.get("model") or "tiny"
        if not prepared:  # the CLI checks the model and the tasks before it opens the database
            check_model(model)
        tasks = prepared[1] if prepared else search_tasks(config)[1]
        env_spec = config.get("env") or "textcraft"
        name = config.get("name") or f"{env_spec}-{time.strftime('%Y%m%d-%H%M%S')}"
        search = prepare_run_on_ray(store, env_spec, tasks, model, cfg, name, address=address,
                                    allow_http_key=config.get("allow_http_key"))
        units = _Units(reporter, "search", cfg.simulations * len(tasks), run_id=search.run_id)
    threshold = search.config.success_threshold
    solved: set[Any] = set()

    def on_sim(job: Any, sim: Any) -> None:
        if sim.reward >= threshold:
            solved.add(job.tree_id)
        units.step(**({} if config.get("resume") else {"solved": len(solved)}))

    search.progress = on_sim
    stats = search.run()
    units.finish()
    info = store.run(search.run_id)
    line = (f"run {search.run_id} ({info.name}): {info.trees} trees, {stats.simulations} simulations on Ray, "
            f"{info.solved} solved, {stats.wall_s:.1f}s; db {store.path}")
    return StageResult(search.run_id, [line])


def run_trees(store: Any, run_id: str) -> list[Any]:
    """The run's committed trees as TreeRefs, with the env description their prompts used."""
    from engine.datasets.samples import tree_refs
    from engine.envs.base import close_env
    from engine.envs.registry import env_factory

    env = env_factory(store.run(run_id).env)()
    try:
        description = env.describe()
    finally:
        close_env(env)
    return tree_refs(store, run_id, description)


def rollout_only_hint(refs: list[Any], threshold: float) -> str | None:
    """Why whole-trajectory data came out empty when the search did succeed: runs stored before
    rollout steps were kept have, for a success that happened in a rollout, only its commands."""
    wins = sum(1 for ref in refs for sim in ref.tree.simulations
               if sim.reward >= threshold and sim.rollout and not sim.turns)
    leaves = sum(1 for ref in refs for n in ref.tree.nodes if n.terminal is not None and (n.reward or 0) >= threshold)
    if wins and not leaves:
        return (f"note: {wins} simulations succeeded in rollouts stored without their steps (a run from an "
                "older Orchard), and no tree leaf is a success, so no whole successful trajectory exists "
                "here; search again to keep the rollouts' steps")
    return None


def run_pairs(store: Any, config: dict[str, Any], reporter: Any, who: str | None = None) -> StageResult:
    """Step pairs, trajectory pairs and RFT rows of a run (docs/algorithms.md §3); unit: one tree.
    Saved in one transaction at the end (a build replaces the run's uncurated pairs as a whole)."""
    from engine.datasets.pairs import PairsBuild, build_pairs

    run_id = store.find_run(config["run"])
    config_ = pairs_config(config, store.run(run_id).config.get("alpha", 0.5))
    refs = run_trees(store, run_id)
    units = _Units(reporter, "pairs", len(refs), run_id=run_id)
    built = PairsBuild()
    for ref in refs:
        one = build_pairs([ref], config_)
        built.step += one.step
        built.trajectory += one.trajectory
        built.rft += one.rft
        built.exit += one.exit
        units.step(pairs=len(built.step) + len(built.trajectory))
    who = who or _who()
    pairs, rft = built.save(store, run_id, who=who)
    lines = [(f"run {run_id}: {len(refs)} trees -> {len(built.step)} step pairs, {len(built.trajectory)} trajectory "
             f"pairs (alpha={config_.alpha}, theta={config_.theta}), {len(built.rft)} RFT rows, "
             f"{len(built.exit)} expert-iteration rows"),
             f"pairs: {pairs}; RFT and expert-iteration rows: {rft}; db {store.path}"]
    hint = None if built.rft else rollout_only_hint(refs, 1.0)
    lines += [hint] if hint else []
    return StageResult(run_id, lines)


def run_revisions(store: Any, config: dict[str, Any], reporter: Any, who: str | None = None,
                  judge: Any = None) -> StageResult:
    """Revision, good and recovery samples of a run, first errors judged by `config["model"]`
    (docs/algorithms.md §4); unit: one tree. Rows are saved per chunk of `REVISION_CHUNK` trees
    as they are judged (the Trajectories page fills while it runs); the last save prunes the
    uncurated rows of an earlier build that this one no longer makes."""
    from engine.datasets.revisions import RevisionBuild, build_counts, build_revisions, why_little
    from engine.llm.registry import load_generator

    run_id = store.find_run(config["run"])
    config_ = revision_config(config)
    refs = run_trees(store, run_id)
    judge = judge or load_generator(config["model"], log=reporter.log)
    who = who or _who()
    units = _Units(reporter, "revisions", len(refs), run_id=run_id)
    total = RevisionBuild()
    for start in range(0, len(refs), REVISION_CHUNK):
        units.check()
        chunk = refs[start:start + REVISION_CHUNK]
        built = build_revisions(chunk, judge, config_)
        store.save_samples(built.samples, who=who)
        for name in ("revision", "good", "recovery"):
            getattr(total, name).extend(getattr(built, name))
        for name in ("pairs", "judge_calls", "judge_requests", "garbled"):
            setattr(total, name, getattr(total, name) + getattr(built, name))
        units.step(len(chunk), samples=len(total.samples))
    report = store.save_samples(total.samples, prune_run=run_id, prune_kinds=("revision", "good", "recovery"), who=who)
    found = sum(1 for s in total.revision if s.source["error_found"])
    lines = [(f"run {run_id}: {len(refs)} trees -> {len(total.revision)} revision trajectories ({found} with a "
             f"judged error), {len(total.good)} good trajectories, {len(total.recovery)} recovery prefixes; "
             f"judge {judge.name}: {total.judge_calls} batched calls, {total.judge_requests} judgements, "
             f"{total.garbled} garbled"),
             f"samples: {report}; db {store.path}"]
    hint = None if total.good else rollout_only_hint(refs, 1.0)
    lines += [hint] if hint else []
    counts = build_counts(refs, config_, total)
    note = why_little(counts, config_)
    lines += [note] if note else []
    units.extra.update(counts=counts, note=note)  # the Trajectories page says why a build made nothing
    units.finish()
    return StageResult(run_id, lines)


def run_refine(config: dict[str, Any], reporter: Any, generator: Any = None) -> StageResult:
    """AgentRefine refinement data (docs/algorithms.md §5) into a JSONL file; unit: one persona
    (verified or dropped). Rows stream to `OUT.partial`, renamed into place when complete, so a
    cancel keeps what was verified there and never touches an existing OUT."""
    from engine.datasets.refine import (
        DEFAULT_PERSONAS,
        generate,
        load_personas,
        sample_personas,
        summary,
        to_row,
    )
    from engine.llm.registry import load_generator

    settings = refine_config(config)
    personas = sample_personas(load_personas(config.get("personas") or DEFAULT_PERSONAS), int(config.get("n", 30)),
                               settings.seed)
    out = Path(config["out"]) if config.get("out") else runs_dir() / f"refine-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name")
    generator = generator or load_generator(config["model"], log=reporter.log)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.partial")
    written = 0
    units = _Units(reporter, "refine", len(personas))
    try:
        with partial.open("w", encoding="utf-8") as f:

            def write(sample: Any) -> None:
                nonlocal written
                f.write(json.dumps(to_row(sample), ensure_ascii=False) + "\n")
                f.flush()
                written += 1

            def on_batch(stats: Any) -> None:
                units.step(stats.rows + stats.failed - units.done, rows=stats.rows)

            result = generate(generator, personas, settings, on_sample=write, on_batch=on_batch)
        units.finish()
    except BaseException:
        if written:
            reporter.log(f"refine: stopped; the {written} verified rows so far are in {partial}")
        else:
            partial.unlink(missing_ok=True)
        raise
    os.replace(partial, out)
    stats = result.stats.to_dict()
    stats_path = out.with_name(out.name.removesuffix(".jsonl") + ".stats.json")
    stats_path.write_text(
        json.dumps({"model": generator.name, "personas": [p.id for p in personas], "config": asdict(settings),
                    "stats": stats, "failures": result.failures}, indent=1, ensure_ascii=False),
        encoding="utf-8",
    )
    lines = [*summary(stats), f"wrote {out} ({stats['rows']} rows) and {stats_path}"]
    return StageResult(str(out), lines)


def run_stage(store: Any, job: Any, reporter: Any) -> str | None:
    """The worker's entry for a stage job: runs its body, logs what it made; returns its output
    (run id or file)."""
    body = {"search": lambda: run_search(store, job.config, reporter),
            "pairs": lambda: run_pairs(store, job.config, reporter, who=f"job {job.id}"),
            "revisions": lambda: run_revisions(store, job.config, reporter, who=f"job {job.id}"),
            "refine": lambda: run_refine(job.config, reporter)}[job.kind]
    result = body()
    for line in result.lines:
        reporter.log(line)
    return result.output


# ------------------------------------------------------------------ submitting


# ------------------------------------------------------------------ the CLI's reporter


class ConsoleReporter:
    """A Reporter for the CLI's foreground commands: a progress bar and log lines on stderr."""

    def __init__(self, unit: str = "it") -> None:
        self.unit = unit
        self._bar: Any = None  # a tqdm bar (tqdm ships no types), made on the first progress()

    def progress(self, data: dict[str, Any]) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=data.get("total") or 0, desc=data.get("phase", ""), unit=self.unit,
                             file=sys.stderr, dynamic_ncols=True)
        self._bar.n = data.get("step") or 0
        if "solved" in data:
            self._bar.set_postfix(solved=data["solved"], refresh=False)
        self._bar.refresh()

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def log(self, message: str) -> None:
        self.close()
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def config_fields(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help) of a config dataclass's fields: help from each field's metadata (the
    CLI's flags read the same), else the `# comment` after it in its source (the dashboard's forms
    show every setting without a hand-copied list)."""
    import inspect
    import re

    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        source = ""
    comments = dict(re.findall(r"^\s+(\w+):[^=\n]*=[^#\n]*#\s*(.+)$", source, re.MULTILINE))
    return [(f.name, f.default, str(f.metadata.get("help") or comments.get(f.name, "")).strip()) for f in fields(cls)]


# ------------------------------------------------------------------ evaluations and the loop


class CountedGenerator:
    """A Generator whose batched calls are an evaluation's units: progress after each, and a cancel
    honoured before the next (an eval job's `Cancelled`). With policy modes one call advances every
    episode one step, so the total is the step budget; MCTS makes many calls per step (no total)."""

    def __init__(self, inner: Any, units: _Units) -> None:
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


def run_eval_job(store: Any, job: Any, reporter: Any) -> str:
    """An eval job: `run_eval` with its generator counted (progress, cancel at the next model call);
    returns the evaluation id."""
    from engine.evaluate import run_eval

    settings = job.config.get("eval") or {}
    mode = settings.get("mode", "greedy")
    if mode == "mcts":
        units = _Units(reporter, "evaluate (mcts): model calls", 0)
    else:
        steps = int(settings.get("max_steps", 15)) * (2 if job.config.get("recovery_runs") else 1)
        units = _Units(reporter, f"evaluate ({mode}): steps", steps)
    eval_id = run_eval(store, job.config, log=reporter.log, job_id=job.id,
                       wrap=lambda generator: CountedGenerator(generator, units))
    units.finish()
    return eval_id
