"""Submitting jobs: what the dashboard's forms and the CLI call to queue the long stages.

Each `submit_*` builds a job's JSON, checks it (its spec loads, engine.jobs.kinds; the env and tasks,
the model reachable, the run known, a Ray address answering) and queues it with the job runner
(engine/jobs/runner.py); nothing is queued or written when a check fails.

Devices: every job goes through the one queue, whose slots are devices. Pairs builds need none and
take the `cpu` slot; search, revisions and refine take the `cpu` slot when their model is `tiny` or
a remote server (`openai:`) (or, for refine, `offline`, the scripted synthesizer) or run on Ray (the workers load the model), else the machine's default
device (`cuda:0` where there is one).
"""

from __future__ import annotations

from typing import Any

from engine.config import ConfigError
from engine.jobs.kinds import validate_job
from engine.jobs.runner import JobRunner
from engine.llm.registry import check_model
from engine.search.stage import ResumeSearch
from engine.train.common import default_device


def stage_device(kind: str, config: dict[str, Any]) -> str:
    """The queue slot of a stage job (see the module docstring)."""
    if kind == "pairs" or (kind == "search" and config.get("ray") is not None):
        return "cpu"  # a search on Ray: the workers load the model; this job only commits
    model = str(config.get("model") or "tiny").strip()
    if model in ("tiny", "offline") or model.startswith("openai:"):
        return "cpu"
    return default_device()


def submit_stage(store: Any, kind: str, config: dict[str, Any], device: str | None = None, name: str | None = None,
                 runner: JobRunner | None = None) -> str:
    """Check a stage job (its spec, env and tasks, model reachable, run known, Ray address answering)
    and queue it; returns its id. Nothing is queued or written when a check fails."""
    from engine.search.ray_search import probe_address

    spec = validate_job(kind, config)
    if kind in ("pairs", "revisions"):
        store.find_run(spec.run)
    if isinstance(spec, ResumeSearch):
        run_id = store.find_run(spec.resume)
        if spec.ray is not None and not spec.model:
            check_model(store.run(run_id).model)  # Ray workers would each fail on a bad stored spec
    if getattr(spec, "model", None) and not getattr(spec, "offline", False):  # refine's `offline` loads nothing
        check_model(spec.model)
    if kind == "search" and spec.ray is not None:
        probe_address(spec.ray)  # a HOST:PORT nothing answers: refused now, not a job that waits
    runner = runner or JobRunner(store)
    job = runner.submit(kind, config, device=device or stage_device(kind, config), name=name or _name(kind, config),
                        validate=False)
    return job.id


def _name(kind: str, config: dict[str, Any]) -> str:
    if kind == "search":
        return f"search-{config['resume']}" if config.get("resume") else (config.get("name") or "search")
    return f"{kind}-{config['run']}" if config.get("run") else kind


STEER_KINDS = ("add_action", "search_here", "more_candidates")


def submit_steer(store: Any, kind: str, config: dict[str, Any], device: str | None = None,
                 runner: JobRunner | None = None) -> str:
    """Queue a job that grows a stored tree at one node (engine/search/steer.py): the run, task and
    node exist, the run is not being searched, a human action reads and the env takes it, all checked
    first (nothing stored, no model loaded); its slot is its model's (default: the run's own)."""
    from engine.search.steer import check_steer

    if kind not in STEER_KINDS:
        raise ConfigError(f"not a steering job kind: {kind!r} (expected one of {', '.join(STEER_KINDS)})")
    spec = validate_job(kind, config)
    check_steer(store, spec)
    model = spec.model or store.run(store.find_run(spec.run)).model
    if spec.model:
        check_model(spec.model)
    runner = runner or JobRunner(store)
    job = runner.submit(kind, config, device=device or stage_device(kind, {"model": model}),
                        name=f"{kind}-{spec.run}-{spec.task}-{spec.at}", validate=False)
    return job.id


def submit_search(store: Any, env: str = "textcraft", tasks: str = "", split: str = "train", model: str | None = None,
                  name: str | None = None, search: dict[str, Any] | None = None, resume: str | None = None,
                  device: str | None = None, ray: str | None = None, shards: int | None = None) -> str:
    """Queue a new search (model default `tiny`) or, with `resume`, the rest of an interrupted run
    (model default: the run's own); `ray`: grow the trees on Ray (the address `--ray` takes: HOST:PORT,
    auto, or "" for a local Ray); `shards`: worker processes (or Ray tasks) that grow them (None: the
    automatic count, engine.search.local_shards.auto_shards); returns the job id."""
    if resume:
        config: dict[str, Any] = {"resume": resume, **({"model": model} if model else {})}
    else:
        config = {"env": env, "tasks": tasks, "split": split, "model": model or "tiny",
                  "name": name,
                  "search": search or {}}
    if ray is not None:
        config["ray"] = ray
    if shards is not None:
        config["shards"] = shards
    return submit_stage(store, "search", config, device=device)


