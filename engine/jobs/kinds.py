"""Every job kind, once: kind -> (its spec dataclass, its body).

A job's JSON (`JobInfo.config`, what the CLI, the dashboard's forms and the `submit_*` calls queue)
is its spec's fields, left-out fields taking their defaults, and it is read only by
`load_job` — engine.config.from_dict, the one config loader, which names an unknown or mistyped
field — so the object a form builds, the one the CLI builds and the one the worker runs are the
same. A spec checks its own values (`__post_init__`); `check()`, where a spec has one, checks the
world it names (an env that starts, a model folder, an output folder) and is run before a job is
queued and again by the worker. JSON stored by older versions has the same keys and loads alike.

The bodies live beside their domain (engine/search/stage.py, engine/search/steer.py, engine/datasets/builds.py,
engine/evaluate.py, engine/train/training.py, engine/loop.py); only the probe, the
runner's own check, lives here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError, from_dict
from engine.datasets.builds import PairsJob, RefineJob, RevisionsJob, run_pairs, run_refine, run_revisions
from engine.evaluate import EvalJob, run_eval_job
from engine.loop import IterateJob, run_loop
from engine.progress import Reporter, StageResult
from engine.search.stage import ResumeSearch, SearchJob, run_search
from engine.search.steer import HumanBranch, MoreCandidates, SearchHere, run_steer
from engine.train.training import DPOJob, RFTJob, SFTJob, run_training

if TYPE_CHECKING:
    from engine.store import JobInfo, Store


@dataclass(frozen=True)
class ProbeJob:
    """The runner's own check: no ML imports, `steps` sleeps of `seconds` with progress, a failure
    half way when `fail` (tests and `orchard jobs` smoke checks use it)."""

    steps: int = 5
    seconds: float = 0.1
    fail: bool = False


def run_probe(spec: ProbeJob, reporter: Reporter) -> None:
    began = time.monotonic()
    for step in range(1, spec.steps + 1):
        if reporter.should_stop():
            return
        time.sleep(spec.seconds)
        if spec.fail and step == max(1, spec.steps // 2):
            raise RuntimeError(f"probe failure at step {step} (asked for by the job config)")
        elapsed = time.monotonic() - began
        reporter.progress({"phase": "probe", "step": step, "total": spec.steps,
                           "eta_s": elapsed / step * (spec.steps - step)})
        reporter.metrics(step, {"loss": 1.0 / step})


Body = Callable[["Store", "JobInfo", Any, Reporter], "str | None"]


@dataclass(frozen=True)
class JobKind:
    """A kind's specs (several: the first whose required fields the JSON holds), its body (returns
    the job's output: a model folder, a run, an evaluation or a file id), whether several GPUs may
    train it, and whether a cancel interrupts it at once (its loops never ask `should_stop`)."""

    specs: tuple[type, ...]
    body: Body
    multi_gpu: bool = False
    stops_at_once: bool = False


def _stage(result: StageResult, reporter: Reporter) -> str | None:
    for line in result.lines:
        reporter.log(line)
    return result.output


def _train(store: Store, job: JobInfo, spec: Any, reporter: Reporter) -> str | None:
    result = run_training(store, spec, reporter, job=job)
    return None if result.stopped else str(result.output)


KINDS: dict[str, JobKind] = {
    "dpo": JobKind((DPOJob,), _train, multi_gpu=True),
    "sft": JobKind((SFTJob,), _train, multi_gpu=True),
    "rft": JobKind((RFTJob,), _train, multi_gpu=True),
    "eval": JobKind((EvalJob,), lambda store, job, spec, r: run_eval_job(store, spec, r, job_id=job.id),
                    stops_at_once=True),
    "iterate": JobKind((IterateJob,), lambda store, job, spec, r: run_loop(store, spec.iterate, reporter=r,
                                                                           job_id=job.id), stops_at_once=True),
    "probe": JobKind((ProbeJob,), lambda store, job, spec, r: run_probe(spec, r)),
    "search": JobKind((ResumeSearch, SearchJob), lambda store, job, spec, r: _stage(run_search(store, spec, r), r)),
    # Steering a stored tree from the Tree explorer (engine/search/steer.py): live progress, one unit a simulation.
    "add_action": JobKind((HumanBranch,), lambda store, job, spec, r: _stage(run_steer(store, spec, r), r)),
    "search_here": JobKind((SearchHere,), lambda store, job, spec, r: _stage(run_steer(store, spec, r), r)),
    "more_candidates": JobKind((MoreCandidates,), lambda store, job, spec, r: _stage(run_steer(store, spec, r), r)),
    "pairs": JobKind((PairsJob,), lambda store, job, spec, r: _stage(
        run_pairs(store, spec, r, who=f"job {job.id}"), r)),
    "revisions": JobKind((RevisionsJob,), lambda store, job, spec, r: _stage(
        run_revisions(store, spec, r, who=f"job {job.id}"), r)),
    "refine": JobKind((RefineJob,), lambda store, job, spec, r: _stage(
        run_refine(spec, r, store=store, who=f"job {job.id}"), r)),
}
JOB_KINDS = tuple(KINDS)
MULTI_GPU_KINDS = tuple(k for k, v in KINDS.items() if v.multi_gpu)


def _required(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def load_job(kind: str, config: Any) -> Any:
    """The spec of a `kind` job from its JSON; ConfigError (one line naming the field) otherwise."""
    if kind not in KINDS:
        raise ConfigError(f"unknown job kind {kind!r} (expected one of {', '.join(JOB_KINDS)})")
    if not isinstance(config, dict):
        raise ConfigError(f"{kind} job: config must be a JSON object")
    specs = KINDS[kind].specs
    cls = next((c for c in specs if all(config.get(name) is not None for name in _required(c))), specs[-1])
    return from_dict(cls, config, where=f"{kind} job")


def validate_job(kind: str, config: Any) -> Any:
    """The job's spec, its world checked too (ConfigError, EnvError or GeneratorError: one line):
    run before a job is queued, and by the worker before it runs one. Cheap: no model is loaded and
    nothing is written (a search's env is made and reset once, then closed)."""
    spec = load_job(kind, config)
    check = getattr(spec, "check", None)
    if check is not None:
        check()
    return spec
