"""Training jobs' specs (`DPOJob`, `SFTJob`, `RFTJob`) and `run_training`: the one path from a spec
to a trained, registered model.

Both the job worker (engine.jobs.worker) and `orchard train --foreground` call it, so a model
trained in a job and one trained in the foreground are selected, trained and recorded alike. A
dpo / sft / rft job's JSON is its spec's fields ({"model", "output", "runs", "train", "name"}, the
"train" table the kind's TrainConfig), read by engine.config.from_dict (`train_job`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError, from_dict, to_dict
from engine.progress import Reporter
from engine.train.common import TrainResult
from engine.train.dpo import DPOTrainConfig
from engine.train.sft import RFTTrainConfig, SFTTrainConfig

if TYPE_CHECKING:
    from engine.store import JobInfo, Store


@dataclass(frozen=True)
class _TrainJob:
    """`model` (tiny | a local model folder) trained on the curated data of `runs` (none: every run)
    into `output` (default: a folder named after the job)."""

    model: str
    output: str | None = None
    runs: tuple[str, ...] = ()
    name: str | None = None

    kind = ""  # the job kind (a class attribute, not a field)

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise ConfigError(f"{self.kind} job: 'model' (tiny | PATH) is required")

    def check(self) -> None:
        """The start model is a local folder (or tiny) and the output folder may be written."""
        from engine.train.common import check_output_folder, local_model_folder

        try:
            local_model_folder(self.model)
            if self.output:
                check_output_folder(self.output)
        except ConfigError as e:
            raise ConfigError(f"{self.kind} job: {e}") from None


@dataclass(frozen=True)
class DPOJob(_TrainJob):
    train: DPOTrainConfig = field(default_factory=DPOTrainConfig)
    kind = "dpo"


@dataclass(frozen=True)
class SFTJob(_TrainJob):
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    kind = "sft"


@dataclass(frozen=True)
class RFTJob(_TrainJob):
    train: RFTTrainConfig = field(default_factory=RFTTrainConfig)
    kind = "rft"


TrainJob = DPOJob | SFTJob | RFTJob
TRAIN_JOBS: dict[str, type[DPOJob | SFTJob | RFTJob]] = {"dpo": DPOJob, "sft": SFTJob, "rft": RFTJob}


def train_job(kind: str, data: Any) -> TrainJob:
    """The spec of a dpo / sft / rft job from its JSON (ConfigError naming the field)."""
    return from_dict(TRAIN_JOBS[kind], data, where=f"{kind} job")


def run_training(store: Store, spec: TrainJob, reporter: Reporter, job: JobInfo | None = None) -> TrainResult:
    """Train per a dpo/sft/rft job's spec and register the model; returns the trainer's result.

    `job`: the running job this is (the worker): its device is the default device and its id names
    the output folder. None (`train --foreground`): training runs here, and a finished job is
    recorded for it afterwards, so the model has a job like any other. The job records the curation
    decisions behind every item it trains on (`store.job_decisions`).
    """
    from engine.train.common import default_output_dir, resolve_model_path

    kind, train = spec.kind, spec.train
    if job is not None and train.device != "cpu":
        # The runner made only the job's GPUs visible (CUDA_VISIBLE_DEVICES), numbered from 0.
        train = replace(train, device="cpu" if job.device == "cpu" else "cuda")
    base = resolve_model_path(spec.model, log=reporter.log)
    suffix = job.id if job is not None else time.strftime("%Y%m%d-%H%M%S")
    output = spec.output or str(default_output_dir(f"{kind}-{suffix}"))
    if Path(output, "orchard_train.json").is_file():
        reporter.log(f"{output} holds a model; a successful run replaces it (its record is kept, marked replaced)")
    runs = list(spec.runs) or None
    if isinstance(train, DPOTrainConfig):
        from engine.train.dpo import labelled_pairs, run_backends, train_dpo

        pairs, labels = labelled_pairs(store, train, runs)
        item_kind = "pair"
        if job is not None:
            store.record_job_decisions(job.id, item_kind, labels)
        tokens = store.node_token_counts([(p.tree_id, n) for p in pairs for n in (p.chosen_node, p.rejected_node)])
        result = train_dpo(base, pairs, train, output, reporter, node_tokens=tokens, parent=str(base),
                           backends=run_backends(store, [p.run_id for p in pairs]))
    else:
        from engine.train.sft import labelled_samples, train_sft

        samples, labels = labelled_samples(store, train, runs)
        item_kind = "sample"
        if job is not None:
            store.record_job_decisions(job.id, item_kind, labels)
        result = train_sft(base, samples, train, output, reporter, kind=kind, parent=str(base))
    if result.stopped or result.output is None:  # a rank > 0 process of a multi-GPU run saves nothing
        return result
    if job is None:
        job = store.create_job(kind, to_dict(spec), train.device, name=f"{kind}-foreground")
        store.finish_job(job.id, "succeeded", output_path=str(result.output), expect=("queued",))
        job = store.job(job.id)
        store.record_job_decisions(job.id, item_kind, labels)
    register_model(store, job, result, str(base))
    return result


def register_model(store: Store, job: JobInfo, result: Any, base: str) -> None:
    """Record the trained model (its data, config and metrics) in the store's model registry."""
    from engine.store import ModelRecord

    if result.output is None:
        return
    store.save_model(ModelRecord(
        path=str(result.output), name=Path(result.output).name, kind=job.kind, parent=base, job_id=job.id,
        data_ids=list(result.data_ids), config=dict(job.config.get("train") or {}), metrics=result.metrics,
    ))