def submit_pairs(store: Any, run: str, alpha: float | None = None, theta: float = 0.1, trajectory_pairs: int = 4,
                 device: str | None = None, min_visits: int = 1) -> str:
    return submit_stage(store, "pairs", {"run": run, "alpha": alpha, "theta": theta,
                                         "trajectory_pairs": trajectory_pairs, "min_visits": min_visits}, device=device)


def submit_revisions(store: Any, run: str, model: str, device: str | None = None, **settings: Any) -> str:
    """`settings`: RevisionConfig fields (alpha_good, beta_gap, max_per_task, ...)."""
    return submit_stage(store, "revisions", {"run": run, "model": model, **settings}, device=device)


def submit_refine(store: Any, model: str, n: int = 30, out: str | None = None, personas: str | None = None,
                  seed: int | None = None, refine: dict[str, Any] | None = None, device: str | None = None) -> str:
    return submit_stage(store, "refine", {"model": model, "n": n, "out": out, "personas": personas, "seed": seed,
                                          "refine": refine or {}}, device=device)


def eval_job_config(model: str, env: str = "textcraft", split: str = "test", tasks: str = "",
                    eval: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"model": model, "env": env, "split": split, "tasks": tasks, "eval": eval or {}}


def check_eval(config: dict[str, Any]) -> None:
    """An eval job's inputs: its spec, its env and task selection (EnvError), its model."""
    spec = validate_job("eval", config)
    check_model(spec.model)


def submit_eval(store: Any, model: str, env: str = "textcraft", split: str = "test", tasks: str = "",
                eval: dict[str, Any] | None = None, device: str | None = None) -> str:
    """Queue an evaluation (`eval`: EvalConfig fields: mode greedy | sampled | mcts, its budget ...)."""
    config = eval_job_config(model, env, split, tasks, eval)
    check_eval(config)
    job = JobRunner(store).submit("eval", config, device=device or stage_device("eval", config),
                                  name=f"eval-{(eval or {}).get('mode', 'greedy')}", validate=False)
    return job.id


def next_iteration_config(store: Any, loop_id: str) -> dict[str, Any]:
    """The iterate job that runs loop `loop_id`'s next iteration: the loop's own settings, its newest
    model as the policy, one iteration numbered after its last, no base evaluation."""
    records = store.iterations(loop_id)
    if not records:
        raise ConfigError(f"loop {loop_id!r}: no iterations recorded")
    base = next((r.get("config") for r in records if isinstance(r.get("config"), dict)), None) or {}
    base = {**_evaluated_as(store, records), **base}
    last = max(records, key=lambda r: r["idx"])
    # the policy the loop continues with: the newest promoted one (a gated-out candidate is not)
    model = next((str(r.get("policy") or r["model"]) for r in sorted(records, key=lambda r: -r["idx"])
                  if r.get("policy") or r.get("model")), base.get("model", "tiny"))
    return {**base, "method": last.get("method", base.get("method", "agentq")), "model": model, "iterations": 1,
            "evaluate_base": False, "name": loop_id, "first_iteration": int(last["idx"]) + 1}


def _evaluated_as(store: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The held-out split, tasks and EvalConfig overrides of the loop's first stored evaluation. WHY: a
    loop recorded without its settings (the demo's) would otherwise be evaluated on the whole test split
    with `EvalConfig()`'s defaults, and its new model read beside a base evaluated otherwise."""
    from dataclasses import asdict

    from engine.evaluate import EvalConfig

    ids = [(r.get("eval") or {}).get("eval_id") for r in sorted(records, key=lambda r: r["idx"])]
    by_id = {e["id"]: e for e in store.evaluations()}
    first = next((by_id[i] for i in ids if i in by_id), None)
    if first is None:
        return {}
    defaults = asdict(EvalConfig())
    changed = {k: v for k, v in first["config"].items()
               if k in defaults and k != "mode" and v != (list(defaults[k]) if isinstance(defaults[k], tuple) else defaults[k])}
    return {"eval_split": first["split"], "eval_tasks": ",".join(first["task_ids"]),
            "eval": {"mode": first["mode"], **changed}}


def submit_iterate(store: Any, iterate: dict[str, Any], device: str | None = None) -> str:
    """Queue an iterate job (`iterate`: IterateConfig fields); its model is checked first."""
    spec = validate_job("iterate", {"iterate": iterate})
    check_model(spec.iterate.model)
    job = JobRunner(store).submit("iterate", {"iterate": iterate}, device=device or default_device(),
                                  name=f"iterate-{iterate.get('name') or iterate.get('method', 'agentq')}", validate=False)
    return job.id
