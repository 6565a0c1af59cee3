"""Training jobs: each runs in its own process; its whole state lives in the store.

States: queued -> running -> succeeded | failed | cancelled (a queued job may be cancelled at once).
One job runs per device at a time; the others wait in the queue, oldest first. Nothing depends on
the process that submitted a job staying alive:

- `JobRunner.poll()` is the whole scheduler: it marks running jobs whose process has died as failed
  (a crash, an OOM kill, a reboot), then starts the oldest queued job of every idle device. The
  CLI, the dashboard and every finishing worker call it, so a queue drains without a daemon and a
  dashboard restart finds every job where it was.
- A worker (`python -m engine.train.worker JOB_ID --db PATH`) is started in its own session with
  its output in the job's log file; it writes progress, the metric stream and its outcome through
  its own store connection, in short transactions (SQLite WAL), so a worker killed at any moment
  leaves the store consistent.
- `cancel()` flags the job in the store and sends SIGTERM: the worker stops at the next training
  step, records `cancelled` and exits; one that does not within `grace_s` is killed (SIGKILL to its
  process group) and marked cancelled.

Job kinds and their config (JSON):
- dpo / sft / rft: {"model": "tiny" | PATH, "output": PATH | null, "runs": [RUN, ...], "train": {...}}
  where "train" holds `DPOTrainConfig` / `SFTTrainConfig` fields;
- eval: {"model", "env", "split", "tasks", "eval": {EvalConfig fields}, "recovery_runs": [RUN, ...]};
- iterate: {"iterate": {IterateConfig fields}};
- probe: {"steps": N, "seconds": S, "fail": bool} — the runner's own check: no ML imports, sleeps
  with progress (tests and `orchard jobs` smoke checks use it);
- search / pairs / revisions / refine: the long stages besides training (configs, devices and the
  `submit_<stage>` calls in engine/stages.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import ConfigError
from engine.stages import STAGE_KINDS
from engine.store import JobInfo, Store

JOB_KINDS = ("dpo", "sft", "rft", "eval", "iterate", "probe", *STAGE_KINDS)
WORKER_MODULE = "engine.train.worker"
STARTUP_GRACE_S = 60.0  # a claimed job with no pid yet is presumed starting for this long
# Between fork and exec a just-launched worker still has its parent's command line; for this long after
# its claim another poller (a second JobRunner, the dashboard's next rerun) only asks whether it is alive.
EXEC_GRACE_S = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_device() -> str:
    """cuda:0 where torch sees a GPU, else cpu (imports torch: call only when submitting)."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def validate_job(kind: str, config: dict[str, Any]) -> None:
    """Raise ConfigError for a config the worker could not run (checked before queueing)."""
    if kind not in JOB_KINDS:
        raise ConfigError(f"unknown job kind {kind!r} (expected one of {', '.join(JOB_KINDS)})")
    if not isinstance(config, dict):
        raise ConfigError("job config must be a JSON object")
    if kind in ("dpo", "sft", "rft"):
        unknown = set(config) - {"model", "output", "runs", "train", "name"}
        if unknown:
            raise ConfigError(f"{kind} job: unknown field(s) {', '.join(sorted(unknown))}")
        if not isinstance(config.get("model"), str) or not config["model"]:
            raise ConfigError(f"{kind} job: 'model' (tiny | PATH) is required")
        from engine.train.common import local_model_folder

        try:
            local_model_folder(config["model"])
        except ConfigError as e:
            raise ConfigError(f"{kind} job: {e}") from None
        train_config(kind, config.get("train") or {})
    elif kind == "eval":
        from engine.evaluate import EvalConfig

        unknown = set(config) - {"model", "env", "split", "tasks", "eval", "recovery_runs"}
        if unknown:
            raise ConfigError(f"eval job: unknown field(s) {', '.join(sorted(unknown))}")
        eval_config(config.get("eval") or {}, EvalConfig)
    elif kind == "iterate":
        from engine.train.iterate import IterateConfig

        IterateConfig.from_dict(config.get("iterate") or {})
    elif kind == "probe":
        unknown = set(config) - {"steps", "seconds", "fail"}
        if unknown:
            raise ConfigError(f"probe job: unknown field(s) {', '.join(sorted(unknown))}")
    elif kind in STAGE_KINDS:
        from engine.stages import validate_stage

        validate_stage(kind, config)


