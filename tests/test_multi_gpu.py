"""Several GPUs, tested without one: each job's worker sees only its GPUs (CUDA_VISIBLE_DEVICES),
a job naming several trains under `accelerate launch`, and two processes train like one."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from engine.config import ConfigError
from engine.envs.base import TaskSpec
from engine.jobs.runner import JobRunner, check_device, gpu_indices, visible_devices, worker_command
from engine.store import Store


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "orchard.db") as s:
        yield s


def test_device_specs_and_the_gpus_a_worker_sees() -> None:
    for ok in ("cpu", "cuda", "cuda:3", "cuda:0,1", "cuda:2,0,5"):
        check_device(ok)
    for bad in ("cuda:", "cuda:0,0", "cuda:a", "cuda:1,", "gpu:1", "cuda:-1"):
        with pytest.raises(ConfigError, match="job device"):
            check_device(bad)
    assert gpu_indices("cpu") == () and gpu_indices("cuda") == (0,) and gpu_indices("cuda:2,0") == (2, 0)
    assert visible_devices("cuda:1", None) == "1" and visible_devices("cpu", None) == ""
    assert visible_devices("cuda:0,2", None) == "0,2"
    # Indices count among the GPUs the runner sees (torch's numbering), not the machine's.
    assert visible_devices("cuda:1", "3,5") == "5" and visible_devices("cuda", "3,5") == "3"
    with pytest.raises(ConfigError, match="GPU 2 is not among the 2 visible"):
        visible_devices("cuda:2", "3,5")


def test_one_gpu_is_one_process_and_several_are_an_accelerate_launch(tmp_path: Path) -> None:
    argv, env = worker_command("py", "j1", tmp_path / "o.db", "cuda:1", "dpo", {})
    assert argv == ["py", "-m", "engine.jobs.worker", "j1", "--db", str(tmp_path / "o.db")]
    assert env == {"CUDA_VISIBLE_DEVICES": "1"}
    argv, env = worker_command("py", "j2", "o.db", "cuda:0,1", "sft", {"train": {}})
    assert argv[:3] == ["py", "-m", "accelerate.commands.launch"] and "--multi_gpu" in argv
    assert argv[argv.index("--num_processes") + 1] == "2"
    assert argv[-5:] == ["-m", "engine.jobs.worker", "j2", "--db", "o.db"]  # every process runs the worker
    assert argv[argv.index("--main_process_ip") + 1] == "127.0.0.1" and env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    argv, _ = worker_command("py", "j3", "o.db", "cuda:0,1,2,3", "dpo", {"train": {"distributed": "fsdp"}})
    assert "--use_fsdp" in argv and "--multi_gpu" not in argv and argv[argv.index("--num_processes") + 1] == "4"
    argv, env = worker_command("py", "j4", "o.db", "cpu", "dpo", {}, processes=2)
    assert "--multi_gpu" in argv and env == {"CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "true"}
    # FSDP on CPU processes: the GPUs' own launch (tests/test_cpu_fsdp.py runs it), on a gloo group
    fsdp = {"train": {"distributed": "fsdp"}}
    argv, env = worker_command("py", "j6", "o.db", "cpu", "dpo", fsdp, processes=2)
    gpus, gpu_env = worker_command("py", "j6", "o.db", "cuda:0,1", "dpo", fsdp)
    port = argv.index("--main_process_port")
    assert argv[:port] + argv[port + 2:] == gpus[:port] + gpus[port + 2:] and "--use_fsdp" in argv
    assert env == {"CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "true"} and "ACCELERATE_USE_CPU" not in gpu_env
    with pytest.raises(ConfigError, match="only dpo/sft/rft jobs train on several GPUs"):
        worker_command("py", "j5", "o.db", "cuda:0,1", "eval", {})


def test_the_fsdp_launch_turns_cpu_ram_efficient_loading_off_as_accelerate_reads_it() -> None:
    """Read by the installed accelerate's own launch parser and environment builder: with its default
    (true) transformers would load the checkpoint on rank 0 only, and TRL's reference model, loaded
    after the process group exists, would be zeros on every other rank."""
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    argv, _ = worker_command("py", "j", "o.db", "cuda:0,1", "dpo", {"train": {"distributed": "fsdp"}})
    assert argv[1:3] == ["-m", "accelerate.commands.launch"]
    args = launch_command_parser().parse_args(argv[3:])
    assert (args.module, args.training_script, args.training_script_args) == (True, "engine.jobs.worker",
                                                                             ["j", "--db", "o.db"])
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "false"
    at = argv.index("--fsdp_cpu_ram_efficient_loading")
    without = launch_command_parser().parse_args(argv[3:at] + argv[at + 2:])
    assert prepare_multi_gpu_env(without)["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"  # what the flag overrides


def test_fsdp_is_a_train_setting_and_refuses_lora() -> None:
    from engine.train.common import TrainConfig

    assert TrainConfig(distributed="fsdp").distributed == "fsdp"
    with pytest.raises(ConfigError, match="distributed"):
        TrainConfig(distributed="zero9")
    with pytest.raises(ConfigError, match="fsdp with lora"):
        TrainConfig(distributed="fsdp", lora=True)


def test_the_runner_sets_cuda_visible_devices_for_a_cuda_job(store: Store, monkeypatch) -> None:
    """The worker's own environment, read back from its log (no GPU needed: a probe job)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runner = JobRunner(store)
    jobs = {dev: runner.submit("probe", {"steps": 1, "seconds": 0.01}, device=dev) for dev in ("cuda:1", "cpu")}
    for job in jobs.values():
        done = runner.wait(job.id, timeout=60)
        assert done.state == "succeeded", Path(done.log_path or "").read_text()
    assert "CUDA_VISIBLE_DEVICES='1'" in Path(store.job(jobs["cuda:1"].id).log_path or "").read_text()
    assert "CUDA_VISIBLE_DEVICES=''" in Path(store.job(jobs["cpu"].id).log_path or "").read_text()
    with pytest.raises(ConfigError, match="only dpo/sft/rft"):
        runner.submit("probe", {"steps": 1}, device="cuda:0,1")


