"""Named training recipes: which data a job trains on, and which settings it trains with.

WHY here and not in the dashboard: the Training page and scripts launch the same jobs, and the
dashboard holds no algorithm or config knowledge of its own. A recipe is plain data (a job kind and
train-config overrides); `job_config` turns a choice of data + preset into the JSON a `JobRunner`
validates and queues, exactly as `orchard train ...` would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError

if TYPE_CHECKING:
    from engine.store import Store


@dataclass(frozen=True)
class DataChoice:
    """A training set: the job kind and the train-config fields that select its rows."""

    label: str
    kind: str  # dpo | sft | rft
    select: dict[str, Any]
    help: str


@dataclass(frozen=True)
class Preset:
    """Settings for a device and budget; `by_kind` adds per-kind fields (e.g. learning rates)."""

    label: str
    train: dict[str, Any]
    by_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    help: str = ""
    all_gpus: bool = False  # the job takes every visible GPU (one process each, engine.jobs.runner)


DATA_CHOICES: dict[str, DataChoice] = {
    "pairs": DataChoice("Preference pairs → step DPO", "dpo", {"kinds": ["step"]},
                        "Agent Q: step-level pairs from the trees (approved and edited ones by default)."),
    "trajectory_pairs": DataChoice("Trajectory pairs → DPO (baseline)", "dpo", {"kinds": ["trajectory"]},
                                   "Whole-trajectory pairs: the baseline step DPO is compared against."),
    "revisions": DataChoice("Revision set → masked SFT", "sft", {"kinds": ["revision", "good"]},
                            "Agent-R: spliced revision trajectories and good trajectories, per-turn loss masks."),
    "refinement": DataChoice("Refinement set → masked SFT", "sft", {"kinds": ["refine"]},
                             "AgentRefine: verified refinement trajectories, per-turn loss masks."),
    "rft": DataChoice("Successful trajectories → RFT", "rft", {},
                      "Rejection-sampling fine-tuning on the searches' successful paths."),
    "exit": DataChoice("Search's shortest successes → SFT (expert iteration)", "sft", {"kinds": ["exit"]},
                       "Expert iteration: each solved tree's shortest successful trajectory, search's own choices "
                       "as targets (the loop's default method)."),
}

PRESETS: dict[str, Preset] = {
    "cpu-quick": Preset(
        "CPU, quick (half an epoch)",
        {"device": "cpu", "precision": "fp32", "epochs": 0.5, "batch_size": 4, "num_threads": 2},
        {"dpo": {"learning_rate": 1e-5}, "sft": {"learning_rate": 1e-4}, "rft": {"learning_rate": 1e-4}},
        "Half a pass over the selected data on the CPU: to see the loop work end to end. Its steps follow the "
        "data (rows x epochs / batch), never a fixed count.",
    ),
    "cpu-epoch": Preset(
        "CPU, one epoch",
        {"device": "cpu", "precision": "fp32", "epochs": 1.0, "batch_size": 8, "num_threads": 2},
        {"dpo": {"learning_rate": 5e-6}, "sft": {"learning_rate": 5e-5}, "rft": {"learning_rate": 5e-5}},
        "One pass over the selected data on the CPU (fp32).",
    ),
    "gpu-bf16": Preset(
        "GPU, bf16",
        {"device": "cuda", "precision": "bf16", "gradient_checkpointing": True, "epochs": 1.0, "batch_size": 16},
        {"dpo": {"learning_rate": 1e-6}, "sft": {"learning_rate": 2e-5}, "rft": {"learning_rate": 2e-5}},
        "bf16 with gradient checkpointing on a CUDA device.",
    ),
    "gpu-lora": Preset(
        "GPU, bf16 + LoRA",
        {"device": "cuda", "precision": "bf16", "gradient_checkpointing": True, "epochs": 1.0, "batch_size": 16,
         "lora": True},
        {"dpo": {"learning_rate": 5e-6}, "sft": {"learning_rate": 1e-4}, "rft": {"learning_rate": 1e-4}},
        "A LoRA adapter (merged into the saved model) for larger models.",
    ),
    "gpu-ddp": Preset(
        "Every GPU, bf16, DDP",
        {"device": "cuda", "precision": "bf16", "gradient_checkpointing": True, "epochs": 1.0, "batch_size": 8,
         "distributed": "ddp"},
        {"dpo": {"learning_rate": 1e-6}, "sft": {"learning_rate": 2e-5}, "rft": {"learning_rate": 2e-5}},
        "One process per visible GPU (accelerate launch), each with a full copy of the model; the batch "
        "size is per GPU, so the effective batch grows with the GPU count.",
        all_gpus=True,
    ),
    "gpu-fsdp": Preset(
        "Every GPU, bf16, FSDP (model sharded)",
        {"device": "cuda", "precision": "bf16", "gradient_checkpointing": True, "epochs": 1.0, "batch_size": 4,
         "distributed": "fsdp"},
        {"dpo": {"learning_rate": 1e-6}, "sft": {"learning_rate": 2e-5}, "rft": {"learning_rate": 2e-5}},
        "For a model that does not fit one GPU: weights, gradients and optimizer state sharded across "
        "every visible GPU (FSDP2, full fine-tuning; not yet run on GPUs). Every process first loads the "
        "whole fp32 model into host RAM (GPUs x 4 bytes x parameters at once).",
        all_gpus=True,
    ),
}


def job_config(data: str, preset: str, model: str, runs: list[str] | None = None,
               include_pending: bool = False, output: str | None = None) -> tuple[str, dict[str, Any]]:
    """(job kind, job config) for training `model` on the `data` choice with `preset`'s settings.
    Raises ConfigError naming the unknown choice or the invalid field."""
    from engine.train.training import train_job

    if data not in DATA_CHOICES:
        raise ConfigError(f"unknown training data {data!r} (expected one of {', '.join(DATA_CHOICES)})")
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} (expected one of {', '.join(PRESETS)})")
    choice, p = DATA_CHOICES[data], PRESETS[preset]
    train = {**p.train, **p.by_kind.get(choice.kind, {}), **choice.select}
    if include_pending:
        train["include_pending"] = True
    config = {"model": model, "output": output, "runs": list(runs or []), "train": train}
    train_job(choice.kind, config).check()
    if str(train.get("device", "")).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"preset {preset!r} trains on a CUDA GPU, and none is visible on this machine "
                              f"(choose a CPU preset)")
        if p.all_gpus:
            train["device"] = all_gpus(torch.cuda.device_count())
    return choice.kind, config


def all_gpus(count: int) -> str:
    """The device spec of every visible GPU: cuda:0,1,...; cuda:0 for one."""
    return "cuda:" + ",".join(str(i) for i in range(max(1, count)))


def device_of(config: dict[str, Any]) -> str:
    """The job queue's device for a train config: cpu, or the CUDA device it names."""
    device = str((config.get("train") or {}).get("device", "auto"))
    if device == "auto":
        from engine.train.common import default_device

        return default_device()
    return "cuda:0" if device == "cuda" else device


