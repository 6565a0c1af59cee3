"""`run_training`: the one path from a dpo/sft/rft job config to a trained, registered model.

Both the job worker (engine.train.worker) and `orchard train --foreground` call it, so a model
trained in a job and one trained in the foreground are selected, trained and recorded alike.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.train.common import Reporter, TrainResult

if TYPE_CHECKING:
    from engine.store import JobInfo, Store


def run_training(store: Store, kind: str, config: dict[str, Any], reporter: Reporter,
                 job: JobInfo | None = None) -> TrainResult:
    """Train per a dpo/sft/rft job `config` and register the model; returns the trainer's result.

    `job`: the running job this is (the worker): its device is the default device and its id names
    the output folder. None (`train --foreground`): training runs here, and a finished job is
    recorded for it afterwards, so the model has a job like any other. The job records the curation
    decisions behind every item it trains on (`store.job_decisions`).
    """
    from engine.train.common import default_output_dir, resolve_model_path
    from engine.train.jobs import train_config

    train = train_config(kind, config.get("train") or {})
    if job is not None and train.device != "cpu":
        # The runner made only the job's GPUs visible (CUDA_VISIBLE_DEVICES), numbered from 0.
        train = replace(train, device="cpu" if job.device == "cpu" else "cuda")
    base = resolve_model_path(config["model"], log=reporter.log)
    suffix = job.id if job is not None else time.strftime("%Y%m%d-%H%M%S")
    output = config.get("output") or str(default_output_dir(f"{kind}-{suffix}"))
    if Path(output, "orchard_train.json").is_file():
        reporter.log(f"{output} holds a model; a successful run replaces it (its record is kept, marked replaced)")
    runs = config.get("runs") or None
    if kind == "dpo":
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
        job = store.create_job(kind, config, train.device, name=f"{kind}-foreground")
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
