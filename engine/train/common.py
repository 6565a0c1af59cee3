"""What every trainer shares: configs, model loading and saving, progress reporting, TRL arguments.

WHY one place: DPO, SFT and RFT differ only in their data and loss; hardware settings (CPU fp32 vs
GPU bf16, LoRA or full fine-tuning), the saved folder layout and the progress stream are the same,
and a model trained by any of them must load with `engine.llm.registry.load_generator(PATH)`.

A trained model is a plain transformers folder (safetensors weights, config, tokenizer with its
chat template; LoRA adapters are merged in) plus `orchard_train.json`: what was trained from what,
on which data ids, with which config, and the resulting metrics.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Self

from engine import paths
from engine.config import ConfigError, from_dict
from engine.errors import cause_line
from engine.paths import TRAIN_META, read_train_meta
from engine.progress import Reporter

TRAIN_FORMAT = 1
PRECISIONS = ("auto", "fp32", "bf16")
DISTRIBUTED = ("ddp", "fsdp")


class TrainError(ConfigError):
    """A user-facing training problem (no data, bad model folder, no GPU): one line in the CLI.
    A ConfigError (a ValueError), so the CLI's existing handler prints it."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and hardware settings common to all trainers.

    `device`: auto | cpu | cuda | cuda:N. `precision`: auto = bf16 on a CUDA device that supports it,
    fp32 otherwise (bf16 on CPU is emulated on most machines and far slower). TRL defaults to bf16
    and gradient checkpointing; both are off on CPU here, where they make a step ~20x slower.
    `lora`: train a LoRA adapter (peft) and merge it into the saved model instead of all weights.
    `num_threads`: torch CPU threads while training (None: torch's default).
    `distributed`: how a job naming several GPUs trains (one process per GPU, engine.jobs.runner):
    ddp (a full copy per GPU) or fsdp (weights sharded: for models that do not fit one GPU)."""

    learning_rate: float = field(default=1e-6, metadata={"help": "learning rate"})
    epochs: float = field(default=1.0, metadata={"help": "passes over the data"})
    max_steps: int = field(default=-1, metadata={"help": "optimizer steps; > 0 overrides epochs"})
    batch_size: int = field(default=8, metadata={"help": "rows per device step"})
    grad_accum: int = field(default=1, metadata={"help": "gradient accumulation steps"})
    warmup: float = 0.0  # < 1: a fraction of the steps; >= 1: a number of steps
    weight_decay: float = 0.0
    lr_scheduler: str = "linear"
    max_length: int | None = field(default=2048, metadata={"help": "tokens per row at most"})
    seed: int = field(default=0, metadata={"help": "training seed"})
    device: str = "auto"
    precision: str = field(default="auto", metadata={"help": "auto: bf16 on a CUDA device that supports it, else fp32",
                                                     "choices": PRECISIONS})
    gradient_checkpointing: bool = False
    lora: bool = field(default=False, metadata={"help": "train a LoRA adapter (merged into the saved model)"})
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: str = "all-linear"
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's)"})
    logging_steps: int = 1
    distributed: str = "ddp"

    def __post_init__(self) -> None:
        checks = {
            "learning_rate": self.learning_rate > 0,
            "epochs": self.epochs > 0,
            "batch_size": self.batch_size >= 1,
            "grad_accum": self.grad_accum >= 1,
            "warmup": self.warmup >= 0,
            "weight_decay": self.weight_decay >= 0,
            "max_length": self.max_length is None or self.max_length >= 8,
            "device": self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "precision": self.precision in PRECISIONS,
            "lora_r": self.lora_r >= 1,
            "lora_dropout": 0 <= self.lora_dropout < 1,
            "num_threads": self.num_threads is None or self.num_threads >= 1,
            "logging_steps": self.logging_steps >= 1,
            "distributed": self.distributed in DISTRIBUTED,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"{type(self).__name__}.{name}: invalid value {getattr(self, name)!r}")
        if self.distributed == "fsdp" and self.lora:
            raise ConfigError(f"{type(self).__name__}.distributed: fsdp with lora is not supported (a LoRA "
                              "model fits one GPU: use ddp)")

    @classmethod
    def for_cpu(cls, **overrides: Any) -> Self:
        """fp32, no gradient checkpointing: the fast settings on a CPU."""
        return cls(**{"device": "cpu", "precision": "fp32", "gradient_checkpointing": False, **overrides})

    @classmethod
    def for_gpu(cls, **overrides: Any) -> Self:
        """bf16 on CUDA with gradient checkpointing (memory for larger batches and models)."""
        return cls(**{"device": "cuda", "precision": "bf16", "gradient_checkpointing": True, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "train config") -> Self:
        """engine.config.from_dict for this class (types checked, unknown keys named)."""
        return from_dict(cls, data, where=where)


# ------------------------------------------------------------------ devices and precision


def check_device(device: str) -> None:
    """A job's device: cpu, cuda, cuda:N or several GPUs as cuda:N,M,..."""
    gpus = device[5:].split(",") if device.startswith("cuda:") else []
    ok = device in ("cpu", "cuda") or (bool(gpus) and all(g.isdigit() for g in gpus) and len(set(gpus)) == len(gpus))
    if not ok:
        raise ConfigError(f"job device {device!r}: expected cpu, cuda or cuda:N (several GPUs: cuda:N,M,... distinct)")


def gpu_indices(device: str) -> tuple[int, ...]:
    """The GPUs a (checked) device spec names, as indices among those this process sees; () for cpu.
    "cuda" is GPU 0 (one process trains on one GPU unless several are named)."""
    if device == "cpu":
        return ()
    if device == "cuda":
        return (0,)
    return tuple(int(g) for g in device[5:].split(","))


def device_gpus(device: str) -> tuple[int, ...]:
    """The GPUs of `device` (`gpu_indices`), () for cpu or a device spec that is not valid."""
    try:
        check_device(device)
    except ConfigError:
        return ()
    return gpu_indices(device)


def default_device() -> str:
    """cuda:0 where torch sees a GPU, else cpu: the job queue's slot for a job that names none
    (imports torch: call only when submitting)."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TrainError(f"device {device!r} asked for, but no CUDA device is available")
    return device


def pin_one_device(args: Any, device: str) -> Any:
    """Make TRL/transformers training arguments train this one process on exactly `device`.

    WHY: outside a distributed launch, transformers' `TrainingArguments._setup_devices` (5.20 and
    5.24) picks "cuda:0" and sets `n_gpu` to EVERY visible GPU, so `device="cuda:N"` never reached
    the Trainer, and on a multi-GPU host TRL refused to train (its DataParallel check, `n_gpu > 1`)
    after a whole search. Here the device set-up runs as usual, then `n_gpu` is 1 and the device is
    cuda:N (also torch's current device, which accelerate's un-indexed "cuda" follows). Several GPUs
    in one process are refused: that is a job's `accelerate launch` (engine.train.jobs)."""
    if not device.startswith("cuda") or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return args  # CPU, or one rank of a distributed launch (transformers sets n_gpu=1 there)
    import torch

    spec = device.partition(":")[2]
    if "," in spec:
        raise TrainError(f"device {device!r} names several GPUs: training in this process uses one; "
                         "submit a job (it runs one process per GPU under accelerate launch)")
    index = int(spec) if spec else 0
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise TrainError(f"device {device!r}: this process sees {count} GPU(s) (CUDA_VISIBLE_DEVICES numbers them from 0)")
    _ = args.device  # transformers' own set-up first (accelerate state, its cuda:0)
    args._n_gpu = 1
    args.__dict__["_setup_devices"] = torch.device("cuda", index)  # the cached property's value
    torch.cuda.set_device(index)
    return args


