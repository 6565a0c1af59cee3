"""`python -m engine.jobs.worker JOB_ID --db PATH`: run one queued job in this process.

Started by `JobRunner` (engine.jobs.runner) with stdout/stderr in the job's log file. It records
progress, metrics and the outcome in the store, and a thread beats the job's heartbeat every few
seconds (a runner fails and kills a job whose heartbeat stops). SIGTERM (a cancel) stops training
cleanly at the next step end, and an eval or iterate job at once. Whatever happens — success, an
exception, a cancel — the job gets a final state, and the worker then starts the next queued job
of its device before exiting.

Under `accelerate launch` (a job naming several GPUs) every process runs this module and trains
its share; only rank 0 writes progress, metrics, the model record and the outcome (the launcher's
pid stays the job's pid, so a cancel signals the whole process group).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.store import JobInfo, Store, StoreError


class JobCancelled(BaseException):
    """Raised in the main thread by SIGTERM in jobs whose loops never ask `should_stop` (eval;
    iterate's search and evaluation phases), so a cancel takes effect at once instead of after the
    runner's grace period. A BaseException: no `except Exception` in library code swallows it, and
    the store's transactions roll back on it."""


def start_heartbeat(db: str | Path, job_id: str, every_s: float, stop: threading.Event) -> threading.Thread:
    """A daemon thread beating the job's heartbeat every `every_s` s on its own store connection
    (a Store is not shared across threads) until `stop` is set. WHY a thread: a job's phases
    (loading a model, an evaluation, a search) may report no progress for minutes; the beat says
    the process still runs Python, whatever the phase. It also turns a cancel requested in the store
    into this process's SIGTERM (once), as the runner's own cancel would send."""

    def beat() -> None:
        signalled = False
        try:
            with Store(db) as store:
                while not stop.wait(every_s):
                    try:
                        store.beat_job(job_id)
                        if not signalled and store.job(job_id).cancel_requested:
                            # A cancel from another machine (a shared store) sends no signal: this is it,
                            # so a job that never asks `should_stop` (eval) stops too.
                            signalled = True
                            os.kill(os.getpid(), signal.SIGTERM)
                    except StoreError as e:  # locked past the busy timeout, server gone: next time
                        print(f"heartbeat: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - the job itself goes on; a runner will see the silence
            print(f"heartbeat thread stopped: {type(e).__name__}: {e}", flush=True)

    thread = threading.Thread(target=beat, name="orchard-heartbeat", daemon=True)
    thread.start()
    return thread


def _heartbeat_every_s() -> float:
    from engine.jobs.runner import HEARTBEAT_EVERY_S

    try:
        value = float(os.environ.get("ORCHARD_JOB_HEARTBEAT_S") or HEARTBEAT_EVERY_S)
    except ValueError:
        return HEARTBEAT_EVERY_S
    return value if value > 0 else HEARTBEAT_EVERY_S


@dataclass
class StoreReporter:
    """A `Reporter` writing to the store: progress (at most every `every_s`, with a heartbeat),
    every metric record, and cancellation requested by signal or by the store's flag."""

    store: Store
    job_id: str
    every_s: float = 0.5
    cancelled: bool = False
    rank: int = 0  # > 0: a helper process of a multi-GPU run, which writes nothing to the store
    _last: float = field(default=0.0, repr=False)
    _checked: float = field(default=0.0, repr=False)

    def progress(self, data: dict[str, Any]) -> None:
        if self.rank:
            return
        now = time.monotonic()
        final = data.get("total") and data.get("step") == data.get("total")
        if final or now - self._last >= self.every_s or not data.get("step"):
            self.store.update_job_progress(self.job_id, data)
            self._last = now

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        if self.rank:
            return
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
        if self.rank:
            return  # rank 0 speaks for the run
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def process_rank() -> tuple[int, int]:
    """(rank, world size) of this process in an `accelerate launch` group; (0, 1) when alone."""
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def run_job(store: Store, job: JobInfo, reporter: StoreReporter) -> str | None:
    """Run `job` in this process: its spec read from its JSON and checked again (the world may have
    changed since it was queued), then its kind's body (engine/jobs/kinds.py); returns its output
    (model folder, run id, evaluation id or file)."""
    from engine.jobs import kinds

    kinds.validate_job(job.kind, job.config)
    return kinds.KINDS[job.kind].body(store, job, kinds.load_job(job.kind, job.config), reporter)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.jobs.worker")
    parser.add_argument("job_id")
    parser.add_argument("--db", required=True)
    args = parser.parse_args(argv)
    store = Store(args.db)
    job = store.job(args.job_id)
    if job.state != "running":
        print(f"job {job.id} is {job.state}, not running: nothing to do", flush=True)
        return 0
    rank, world = process_rank()
    if world == 1:
        store.set_job_pid(job.id, os.getpid())
    stop_beating = threading.Event()
    if rank == 0:
        start_heartbeat(store.location, job.id, _heartbeat_every_s(), stop_beating)
    reporter = StoreReporter(store, job.id, rank=rank)
    from engine.jobs.kinds import KINDS

    interrupt = {"armed": job.kind in KINDS and KINDS[job.kind].stops_at_once}

    def on_term(signum: int, frame: Any) -> None:
        reporter.cancelled = True
        if interrupt["armed"]:
            interrupt["armed"] = False
            raise JobCancelled(f"signal {signum}")
        reporter.log(f"signal {signum}: stopping at the next step")

    signal.signal(signal.SIGTERM, on_term)
    reporter.log(f"job {job.id} ({job.kind}) on {job.device}, pid {os.getpid()}"
                 + (f", {world} processes" if world > 1 else "")
                 + f", CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}")
    code = 0
    if rank:
        return _helper(store, job, reporter)
    try:
        try:
            output = run_job(store, job, reporter)
        finally:
            interrupt["armed"] = False
        if reporter.cancelled or store.job(job.id).cancel_requested:
            store.finish_job(job.id, "cancelled", error="cancelled by request")
            reporter.log("cancelled")
        else:
            if store.finish_job(job.id, "succeeded", output_path=output):
                reporter.log(f"succeeded{': ' + output if output else ''}")
            else:  # a runner had recorded another outcome meanwhile (e.g. failed it for a stale heartbeat)
                reporter.log(f"finished, but the job was already {store.job(job.id).state}: its outcome stands"
                             f"{' (output kept at ' + output + ')' if output else ''}")
    except BaseException as e:  # noqa: BLE001 - every outcome must be recorded
        from engine.errors import user_errors

        if store.con.in_transaction:  # interrupted between BEGIN and the transaction's own handler
            store.con.rollback()
        from engine.progress import Cancelled

        if isinstance(e, JobCancelled):
            reporter.log(f"{e}: stopped at once")
        elif isinstance(e, Cancelled) and reporter.cancelled:  # a stage that stopped at a unit boundary
            reporter.log(f"stopped: {' '.join(str(e).split())}")
        elif isinstance(e, user_errors()):  # a bad config, no data, a missing model: the reason is the whole story
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
        stop_beating.set()
        try:
            from engine.jobs.runner import JobRunner

            JobRunner(store).poll(device=job.device)
        finally:
            store.close()
    return code


def _helper(store: Store, job: JobInfo, reporter: StoreReporter) -> int:
    """A rank > 0 process of a multi-GPU run: train its share; rank 0 records everything."""
    try:
        run_job(store, job, reporter)
        return 0
    except BaseException:  # noqa: BLE001 - the launcher then ends the group; rank 0's log has the job's story
        print(f"rank {reporter.rank}:", flush=True)
        traceback.print_exc()
        return 1
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