def test_jobs_sharing_a_gpu_under_different_device_names_wait(store: Store, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runner = JobRunner(store)
    first = runner.submit("probe", {"steps": 200, "seconds": 0.05}, device="cuda:6")
    shared = store.create_job("probe", {"steps": 1, "seconds": 0.01}, "cuda:6,7")
    apart = store.create_job("probe", {"steps": 1, "seconds": 0.01}, "cuda:5")
    runner.poll()
    assert store.job(first.id).state == "running" and store.job(shared.id).state == "queued"
    assert store.job(apart.id).state in ("running", "succeeded")
    runner.cancel(first.id, grace_s=20)
    assert runner.wait(shared.id, timeout=60).state in ("succeeded", "failed")  # it ran once cuda:6 was free


def test_a_worker_on_one_gpu_trains_on_its_cuda_0(store: Store, monkeypatch) -> None:
    """A cuda:1 job's train config says cuda:1, but inside the worker that GPU is the only one
    visible: the trainer gets device "cuda" (index 0 of the visible ones)."""
    from engine.jobs.worker import StoreReporter, run_job
    from engine.train import dpo
    from engine.train.common import TrainResult

    seen = {}
    monkeypatch.setattr(dpo, "select_pairs", lambda store, train, runs: [])
    monkeypatch.setattr("engine.train.common.resolve_model_path", lambda spec, log=print: Path(spec))
    monkeypatch.setattr("engine.jobs.kinds.validate_job", lambda kind, config: None)

    def fake_train(base, pairs, train, output, reporter, **kw):
        seen["device"] = train.device
        return TrainResult(output=None, data_ids=[], metrics={}, history=[], stopped=True)

    monkeypatch.setattr(dpo, "train_dpo", fake_train)
    for job_device, train_device, expect in (("cuda:1", "cuda:1", "cuda"), ("cuda:0,1", "cuda", "cuda"),
                                             ("cpu", "auto", "cpu"), ("cuda:1", "cpu", "cpu")):
        job = store.job(store.create_job("dpo", {"model": "m", "train": {"device": train_device}}, job_device).id)
        run_job(store, job, StoreReporter(store, job.id))
        assert seen["device"] == expect, (job_device, train_device)


def _pairs_store(store: Store, n: int) -> str:
    from doubles import action_text

    from engine.datasets.pairs import Pair
    from engine.prompts import actor_prompt

    run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id=f"goal-{i}", goal="g") for i in range(n)])
    words = ["left", "right", "up", "down", "wait", "look", "take", "drop"]
    pairs = [
        Pair(id=f"p{i}", kind="step", run_id=run_id, tree_id=None, task_id=f"goal-{i}", node_id=0, chosen_node=1,
             rejected_node=2, prompt=actor_prompt("Commands: left, right.", f"reach {i}", "", [], f"at {i}"),
             chosen=action_text(words[i % 8]), rejected=action_text(words[(i + 3) % 8] + " " * (i % 3)),
             q_chosen=1.0, q_rejected=0.0, logprob_chosen=None, logprob_rejected=None, depth=0)
        for i in range(n)
    ]
    store.save_pairs(run_id, pairs)
    store.bulk_set_pair_status("approved", "test", run_id=run_id)
    return run_id