def resolve_precision(config: TrainConfig, device: str) -> str:
    import torch

    if config.precision != "auto":
        if config.precision == "bf16" and device.startswith("cuda") and not torch.cuda.is_bf16_supported():
            raise TrainError("precision bf16 asked for, but this GPU does not support bf16")
        return config.precision
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


# ------------------------------------------------------------------ models


def local_model_folder(spec: str | Path) -> Path | None:
    """The folder of a `hf:PATH` / `PATH` model spec (None for `tiny`, built on demand); TrainError
    for what training cannot load (a server spec, a folder without config.json). Cheap: the job
    runner checks every training job with it before queueing."""
    text = str(spec).strip()
    if text == "tiny":
        return None
    if text.startswith(("openai:", "vllm:")):
        raise TrainError(f"model {text!r}: training needs a local model folder (tiny | PATH | hf:PATH)")
    path = Path(text.removeprefix("hf:")).expanduser()
    if not (path / "config.json").is_file():
        raise TrainError(f"model {text!r}: not a transformers model folder (no config.json)")
    return path.resolve()


def resolve_model_path(spec: str | Path, log: Callable[[str], None] = print) -> Path:
    """A local model folder from `tiny`, `hf:PATH` or `PATH` (training needs the weights at hand)."""
    path = local_model_folder(spec)
    if path is None:
        from engine.llm.tiny_checkpoint import tiny_model_dir

        return tiny_model_dir(log=log)
    return path