MIN_ROWS = 16  # below this a launch asks to confirm: a few rows barely move a model (5 rows did not, measured)


@dataclass(frozen=True)
class TrainPlan:
    """What a job would train on and for how long, shown before it is launched: `items` pairs or
    samples, `rows` training rows (an SFT sample gives one per trained turn), and the optimizer
    steps its epochs make of them."""

    items: int
    rows: int
    epochs: float
    batch: int
    steps: int

    @property
    def too_small(self) -> bool:
        return self.rows < MIN_ROWS


def planned_steps(rows: int, train: Any, processes: int = 1) -> int:
    """Optimizer steps of `rows` rows under a TrainConfig: as the HF Trainer counts them
    (ceil(batches per epoch / accumulation) x epochs, rounded up), or its `max_steps` when set. With
    `processes` (one per GPU, ddp / fsdp) each process steps through its share of the rows."""
    import math

    if train.max_steps > 0:
        return int(train.max_steps)
    share = math.ceil(rows / max(processes, 1))
    per_epoch = math.ceil(math.ceil(share / train.batch_size) / train.grad_accum) if rows else 0
    return math.ceil(per_epoch * train.epochs)


def train_plan(store: Store, kind: str, config: dict[str, Any]) -> TrainPlan:
    """The plan of the job `config` of `kind` on the store's data now."""
    from engine.train.dpo import DPOTrainConfig
    from engine.train.training import train_job

    spec = train_job(kind, config)
    train, runs = spec.train, list(spec.runs) or None
    if isinstance(train, DPOTrainConfig):
        from engine.train.dpo import select_pairs

        items = rows = len(select_pairs(store, train, runs))
    else:
        from engine.datasets.samples import to_step_rows
        from engine.train.sft import select_samples

        samples = select_samples(store, train, runs)
        items = len(samples)
        rows = items if train.format == "chat" else sum(len(to_step_rows(s)) for s in samples)
    from engine.train.common import device_gpus

    processes = max(1, len(device_gpus(device_of(config))))  # one per GPU named
    return TrainPlan(items, rows, train.epochs, train.batch_size * train.grad_accum * processes,
                     planned_steps(rows, train, processes))