def _samples_store(store: Store, n: int) -> str:
    from doubles import action_text

    from engine.datasets.samples import Sample, Task, Turn

    run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id=f"goal-{i}", goal="g") for i in range(n)])
    samples = []
    for i in range(n):
        task = Task(id=f"goal-{i}", goal=f"reach position {i}", context="commands: left, right, wait",
                    first_observation="You are at 0.", system="You are an agent.")
        samples.append(Sample(id=f"s{i}", kind="rft", run_id=run_id, task=task, turns=(
            Turn(action_text("right"), "You are at 1.", True),
            Turn(action_text(["left", "wait"][i % 2]), "You are at 1.", i % 2 == 0),
            Turn(action_text("right", "SUCCESS"), None, True))))
    store.save_samples(samples)
    return run_id


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dpo", "rft"])
def test_two_processes_train_like_one(store: Store, tmp_path: Path, kind: str) -> None:
    """The random-weights model: one process with batch 4 vs two processes (gloo, via the runner's
    accelerate launch) with batch 2 each — the same 4 rows per step, the same order (accelerate's
    seeded sampler, sharded by batch), gradients averaged (SFT's token mean is taken over both
    processes' tokens): the same losses. Measured: DPO within 8e-7, RFT identical to 1e-6."""
    from tiny_model_fixture import build_tiny_model

    model = build_tiny_model(tmp_path / "base")
    run_id = _pairs_store(store, 12) if kind == "dpo" else _samples_store(store, 12)
    train = {"max_steps": 3, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32", "num_threads": 1,
             **({"include_pending": True} if kind == "rft" else {})}
    losses = {}
    for processes, batch in ((1, 4), (2, 2)):
        runner = JobRunner(store, cpu_processes=processes)
        out = tmp_path / f"out-{processes}"
        began = time.monotonic()
        job = runner.submit(kind, {"model": str(model), "output": str(out), "runs": [run_id],
                                   "train": {**train, "batch_size": batch}}, device="cpu")
        done = runner.wait(job.id, timeout=400)
        log = Path(done.log_path or "").read_text()
        assert done.state == "succeeded", log[-3000:]
        assert (processes == 2) == ("2 processes" in log) and (out / "config.json").is_file()
        assert store.model_record(str(out.resolve())).job_id == job.id  # rank 0 registered it, once
        losses[processes] = [m["loss"] for m in store.job_metrics(job.id) if "loss" in m]
        print(f"{kind}, {processes} process(es): losses {losses[processes]} in {time.monotonic() - began:.0f}s")
        assert len(losses[processes]) == 3 and all(math.isfinite(v) for v in losses[processes])
    if kind == "dpo":
        assert losses[1][0] == pytest.approx(math.log(2), abs=0.05)
    assert losses[2] == pytest.approx(losses[1], abs=1e-4)  # the stated tolerance
    assert losses[1][-1] != losses[1][0]  # the steps trained: equal losses are not one constant