def load_model(path: str | Path, config: TrainConfig) -> tuple[Any, Any, str, str]:
    """(model, tokenizer, device, precision) for training.

    The weights are ALWAYS loaded in fp32, also under bf16: `bf16=True` then makes the Trainer
    compute in bf16 autocast while AdamW updates fp32 master weights. Loading bf16 weights and
    updating them directly rounds most small updates away (measured on CPU, 4 DPO steps at lr
    1e-6: 2% of the weights changed in bf16 vs ~100% in fp32; bench/gpu/precision.py); a LoRA
    merged into a bf16 base loses its delta the same way."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(config.device)
    precision = resolve_precision(config, device)
    dtype = torch.float32  # master weights; see the docstring
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - a broken folder (cut weights, a config of another shape): one line
        raise TrainError(f"cannot load a model from {path}: {cause_line(e)}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        raise TrainError(f"{path}: the tokenizer has no chat template")
    return model, tokenizer, device, precision


def lora_config(config: TrainConfig) -> Any:
    from peft import LoraConfig

    targets: Any = config.lora_targets
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM")


def check_output_folder(out_dir: str | Path) -> Path:
    """The absolute output folder, or TrainError where saving a model there would destroy something.

    A model may go to a new folder, an empty one, or an Orchard model folder: one holding a real
    `orchard_train.json` (TRAIN_META: a JSON object with this format, `saved_at` and `files`, the
    names `save_model` wrote there) and nothing but those files, so replacing it deletes only what
    Orchard wrote. Anything else is refused: a file, a folder with other files (a home folder, a
    dataset, the repository), a hand-made or older marker (`{}`, no file list), a model folder
    holding a file of the user's. Cheap: checked when a job is submitted, when its worker starts and
    again just before the folder is replaced."""
    out = Path(out_dir).expanduser().resolve()
    try:
        if out.exists() and not out.is_dir():
            raise TrainError(f"output {out}: is a file, not a folder")
        if out.is_dir() and any(out.iterdir()):
            if not (out / TRAIN_META).is_file():
                raise TrainError(f"output folder {out} is not empty and is not an Orchard model folder "
                                 f"(no {TRAIN_META}); choose a new or empty folder")
            if _written_files(out) is None:
                raise TrainError(f"output folder {out} is not empty and is not an Orchard model folder (its "
                                 f"{TRAIN_META} lacks the format, saved_at and files Orchard writes); "
                                 "choose a new or empty folder")
            foreign = _foreign_files(out)
            if foreign:
                raise TrainError(f"output folder {out} holds files its model did not come with "
                                 f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); "
                                 "nothing is deleted: move them out or choose another folder")
    except OSError as e:
        raise TrainError(f"output folder {out}: cannot be checked ({e.strerror or e})") from None
    return out


def _written_files(folder: Path) -> set[str] | None:
    """The names `save_model` wrote into `folder`, from a real marker; None when it has none."""
    meta = read_train_meta(folder)
    if not isinstance(meta, dict) or type(meta.get("format")) is not int or meta["format"] != TRAIN_FORMAT:
        return None
    files = meta.get("files")
    if not isinstance(meta.get("saved_at"), str) or not isinstance(files, list) or not all(
            isinstance(f, str) and f not in ("", ".", "..") and "/" not in f and "\\" not in f for f in files):
        return None
    return {*files, TRAIN_META}


def _foreign_files(folder: Path) -> list[str]:
    """Entries of `folder` its marker does not list (all of them without a real marker)."""
    ours = _written_files(folder) or set()
    return sorted(p.name for p in folder.iterdir() if p.name not in ours)


def save_model(model: Any, tokenizer: Any, out_dir: str | Path, meta: dict[str, Any],
               state_dict: dict[str, Any] | None = None) -> Path:
    """Write the model (LoRA merged), tokenizer and `orchard_train.json` to `out_dir`, atomically:
    the folder appears complete or not at all (a sibling temp folder is renamed into place; an
    Orchard model already there is first renamed aside and deleted only once the new one is in
    place, so a crash at any point leaves the old model or the new one, never a half folder). The
    marker lists the files written (`files`): `check_output_folder` replaces nothing else.
    `out_dir` must pass `check_output_folder`."""
    out = check_output_folder(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        from peft import PeftModel

        if isinstance(model, PeftModel):
            model = model.merge_and_unload()
    except ImportError:  # pragma: no cover - peft is a dependency
        pass
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.saving-"))
    old: Path | None = None
    try:
        model.save_pretrained(tmp, safe_serialization=True, **({"state_dict": state_dict} if state_dict else {}))
        tokenizer.save_pretrained(tmp)
        files = sorted({p.name for p in tmp.iterdir()} | {TRAIN_META})
        record = {**meta, "format": TRAIN_FORMAT, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files}
        (tmp / TRAIN_META).write_text(json.dumps(record, indent=2, default=str))
        check_output_folder(out)  # it may have been filled while training
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.replaced-"))
            os.replace(out, old)  # onto an empty folder: allowed, atomic
        os.replace(tmp, out)
    except BaseException:
        if old is not None and not out.exists():
            os.replace(old, out)  # put the previous model back
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        # The old model is deleted only if it holds nothing but what its marker lists (a file put
        # there after the last check keeps the whole old folder, aside, rather than be deleted).
        if old is not None and not _foreign_files(old):
            shutil.rmtree(old, ignore_errors=True)
    return out


def save_trained(trainer: Any, tokenizer: Any, out_dir: str | Path, meta: dict[str, Any]) -> Path | None:
    """Save a trained model from every process of a run: the main process writes the folder (the
    others return None). Under FSDP every process first takes part in gathering the full weights."""
    acc = trainer.accelerator
    model, state = trainer.model, None
    if getattr(trainer, "is_fsdp_enabled", False):
        state = acc.get_state_dict(trainer.model)  # a collective: every rank calls it
        model = acc.unwrap_model(trainer.model)
    saved = save_model(model, tokenizer, out_dir, meta, state_dict=state) if acc.is_main_process else None
    acc.wait_for_everyone()
    return saved


def default_output_dir(name: str) -> Path:
    """`$ORCHARD_HOME/models/trained/NAME`, else `<repo>/data/models/trained/NAME` (engine.paths)."""
    return paths.trained_model_dir(name)


# ------------------------------------------------------------------ progress


def progress_callback(reporter: Reporter, phase: str) -> Any:
    """A transformers TrainerCallback: step/total/ETA and every log record to `reporter`, and a
    clean stop at the next step end when `reporter.should_stop()`."""
    from transformers import TrainerCallback

    class _Callback(TrainerCallback):
        def __init__(self) -> None:
            self.began = time.monotonic()
            self.stopped = False

        def on_train_begin(self, args, state, control, **kwargs):
            self.began = time.monotonic()
            reporter.progress({"phase": phase, "step": 0, "total": state.max_steps, "eta_s": None})

        def on_step_end(self, args, state, control, **kwargs):
            elapsed = time.monotonic() - self.began
            step, total = state.global_step, state.max_steps
            eta = elapsed / step * (total - step) if step else None
            reporter.progress({"phase": phase, "step": step, "total": total, "eta_s": eta,
                               "elapsed_s": elapsed, "steps_per_s": step / elapsed if elapsed > 0 else None})
            if reporter.should_stop():
                self.stopped = True
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                reporter.metrics(state.global_step, {k: v for k, v in logs.items() if isinstance(v, (int, float))})

    return _Callback()


def quiet_trainer(trainer: Any) -> None:
    """Drop transformers' stdout printer: the metric stream goes to the reporter instead."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


