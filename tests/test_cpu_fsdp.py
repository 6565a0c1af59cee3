"""The FSDP launch's reference model, on two CPU processes (gloo): a DPO job on `cpu` with
`distributed: fsdp` goes through the runner's own launch (`worker_command`: --use_fsdp, FSDP2,
--fsdp_cpu_ram_efficient_loading false) and the real worker, TRL and accelerate, with
tests/cpu_fsdp/sitecustomize.py lifting accelerate's GPU-only FSDP gate and recording, on every
rank, the reference model TRL's DPO scores with (its own FSDP-wrapped copy, loaded after the process
group exists) against the checkpoint.

Measured (2 cores): each job ~25 s. transformers 5.25 keeps every rank's loaded weights whatever the
flag (with it on too: first loss ln 2, every shard equal); the loaders that zero-filled ranks > 0
under cpu_ram_efficient_loading (earlier 5.x) are put back by the sitecustomize for the negative
control: with accelerate's default (true) rank 1's shard of the reference is all zeros and the first
DPO loss is 0.832, not ln 2 = 0.693."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from engine.jobs import runner as runner_module
from engine.jobs.runner import JobRunner
from engine.llm.tiny_checkpoint import SHIPPED_DIR
from engine.store import Store

SHIM = Path(__file__).parent / "cpu_fsdp"


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "orchard.db") as s:
        yield s


def _fsdp_dpo_job(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ram_efficient: str,
                  zero_fill: bool) -> tuple[dict[int, dict], list[dict], str]:
    """Run a 1-step FSDP DPO job on two CPU processes; (records by rank, metrics, log)."""
    from safetensors import safe_open
    from test_multi_gpu import _pairs_store

    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("ORCHARD_TEST_CPU_FSDP", str(probe))
    monkeypatch.setenv("ORCHARD_TEST_ZERO_FILL", "1" if zero_fill else "0")
    launched: list[list[str]] = []
    product_command = runner_module.worker_command

    def command(*args, **kwargs):
        argv, env = product_command(*args, **kwargs)
        at = argv.index("--fsdp_cpu_ram_efficient_loading")
        assert argv[at + 1] == "false" and env["ACCELERATE_USE_CPU"] == "true"  # the product's launch
        argv = [*argv[: at + 1], ram_efficient, *argv[at + 2:]]
        launched.append(argv)
        return argv, env

    monkeypatch.setattr(runner_module, "worker_command", command)
    run_id = _pairs_store(store, 4)
    runner = JobRunner(store, cpu_processes=2)
    job = runner.submit("dpo", {"model": str(SHIPPED_DIR), "output": str(tmp_path / "out"), "runs": [run_id],
                                "train": {"max_steps": 1, "batch_size": 2, "learning_rate": 1e-3, "device": "cpu",
                                          "precision": "fp32", "num_threads": 1, "distributed": "fsdp",
                                          "ref_source": "precompute"}}, device="cpu")
    done = runner.wait(job.id, timeout=400)
    log = Path(done.log_path or "").read_text()
    assert done.state == "succeeded", log[-3000:]
    assert len(launched) == 1 and "--use_fsdp" in launched[0] and "2 processes" in log
    records = {r["rank"]: r for r in (json.loads(p.read_text()) for p in sorted(probe.glob("rank*.json")))}
    assert sorted(records) == [0, 1], log[-3000:]
    with safe_open(str(SHIPPED_DIR / "model.safetensors"), "pt") as f:
        tensors = len(list(f.keys()))
    for r in records.values():
        # TRL's own reference model, FSDP2-wrapped, every parameter a shard, in an FSDP group
        assert r["distributed_type"] == "DistributedType.FSDP" and r["world"] == 2
        assert not r["ref_is_policy"] and r["fsdp_wrapped"] and Path(r["checkpoint"]) == SHIPPED_DIR
        assert r["compared"] == r["sharded"] == tensors
        assert r["cpu_ram_efficient_loading"] == ram_efficient
    metrics = [m for m in store.job_metrics(job.id) if "loss" in m]
    assert len(metrics) == 1
    print(f"cpu_ram_efficient_loading={ram_efficient} zero_fill={zero_fill}: first loss {metrics[0]['loss']!r}, "
          f"margins {metrics[0]['rewards/margins']!r}; " + "; ".join(
              f"rank {k}: worst {r['worst_abs_diff']:.3g}, |shard| {r['local_abs_sum']:.6g}" for k, r in records.items()))
    return records, metrics, log


@pytest.mark.slow
@pytest.mark.parametrize("zero_fill", [False, True], ids=["installed-loader", "zero-filling-loader"])
def test_every_rank_scores_with_the_checkpoint_as_the_fsdp_launch_loads_it(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zero_fill: bool) -> None:
    """The launch as the runner builds it (cpu_ram_efficient_loading false): each rank's shard of the
    reference equals the checkpoint's rows, and the first step's loss is ln 2 with zero rewards (the
    policy is the reference before its first update), also under a loader that zero-fills ranks > 0
    when the flag is on."""
    records, metrics, _ = _fsdp_dpo_job(store, tmp_path, monkeypatch, "false", zero_fill)
    for r in records.values():
        assert r["worst_abs_diff"] == 0.0 and r["local_abs_sum"] > 0, r
    first = metrics[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert first[key] == pytest.approx(0.0, abs=1e-6), first


@pytest.mark.slow
def test_with_accelerates_default_a_zero_filling_loader_leaves_rank_1_a_zero_reference(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: what the flag prevents, and that the checks above see it. With
    cpu_ram_efficient_loading on, the policy is filled from rank 0 when accelerate wraps it, but TRL's
    reference is wrapped without that: rank 1's shard stays zeros and both ranks score with a
    half-zero reference (FSDP gathers the shards)."""
    records, metrics, _ = _fsdp_dpo_job(store, tmp_path, monkeypatch, "true", zero_fill=True)
    assert records[0]["worst_abs_diff"] == 0.0 and records[0]["local_abs_sum"] > 0
    assert records[1]["worst_abs_diff"] > 0 and records[1]["local_abs_sum"] == 0.0, records[1]
    first = metrics[0]
    assert abs(first["loss"] - math.log(2)) > 1e-3 and abs(first["rewards/margins"]) > 1e-3, first
