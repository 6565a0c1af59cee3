"""`python -m engine.train.worker JOB_ID --db PATH`: run one queued job in this process.

Started by `JobRunner` (engine.train.jobs) with stdout/stderr in the job's log file. It records
progress, metrics and the outcome in the store; SIGTERM (a cancel) stops training cleanly at the
next step end. Whatever happens — success, an exception, a cancel — the job gets a final state,
and the worker then starts the next queued job of its device before exiting.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.store import JobInfo, ModelRecord, Store


@dataclass
class StoreReporter:
    """A `Reporter` writing to the store: progress (at most every `every_s`, with a heartbeat),
    every metric record, and cancellation requested by signal or by the store's flag."""

    store: Store
    job_id: str
    every_s: float = 0.5
    cancelled: bool = False
    _last: float = field(default=0.0, repr=False)
    _checked: float = field(default=0.0, repr=False)

    def progress(self, data: dict[str, Any]) -> None:
        now = time.monotonic()
        final = data.get("total") and data.get("step") == data.get("total")
        if final or now - self._last >= self.every_s or not data.get("step"):
            self.store.update_job_progress(self.job_id, data)
            self._last = now

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        self.store.add_job_metrics(self.job_id, data, step=step)
        self.log(f"step {step}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in data.items()))

    def should_stop(self) -> bool:
        now = time.monotonic()
        if not self.cancelled and now - self._checked >= 1.0:
            self._checked = now
            self.cancelled = self.store.job(self.job_id).cancel_requested
        return self.cancelled

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _register_model(store: Store, job: JobInfo, result: Any, base: str) -> None:
    if result.output is None:
        return
    store.save_model(ModelRecord(
        path=str(result.output), name=Path(result.output).name, kind=job.kind, parent=base, job_id=job.id,
        data_ids=list(result.data_ids), config=dict(job.config.get("train") or {}), metrics=result.metrics,
    ))


def run_job(store: Store, job: JobInfo, reporter: StoreReporter) -> str | None:
    """Run `job` in this process; returns its output (model folder or evaluation id)."""
    from engine.train.jobs import train_config, validate_job

    validate_job(job.kind, job.config)
    cfg = job.config
    if job.kind == "probe":
        return _probe(cfg, reporter)
    from engine.stages import STAGE_KINDS, run_stage

    if job.kind in STAGE_KINDS:  # search, pairs, revisions, refine (engine/stages.py)
        return run_stage(store, job, reporter)
    if job.kind in ("dpo", "sft", "rft"):
        from dataclasses import replace

        from engine.train.common import default_output_dir, resolve_model_path

        train = train_config(job.kind, cfg.get("train") or {})
        if "device" not in (cfg.get("train") or {}):
            train = replace(train, device=job.device)
        base = resolve_model_path(cfg["model"], log=reporter.log)
        output = cfg.get("output") or str(default_output_dir(f"{job.kind}-{job.id}"))
        runs = cfg.get("runs") or None
        if job.kind == "dpo":
            from engine.train.dpo import select_pairs, train_dpo

            pairs = select_pairs(store, train, runs)
            tokens = store.node_token_counts([(p.tree_id, n) for p in pairs for n in (p.chosen_node, p.rejected_node)])
            result = train_dpo(base, pairs, train, output, reporter, node_tokens=tokens, parent=str(base))
        else:
            from engine.train.sft import select_samples, train_sft

            samples = select_samples(store, train, runs)
            result = train_sft(base, samples, train, output, reporter, kind=job.kind, parent=str(base))
        if result.stopped:
            return None
        _register_model(store, job, result, str(base))
        return str(result.output)
    if job.kind == "eval":
        from engine.stages import run_eval_job

        return run_eval_job(store, job, reporter)
    if job.kind == "iterate":
        from engine.train.iterate import IterateConfig, run_loop

        return run_loop(store, IterateConfig.from_dict(cfg.get("iterate") or {}), reporter=reporter, job_id=job.id)
    raise ValueError(f"unknown job kind {job.kind!r}")


def _probe(cfg: dict[str, Any], reporter: StoreReporter) -> str | None:
    steps, seconds = int(cfg.get("steps", 5)), float(cfg.get("seconds", 0.1))
    began = time.monotonic()
    for step in range(1, steps + 1):
        if reporter.should_stop():
            return None
        time.sleep(seconds)
        if cfg.get("fail") and step == max(1, steps // 2):
            raise RuntimeError(f"probe failure at step {step} (asked for by the job config)")
        elapsed = time.monotonic() - began
        reporter.progress({"phase": "probe", "step": step, "total": steps, "eta_s": elapsed / step * (steps - step)})
        reporter.metrics(step, {"loss": 1.0 / step})
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.train.worker")
    parser.add_argument("job_id")
    parser.add_argument("--db", required=True)
    args = parser.parse_args(argv)
    store = Store(args.db)
    job = store.job(args.job_id)
    if job.state != "running":
        print(f"job {job.id} is {job.state}, not running: nothing to do", flush=True)
        return 0
    store.set_job_pid(job.id, os.getpid())
    reporter = StoreReporter(store, job.id)

    def on_term(signum: int, frame: Any) -> None:
        reporter.cancelled = True
        reporter.log(f"signal {signum}: stopping at the next step")

    signal.signal(signal.SIGTERM, on_term)
    reporter.log(f"job {job.id} ({job.kind}) on {job.device}, pid {os.getpid()}")
    code = 0
    try:
        output = run_job(store, job, reporter)
        if reporter.cancelled or store.job(job.id).cancel_requested:
            store.finish_job(job.id, "cancelled", error="cancelled by request")
            reporter.log("cancelled")
        else:
            store.finish_job(job.id, "succeeded", output_path=output)
            reporter.log(f"succeeded{': ' + output if output else ''}")
    except BaseException as e:  # noqa: BLE001 - every outcome must be recorded
        from engine.cli import user_errors

        if isinstance(e, user_errors()):  # a bad config, no data, a missing model: the reason is the whole story
            reporter.log(f"failed: {type(e).__name__}: {' '.join(str(e).split())}")
        else:
            traceback.print_exc()
        sys.stdout.flush()
        if reporter.cancelled:
            store.finish_job(job.id, "cancelled", error="cancelled by request")
        else:
            message = f"{type(e).__name__}: {e}".strip()
            store.finish_job(job.id, "failed", error=message[:2000])
            code = 1
    finally:
        try:
            from engine.train.jobs import JobRunner

            JobRunner(store).poll(device=job.device)
        finally:
            store.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