def check_device(device: str) -> None:
    """A job's device: cpu, cuda or cuda:N."""
    if device not in ("cpu", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ConfigError(f"job device {device!r}: expected cpu, cuda or cuda:N")


def train_config(kind: str, data: dict[str, Any]) -> Any:
    """The trainer config of a dpo/sft/rft job."""
    if kind == "dpo":
        from engine.train.dpo import DPOTrainConfig

        return DPOTrainConfig.from_dict(data, where="dpo job train config")
    from engine.train.sft import SFTTrainConfig

    if kind == "rft":
        data = {"kinds": ["rft"], **data}
    return SFTTrainConfig.from_dict(data, where=f"{kind} job train config")


def eval_config(data: dict[str, Any], cls: type | None = None) -> Any:
    from engine.evaluate import EvalConfig

    cls = cls or EvalConfig
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"eval config: unknown field(s) {', '.join(unknown)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


# ------------------------------------------------------------------ processes


def _proc_state(pid: int) -> str | None:
    """The process's state letter from /proc (None: no such process; "?": no /proc here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[0]


def process_alive(pid: int, job_id: str | None = None) -> bool:
    """Is `pid` a live (not zombie) process, and, where /proc tells, the worker of `job_id`?
    (Checking the command line guards against a recycled pid.)"""
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    if state == "?":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if job_id is not None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return True
        if WORKER_MODULE.encode() not in cmdline or job_id.encode() not in cmdline:
            return False
    return True


@dataclass
class JobRunner:
    """Submits, schedules, watches and cancels jobs of one database (see the module docstring).
    It keeps the handles of the workers it started so their exits are reaped (no zombies)."""

    store: Store
    python: str = sys.executable

    def __post_init__(self) -> None:
        self._children: dict[str, subprocess.Popen] = {}

    # --- submitting and scheduling

    def submit(self, kind: str, config: dict[str, Any], device: str | None = None, name: str | None = None,
               start: bool = True, validate: bool = True) -> JobInfo:
        """Queue a job (validated first) and start it if its device is idle."""
        if validate:
            validate_job(kind, config)
        device = device or default_device()
        check_device(device)
        job = self.store.create_job(kind, config, device, name=name)
        if start:
            self.poll()
        return self.store.job(job.id)

    def poll(self, device: str | None = None) -> list[str]:
        """Reap dead workers, then start queued jobs on idle devices; returns the ids started."""
        for job_id, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[job_id]
        now = time.time()
        for job in self.store.jobs(state="running"):
            if job.id in self._children:  # our own child and not reaped above: alive, maybe still starting
                continue
            if job.pid is None:
                dead = job.started_at is not None and now - job.started_at > STARTUP_GRACE_S
            else:
                young = job.started_at is not None and now - job.started_at < EXEC_GRACE_S
                dead = not process_alive(job.pid, None if young else job.id)
            if dead:
                self.store.finish_job(job.id, "failed", error=f"the job's process (pid {job.pid}) died without "
                                                               f"recording an outcome; see {job.log_path}")
        started = []
        devices = {j.device for j in self.store.jobs(state="queued")}
        for dev in sorted(devices):
            if device is not None and dev != device:
                continue
            job = self.store.claim_next_job(dev)
            if job is not None:
                self._launch(job)
                started.append(job.id)
        return started

    def _launch(self, job: JobInfo) -> None:
        log_path = Path(job.log_path or self.store.path.parent / "jobs" / f"{job.id}.log")
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1",
                   "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [self.python, "-m", WORKER_MODULE, job.id, "--db", str(self.store.path)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT), env=env,
                    start_new_session=True,
                )
        except OSError as e:
            self.store.finish_job(job.id, "failed", error=f"could not start the worker: {e}")
            return
        self._children[job.id] = proc
        self.store.set_job_pid(job.id, proc.pid)

    # --- watching

    def wait(self, job_id: str, timeout: float | None = None, interval: float = 0.2) -> JobInfo:
        """Poll until the job is final (or `timeout` seconds pass); returns its last state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll()
            job = self.store.job(job_id)
            if job.final or (deadline is not None and time.monotonic() > deadline):
                return job
            time.sleep(interval)

    # --- cancelling

    def cancel(self, job_id: str, grace_s: float = 30.0) -> JobInfo:
        """Cancel a queued job at once, or a running one: SIGTERM, a clean stop at the next step
        end, then SIGKILL after `grace_s` if it has not finished."""
        job = self.store.request_job_cancel(job_id)
        if job.final:
            return job
        if job.pid is not None and process_alive(job.pid, job.id):
            _signal_group(job.pid, signal.SIGTERM)
            # Wait for the process itself to end, not just for its recorded outcome: a worker that
            # has written "cancelled" may still be shutting down, and callers rely on it being gone.
            if not self._wait_exit(job_id, job.pid, grace_s):
                _signal_group(job.pid, signal.SIGKILL)
                self._wait_exit(job_id, job.pid, 10.0)
        self.store.finish_job(job_id, "cancelled", error="cancelled by request")
        self.poll()
        return self.store.job(job_id)

    def _wait_exit(self, job_id: str, pid: int, timeout: float) -> bool:
        """Wait up to `timeout` s for the worker to exit (reaping it if it is our child)."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self._children.get(job_id)
            if proc is not None:
                proc.poll()
            if not process_alive(pid, job_id):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the worker's process group (its own session), falling back to the process."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def job_summary(job: JobInfo) -> str:
    """One line for `orchard jobs`."""
    p = job.progress
    if p.get("total"):
        eta = f", ETA {p['eta_s']:.0f}s" if p.get("eta_s") is not None else ""
        prog = f"{p.get('phase', '')} {p.get('step', 0)}/{p['total']}{eta}".strip()
    else:
        prog = p.get("phase", "")
    when = time.strftime("%m-%d %H:%M", time.localtime(job.created_at))
    tail = job.error if job.state == "failed" and job.error else (job.output_path or "")
    return f"{job.id:<11} {job.kind:<8} {job.state:<10} {job.device:<7} {when:<12} {prog:<24} {tail}"