def test_the_multi_gpu_presets_take_every_visible_gpu(monkeypatch) -> None:
    import torch

    from engine.train.presets import device_of, job_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for preset, flag in (("gpu-ddp", "--multi_gpu"), ("gpu-fsdp", "--use_fsdp")):
        kind, config = job_config("pairs", preset, "tiny")
        device = device_of(config)
        assert device == "cuda:0,1"
        argv, _env = worker_command("py", "j", "o.db", device, kind, config)
        assert flag in argv and argv[argv.index("--num_processes") + 1] == "2"
    _, config = job_config("pairs", "gpu-bf16", "tiny")
    assert device_of(config) == "cuda:0"  # the one-GPU presets stay on one GPU


@pytest.mark.slow
def test_cancelling_a_multi_process_job_ends_every_process(store: Store, tmp_path: Path) -> None:
    from tiny_model_fixture import build_tiny_model

    from engine.jobs.runner import process_alive

    model = build_tiny_model(tmp_path / "base")
    run_id = _samples_store(store, 8)
    runner = JobRunner(store, cpu_processes=2)
    job = runner.submit("rft", {"model": str(model), "runs": [run_id], "train": {
        "max_steps": 100000, "batch_size": 2, "learning_rate": 1e-4, "device": "cpu", "precision": "fp32",
        "num_threads": 1, "include_pending": True}}, device="cpu")
    deadline = time.monotonic() + 300
    while store.job(job.id).progress.get("step", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert store.job(job.id).progress.get("step", 0) >= 2, Path(store.job(job.id).log_path or "").read_text()[-2000:]
    launcher = store.job(job.id).pid  # the launcher's pid stays the job's (rank 0 does not overwrite it)
    assert launcher is not None and "accelerate" in Path(f"/proc/{launcher}/cmdline").read_text(errors="replace")
    done = runner.cancel(job.id, grace_s=30)
    assert done.state == "cancelled" and not process_alive(launcher, job.id)
    workers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and job.id.encode() in _cmdline(p)]
    assert workers == []  # no rank left behind


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture
def four_fake_gpus(monkeypatch: pytest.MonkeyPatch):
    """torch as on a 4-GPU host, for the device set-up only (nothing is put on a GPU)."""
    import torch

    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(d if isinstance(d, int) else torch.device(d).index or 0))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    yield current
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # the fake CUDA state must not outlive the test


@pytest.mark.parametrize("kind", ["dpo", "sft"])
def test_foreground_training_on_a_multi_gpu_host_uses_the_one_device_asked_for(four_fake_gpus, tmp_path, kind) -> None:
    """transformers alone would pick cuda:0 and count all 4 GPUs (n_gpu=4: TRL's DataParallel error)."""
    import torch
    from trl import DPOConfig, SFTConfig

    from engine.train.common import TrainConfig, TrainError, pin_one_device, trl_common_args

    cls = DPOConfig if kind == "dpo" else SFTConfig
    common = trl_common_args(TrainConfig(device="cuda:2", precision="fp32"), "cuda:2", "fp32", tmp_path)
    plain = cls(**common)
    assert plain.n_gpu == 4 and plain.device == torch.device("cuda", 0)  # what TRL would get unpinned
    args = pin_one_device(cls(**common), "cuda:2")
    assert args.n_gpu == 1 and args.device == torch.device("cuda", 2) and four_fake_gpus[-1] == 2
    assert pin_one_device(cls(**common), "cuda").device == torch.device("cuda", 0)
    assert pin_one_device(cls(**common), "cuda").n_gpu == 1
    with pytest.raises(TrainError, match="several GPUs.*submit a job"):
        pin_one_device(cls(**common), "cuda:0,1")
    with pytest.raises(TrainError, match="sees 4 GPU"):
        pin_one_device(cls(**common), "cuda:4")


def test_one_rank_of_a_distributed_launch_is_left_to_transformers(four_fake_gpus, monkeypatch) -> None:
    from types import SimpleNamespace

    from engine.train.common import pin_one_device

    monkeypatch.setenv("WORLD_SIZE", "2")
    args = SimpleNamespace()  # not even read: transformers sets n_gpu=1 per rank itself
    assert pin_one_device(args, "cuda:0,1") is args and not vars(args)
