"""The job queue's runner: each job runs in its own process; its whole state lives in the store.

States: queued -> running -> succeeded | failed | cancelled (a queued job may be cancelled at once).
One job runs per device at a time (jobs naming a shared GPU wait too); the others wait in the queue,
oldest first. A worker sees only its job's GPUs (CUDA_VISIBLE_DEVICES; a cuda:1 job's GPU is
cuda:0 inside it), and a training job naming several (cuda:0,1) runs one process per GPU under
`accelerate launch` (`worker_command`). Nothing depends on
the process that submitted a job staying alive:

- `JobRunner.poll()` is the whole scheduler: it marks running jobs whose process has died as failed
  (a crash, an OOM kill, a reboot), and those whose heartbeat is older than `heartbeat_timeout_s` as
  failed ("no heartbeat for N s"), killing their process group (a hung worker: stopped, frozen, or
  stuck in native code holding the GIL), then starts the oldest queued job of every idle device. The
  CLI, the dashboard and every finishing worker call it, so a queue drains without a daemon and a
  dashboard restart finds every job where it was.
- A worker (`python -m engine.jobs.worker JOB_ID --db PATH`) is started in its own session with
  its output in the job's log file; it writes progress, the metric stream and its outcome through
  its own store connection, in short transactions (SQLite WAL), so a worker killed at any moment
  leaves the store consistent. A thread of the worker beats the job's heartbeat every few seconds
  whatever the job is doing (loading a model, a long evaluation), so a stale heartbeat means the
  process no longer runs Python, not that a phase is slow.
- `cancel()` flags the job in the store and sends SIGTERM: a training worker stops at the next
  training step, an eval or iterate worker at once (its loops have no step-end check), records
  `cancelled` and exits; one that does not within `grace_s` is killed (SIGKILL to its
  process group) and marked cancelled.

Job kinds, their specs (the shape of a job's JSON) and bodies: engine/jobs/kinds.py. Every path in
a config (model folders, outputs) is made absolute when the job is submitted (`resolve_job_paths`):
the worker runs in the repository root, not where the job was typed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from engine.config import ConfigError
from engine.jobs.kinds import MULTI_GPU_KINDS, validate_job
from engine.paths import REPO_ROOT, job_log, jobs_dir
from engine.progress import progress_line
from engine.store import JobInfo, Store
from engine.train.common import check_device, default_device, device_gpus, gpu_indices

WORKER_MODULE = "engine.jobs.worker"
# The worker module of older versions: a job it still runs after an upgrade is not taken for dead.
_WORKER_MODULES = (WORKER_MODULE, "engine.jobs.worker")
STARTUP_GRACE_S = 60.0  # a claimed job with no pid yet is presumed starting for this long
HEARTBEAT_EVERY_S = 5.0  # a worker's heartbeat thread beats this often (ORCHARD_JOB_HEARTBEAT_S overrides)
# A beat this recent says the worker lives wherever it runs: a pid is only checked on this machine (a
# SQLite store is one machine's; on a shared PostgreSQL store the job may run on a teammate's).
FRESH_BEAT_S = 3 * HEARTBEAT_EVERY_S
HEARTBEAT_TIMEOUT_S = 120.0  # a running job whose last beat is older than this has hung: failed, killed
# Between fork and exec a just-launched worker still has its parent's command line; for this long after
# its claim another poller (a second JobRunner, the dashboard's next rerun) only asks whether it is alive.
EXEC_GRACE_S = 10.0


def absolute_path(text: str, cwd: str | Path | None = None) -> str:
    """`text` as an absolute, normalised path (`~` expanded), relative to `cwd` (default: ours)."""
    return os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(text)))


def _model_spec_path(spec: str, cwd: str | Path | None) -> str:
    """A model spec with its folder made absolute (`tiny`, refine's `offline` and server specs unchanged)."""
    text = spec.strip()
    if text in ("tiny", "offline") or text.startswith("openai:"):
        return spec
    if text.startswith("vllm:"):  # its engine options (after '?') stay as typed
        folder, sep, query = text[len("vllm:"):].partition("?")
        return "vllm:" + absolute_path(folder, cwd) + sep + query
    if text.startswith("hf:"):
        return "hf:" + absolute_path(text[len("hf:"):], cwd)
    return absolute_path(text, cwd)


def resolve_job_paths(kind: str, config: dict[str, Any], cwd: str | Path | None = None) -> dict[str, Any]:
    """A copy of a job config with every path in it absolute, relative to `cwd` (default: the
    submitting process's). WHY here, once, at submission: the worker runs in the repository root
    and may be started by another process (the dashboard, a finishing worker) with another cwd, so
    a path kept as typed would name a different file there. The store's path is absolute already
    (Store.path); model specs keep their `hf:` / `vllm:` prefix."""
    if not isinstance(config, dict):
        return config
    out = dict(config)

    def fix(table: dict[str, Any], key: str, model: bool = False) -> None:
        value = table.get(key)
        if isinstance(value, str) and value.strip():
            table[key] = _model_spec_path(value, cwd) if model else absolute_path(value, cwd)

    def nested(table: dict[str, Any], key: str) -> dict[str, Any] | None:
        """`table[key]` copied (so the caller's config is not changed), when it is an object."""
        if not isinstance(table.get(key), dict):
            return None
        table[key] = dict(table[key])
        return table[key]

    if kind in ("dpo", "sft", "rft", "eval", "search", "revisions", "refine", "add_action", "search_here",
                "more_candidates"):
        fix(out, "model", model=True)
    if kind in ("dpo", "sft", "rft"):
        fix(out, "output")
    if kind == "refine":
        fix(out, "out")
        fix(out, "personas")
    if kind == "search" and (search := nested(out, "search")) is not None:
        fix(search, "value_model")
    if kind == "eval" and (settings := nested(out, "eval")) is not None:
        fix(settings, "mcts_value_model")
    if kind == "iterate" and (loop := nested(out, "iterate")) is not None:
        fix(loop, "model", model=True)
        fix(loop, "output_root")
        for key, inner in (("search", "value_model"), ("eval", "mcts_value_model")):
            if (table := nested(loop, key)) is not None:
                fix(table, inner)
    return out


def job_output(kind: str, config: dict[str, Any], job_id: str | None = None) -> Path | None:
    """The folder a job writes its model(s) into (an iterate job: its output root); None for
    kinds that write none, or when it is the per-job default and `job_id` is not known yet
    (a default folder is named after its job, so no other job shares it)."""
    from engine.train.common import default_output_dir

    out: Any = None
    if kind in ("dpo", "sft", "rft"):
        out = config.get("output") or (default_output_dir(f"{kind}-{job_id}") if job_id else None)
    elif kind == "iterate":
        loop = config.get("iterate")
        loop = loop if isinstance(loop, dict) else {}  # a stored config of another shape: its worker refuses it
        name = loop.get("name")
        out = loop.get("output_root") or (default_output_dir(name) if isinstance(name, str) and name else None)
    if not isinstance(out, str | Path) or not str(out):
        return None
    return Path(absolute_path(str(out), REPO_ROOT))  # a relative path (jobs of older versions): the worker's cwd


def refuse_shared_output(store: Store, kind: str, config: dict[str, Any]) -> None:
    """ConfigError when a live (queued or running) job writes to the same output folder, or to
    one inside the other: two jobs on one folder would replace each other's model (and it is no
    use to train twice into one place at once). JobRunner.submit runs it inside the insert's
    transaction, so two racing submissions cannot both pass."""
    mine = job_output(kind, config)
    if mine is None:
        return
    for other in store.jobs(state=("queued", "running")):
        theirs = job_output(other.kind, other.config, other.id)
        if theirs is not None and (mine == theirs or mine in theirs.parents or theirs in mine.parents):
            raise ConfigError(f"output folder {mine}: job {other.id} ({other.kind}, {other.state}) writes to "
                              f"{theirs}; wait for it to end, cancel it (orchard jobs cancel {other.id}) or "
                              f"choose another output folder")


def visible_devices(device: str, inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a job's worker: exactly the GPUs its device names ("" hides every
    GPU from a cpu job). Indices count among the GPUs the runner itself sees, so under an inherited
    CUDA_VISIBLE_DEVICES=3,5 a cuda:1 job gets GPU 5 (torch's numbering)."""
    indices = gpu_indices(device)
    if inherited is None:
        return ",".join(str(i) for i in indices)
    if not indices:
        return ""
    seen = [d.strip() for d in inherited.split(",") if d.strip()]
    missing = [i for i in indices if i >= len(seen)]
    if missing:
        raise ConfigError(f"job device {device!r}: GPU {missing[0]} is not among the {len(seen)} visible "
                          f"(CUDA_VISIBLE_DEVICES={inherited})")
    return ",".join(seen[i] for i in indices)


def worker_command(python: str, job_id: str, db: str | Path, device: str, kind: str, config: dict[str, Any],
                   processes: int | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) that start the worker of a job.

    One process for one device. A dpo/sft/rft job naming several GPUs trains with one process per
    GPU under `accelerate launch` (DDP; FSDP when the train config says distributed="fsdp"); every
    process runs the worker module, and rank 0 alone talks to the store (engine.jobs.worker).
    `processes` > 1 on a cpu job launches that many CPU processes the same way (gloo): the test of
    the multi-process path on a machine without GPUs (the FSDP launch too: see its comment)."""
    from engine.store.credentials import worker_secrets
    from engine.store.postgres import is_url

    # A server's password (in the URL's userinfo or its query) travels in the environment, not on the
    # command line where `ps` shows it.
    db, secret_env = worker_secrets(str(db)) if is_url(db) else (str(db), {})
    worker = ["-m", WORKER_MODULE, job_id, "--db", db]
    env = {"CUDA_VISIBLE_DEVICES": visible_devices(device, os.environ.get("CUDA_VISIBLE_DEVICES")), **secret_env}
    n = len(gpu_indices(device)) if processes is None else processes
    if n <= 1:
        return [python, *worker], env
    if kind not in MULTI_GPU_KINDS:
        raise ConfigError(f"{kind} job on {device!r}: only dpo/sft/rft jobs train on several GPUs (name one GPU)")
    train = config.get("train")
    strategy = str(train.get("distributed", "ddp") if isinstance(train, dict) else "ddp")
    launch = [python, "-m", "accelerate.commands.launch", "--num_processes", str(n), "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no",  # the Trainer sets bf16 itself
              "--main_process_ip", "127.0.0.1", "--main_process_port", str(_free_port())]
    if strategy == "fsdp":
        # fsdp_cpu_ram_efficient_loading off (accelerate's launcher defaults it to true): with it on,
        # transformers loaders that zero-fill ranks > 0 (earlier 5.x; 5.25 keeps every rank's loaded
        # weights) leave those zeros for accelerate to fill from rank 0 when it wraps the policy, but
        # TRL wraps the DPO reference model it loads without that fill, so ranks > 0 would score with
        # zeroed reference weights (tests/test_cpu_fsdp.py, on two CPU processes). The price: every
        # rank loads the whole fp32 model into host RAM (n_gpus x 4 bytes x parameters at once;
        # docs/decisions.md).
        launch += ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
                   "--fsdp_state_dict_type", "FULL_STATE_DICT", "--fsdp_reshard_after_forward", "true",
                   "--fsdp_cpu_ram_efficient_loading", "false"]
    else:
        launch.append("--multi_gpu")
    if device == "cpu":
        # accelerate's --cpu starts one process (several need MPI); --multi_gpu and --use_fsdp start
        # torchrun's processes, and ACCELERATE_USE_CPU makes them a gloo (MULTI_CPU) group on a CPU.
        # accelerate (1.16) turns FSDP on only in a GPU-like group, so a CPU FSDP launch trains as DDP
        # unless its gate is lifted, as tests/cpu_fsdp does to run the FSDP path on gloo (FSDP2 itself
        # runs on a CPU); the launch is otherwise the GPUs' own, the FSDP environment included.
        env["ACCELERATE_USE_CPU"] = "true"
    return [*launch, *worker], env


def _free_port() -> int:
    """A free loopback port for the process group's rendezvous (jobs on disjoint GPUs run at once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        if not any(m.encode() in cmdline for m in _WORKER_MODULES) or job_id.encode() not in cmdline:
            return False
    return True


@dataclass
class JobRunner:
    """Submits, schedules, watches and cancels jobs of one database (see the module docstring).
    It keeps the handles of the workers it started so their exits are reaped (no zombies)."""

    store: Store
    python: str = sys.executable
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
    cpu_processes: int = 1  # > 1: cpu training jobs run in that many processes (the multi-GPU path, on CPU)

    def __post_init__(self) -> None:
        self._children: dict[str, subprocess.Popen] = {}

    # --- submitting and scheduling

    def submit(self, kind: str, config: dict[str, Any], device: str | None = None, name: str | None = None,
               start: bool = True, validate: bool = True) -> JobInfo:
        """Queue a job (its paths made absolute, then validated) and start it if its device is idle."""
        config = resolve_job_paths(kind, config)
        if validate:
            validate_job(kind, config)
        device = device or default_device()
        check_device(device)
        if len(gpu_indices(device)) > 1 and kind not in MULTI_GPU_KINDS:
            raise ConfigError(f"{kind} job on {device!r}: only dpo/sft/rft jobs train on several GPUs (name one GPU)")
        job = self.store.create_job(kind, config, device, name=name,
                                    guard=lambda: refuse_shared_output(self.store, kind, config))
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
            if self._hung(job, now):
                continue
            if job.id in self._children:  # our own child and not reaped above: alive, maybe still starting
                continue
            beat = job.heartbeat_at or job.started_at
            fresh = beat is not None and now - beat <= FRESH_BEAT_S
            if job.pid is None:  # (a multi-GPU job's launcher may have failed to record its pid: its beats count)
                dead = job.started_at is not None and now - job.started_at > STARTUP_GRACE_S and not (
                    job.heartbeat_at is not None and fresh)
            elif fresh and self.store.dialect != "sqlite":
                dead = False  # a shared PostgreSQL store: the pid may be another machine's; its beats say it lives
            else:
                young = job.started_at is not None and now - job.started_at < EXEC_GRACE_S
                dead = not process_alive(job.pid, None if young else job.id)
            if dead:
                self.store.finish_job(job.id, "failed", error=f"the job's process (pid {job.pid}) died without "
                                                               f"recording an outcome; see {job.log_path}")
        started = []
        devices = {j.device for j in self.store.jobs(state="queued")}
        # A job on cuda:0,1 and one on cuda:1 share a GPU under different strings: the store's claim checks
        # that in its transaction (`shares`); `busy` only skips what is plainly taken.
        busy = {g for j in self.store.jobs(state="running") for g in device_gpus(j.device)}
        for dev in sorted(devices):
            if device is not None and dev != device:
                continue
            gpus = set(device_gpus(dev))
            if gpus & busy:
                continue
            claimed = self.store.claim_next_job(dev, shares=partial(_shares_gpu, gpus))
            if claimed is not None:
                self._launch(claimed)
                started.append(claimed.id)
                busy |= gpus
        return started

    def _hung(self, job: JobInfo, now: float) -> bool:
        """Fail and kill a running job whose worker has stopped beating (True when it did so). Its
        device is free at once: the job is no longer `running`, and its process is gone."""
        last = job.heartbeat_at or job.started_at
        if job.pid is None or last is None or now - last <= self.heartbeat_timeout_s:
            return False
        error = f"no heartbeat for {now - last:.0f} s: the worker (pid {job.pid}) hung and was killed; see {job.log_path}"
        # Only the poller that records the failure kills (the pid is checked to be this job's worker).
        if self.store.finish_job(job.id, "failed", error=error) and process_alive(job.pid, job.id):
            _signal_group(job.pid, signal.SIGKILL)
            self._wait_exit(job.id, job.pid, 10.0)
        return True

    def _launch(self, job: JobInfo) -> None:
        # A stored path outside the job-log folder (someone else wrote the row) is not appended to.
        log_path = (job_log(self.store.location, job.log_path)
                    or job_log(self.store.location, str(jobs_dir(self.store.location) / f"{job.id}.log"))
                    or jobs_dir(self.store.location) / "unnamed-job.log")  # an id such as '../x' (an edited row)
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            processes = self.cpu_processes if job.device == "cpu" and job.kind in MULTI_GPU_KINDS else None
            argv, devices = worker_command(self.python, job.id, self.store.location, job.device, job.kind, job.config,
                                           processes=processes)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", **devices,
                   "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT), env=env,
                    start_new_session=True,
                )
        except (OSError, ConfigError) as e:
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


def _shares_gpu(gpus: set[int], other: str) -> bool:
    """Whether a job running on device `other` uses one of `gpus`."""
    return bool(gpus & set(device_gpus(other)))


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
    prog = progress_line(p, live=not job.final) if p.get("total") else p.get("phase", "")
    when = time.strftime("%m-%d %H:%M", time.localtime(job.created_at))
    tail = job.error if job.state == "failed" and job.error else (job.output_path or "")
    return f"{job.id:<11} {job.kind:<8} {job.state:<10} {job.device:<7} {when:<12} {prog:<24} {tail}"