# ------------------------------------------------------------------ TRL arguments


def trl_common_args(config: TrainConfig, device: str, precision: str, scratch: str | Path) -> dict[str, Any]:
    """Keyword arguments shared by DPOConfig and SFTConfig: no checkpoints, no hub, no reports,
    our precision and device choice, the seed."""
    return {
        "output_dir": str(scratch),
        "learning_rate": config.learning_rate,
        "num_train_epochs": config.epochs,
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        "warmup_steps": config.warmup,
        "weight_decay": config.weight_decay,
        "lr_scheduler_type": config.lr_scheduler,
        "max_length": config.max_length,
        "seed": config.seed,
        "bf16": precision == "bf16",
        **checkpointing_kwarg(config.gradient_checkpointing),
        "use_cpu": device == "cpu",
        "logging_steps": config.logging_steps,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def checkpointing_kwarg(enabled: bool, training_args: Any = None) -> dict[str, bool]:
    """Activation checkpointing under the name the INSTALLED transformers knows: newer versions
    call it `activation_checkpointing` (and keep `gradient_checkpointing` as a deprecated alias);
    the versions vLLM pins (< 5.21) know only `gradient_checkpointing`, and an unknown keyword
    makes DPOConfig/SFTConfig raise TypeError."""
    import dataclasses

    if training_args is None:
        from transformers import TrainingArguments as training_args
    names = {f.name for f in dataclasses.fields(training_args)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": enabled}


@dataclass(frozen=True)
class TrainResult:
    """What a training call produced: the saved folder (None when stopped early), the data ids it
    trained on, the final metrics, and the full metric stream."""

    output: Path | None
    data_ids: list[str]
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    stopped: bool = False


def summarize_history(history: list[dict[str, Any]]) -> dict[str, Any]:
    """First and last values of each logged metric, plus the trainer's own summary fields."""
    out: dict[str, Any] = {}
    for row in history:
        for key, value in row.items():
            if key in ("step", "epoch"):
                continue
            out.setdefault(f"first_{key}", value)
            out[f"last_{key}"] = value
    return out


def with_threads(config: TrainConfig) -> Any:
    """A context manager setting torch's CPU threads for the duration of training."""
    from engine.torch_threads import torch_threads

    return torch_threads(config.num_threads)


def merged_config(cls: type[TrainConfig], base: TrainConfig | None, **overrides: Any) -> TrainConfig:
    """`base` (or the class defaults) with non-None `overrides` applied."""
    values = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **values) if base is not None else cls(**values)
