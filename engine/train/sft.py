"""SFT with per-turn loss masks: Agent-R revision trajectories (arXiv 2501.11425; docs/algorithms.md
§4.3), AgentRefine refinement data (arXiv 2501.01702; §5.4), RFT (Agent Q's baseline, arXiv 2408.07199;
§3.3).

TRL has no per-turn mask, so rows reach SFTTrainer pre-tokenized with `input_ids` and
`assistant_masks` (a pre-tokenized row with its mask); TRL turns the masks into labels (-100 where 0). Two
renderings of a sample (`format`):

- "steps" (default): one row per trained turn, its prompt built by `actor_prompt` from the earlier
  turns exactly as the policy sees it at inference (history of actions, the latest observation
  only), and the completion the turn's text + EOS, as the generator produces it. Untrained turns
  (an Agent-R bad segment) get no row but stay in later rows' histories, so the revision turn is
  learnt in the context of the mistakes it corrects.
- "chat": the whole multi-turn chat, each assistant message trained or not by its flag
  (`formats.tokenize_messages`); the form AgentGym / AgentRefine data is published in.

RFT (rejection-sampling fine-tuning) is SFT on the successful trajectories (`kind` "rft").
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError
from engine.datasets.samples import KINDS, Sample
from engine.llm.tokens import encode_completion, encode_prompt
from engine.progress import MemoryReporter, Reporter
from engine.store.review import LABEL_RULES
from engine.train.common import (
    TrainConfig,
    TrainError,
    TrainResult,
    check_output_folder,
    load_model,
    lora_config,
    pin_one_device,
    progress_callback,
    quiet_trainer,
    save_trained,
    summarize_history,
    trl_common_args,
    with_threads,
)
from engine.train.selection import keep_labelled

if TYPE_CHECKING:
    from engine.store import FinalLabel, Store

SFT_FORMATS = ("steps", "chat")
LOSS_ON = ("completion", "action")


@dataclass(frozen=True)
class SFTTrainConfig(TrainConfig):
    """SFT settings. Data: samples of `kinds` whose final label is in `statuses` (+ undecided ones with
    `include_pending`: `selection.keep_labelled`). `revision_share`: the fraction of revision trajectories in the mix with
    good ones (Agent-R; None = use all as selected)."""

    learning_rate: float = field(default=2e-5, metadata={"help": "learning rate"})
    format: str = field(default="steps", metadata={"help": "per-step actor prompts or whole chats",
                                                   "choices": SFT_FORMATS})
    kinds: tuple[str, ...] = field(default=("revision", "good"), metadata={"help": "sample kinds"})
    statuses: tuple[str, ...] = field(default=("approved", "edited"), metadata={"help": "curation statuses to use"})
    include_pending: bool = field(default=False, metadata={
        "help": "also train on undecided rows (pending, never reviewed); unsettled ones never"})
    labels: str = field(default="settled", metadata={
        "help": "final-label rule for reviewed samples: settled (maintainer or unanimous) or majority",
        "choices": LABEL_RULES})
    revision_share: float | None = field(default=None, metadata={
        "help": "fraction of revision trajectories in the mix (Agent-R)"})
    loss_on: str = field(default="completion", metadata={
        "help": "the tokens each trained step's loss covers: its whole completion, or only its command (the ACTION "
                "line; steps format)", "choices": LOSS_ON})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.format not in SFT_FORMATS:
            raise ConfigError(f"SFTTrainConfig.format: {self.format!r} is not one of {', '.join(SFT_FORMATS)}")
        bad = set(self.kinds) - set(KINDS)
        if bad or not self.kinds:
            raise ConfigError(f"SFTTrainConfig.kinds: unknown kind(s) {sorted(bad) or '(none given)'}")
        if self.labels not in LABEL_RULES:
            raise ConfigError(f"SFTTrainConfig.labels: {self.labels!r} is not one of {', '.join(LABEL_RULES)}")
        if self.loss_on not in LOSS_ON:
            raise ConfigError(f"SFTTrainConfig.loss_on: {self.loss_on!r} is not one of {', '.join(LOSS_ON)}")
        if self.loss_on == "action" and self.format != "steps":
            raise ConfigError("SFTTrainConfig.loss_on: 'action' needs format 'steps' (a chat row's masks are per turn)")
        if self.revision_share is not None and not 0 < self.revision_share <= 1:
            raise ConfigError(f"SFTTrainConfig.revision_share: must be in (0, 1], got {self.revision_share!r}")



@dataclass(frozen=True)
class RFTTrainConfig(SFTTrainConfig):
    """SFT on the RFT rows (successful trajectories of a search): an rft job's train settings."""

    kinds: tuple[str, ...] = field(default=("rft",), metadata={"help": "sample kinds"})


def rft_config(**overrides: Any) -> SFTTrainConfig:
    """The RFT baseline: SFT on successful trajectories."""
    return SFTTrainConfig(**{"kinds": ("rft",), **overrides})


def select_samples(store: Store, config: SFTTrainConfig, runs: Sequence[str] | None = None) -> list[Sample]:
    return labelled_samples(store, config, runs)[0]


def labelled_samples(store: Store, config: SFTTrainConfig,
                     runs: Sequence[str] | None = None) -> tuple[list[Sample], dict[str, FinalLabel]]:
    """The samples an SFT job trains on (by final label, as `dpo.labelled_pairs`) and their labels."""
    out: list[Sample] = []
    for run in runs if runs else [None]:
        run_id = store.find_run(run) if run is not None else None
        out.extend(store.samples(run_id=run_id, kind=list(config.kinds)))
    out, labels = keep_labelled(store, "sample", out, config.statuses, config.include_pending, config.labels)
    if config.revision_share is not None:
        out = mix_revisions(out, config.revision_share, config.seed)
    used = {s.id for s in out}
    return out, {k: v for k, v in labels.items() if k in used}


def mix_revisions(samples: Sequence[Sample], share: float, seed: int = 0) -> list[Sample]:
    """A subset where revision trajectories make up `share` of the rows (Agent-R's rising share):
    all revisions and as many other rows as the share allows, or fewer revisions when the other
    rows run out. Deterministic per seed."""
    rev = [s for s in samples if s.kind == "revision"]
    rest = [s for s in samples if s.kind != "revision"]
    rng = random.Random(seed)
    if share >= 1 or not rest:
        return rev or list(samples)
    want_rest = round(len(rev) * (1 - share) / share)
    if want_rest > len(rest):
        want_rev = min(len(rev), round(len(rest) * share / (1 - share)))
        rev = rng.sample(rev, want_rev)
        want_rest = len(rest)
    return sorted([*rev, *rng.sample(rest, want_rest)], key=lambda s: s.id)


def step_rows(sample: Sample, tokenizer: Any, loss_on: str = "completion") -> list[dict[str, Any]]:
    from engine.datasets.samples import to_step_rows

    rows = []
    for row in to_step_rows(sample):
        prompt = encode_prompt(tokenizer, row["prompt"])
        text = row["completion"][0]["content"]
        if loss_on == "completion":
            completion = encode_completion(tokenizer, text)
            mask = [1] * len(completion)
        else:
            completion, mask = command_tokens(tokenizer, text)
        if 1 in mask:
            rows.append({"id": row["id"], "input_ids": prompt + completion, "assistant_masks": [0] * len(prompt) + mask})
    return rows


def command_tokens(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """`encode_completion(tokenizer, text)` and its loss mask that trains only the command's tokens (every token
    overlapping `actions.command_span`; not the EOS), from one tokenization: all zeros for a text `parse` refuses."""
    from engine.actions import command_span

    if not getattr(tokenizer, "is_fast", False):
        raise TrainError("SFTTrainConfig.loss_on 'action' needs a fast tokenizer (character offsets per token)")
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]) + [tokenizer.eos_token_id], encoded["offset_mapping"]
    span = command_span(text)
    if span is None:
        return ids, [0] * len(ids)
    return ids, [int(a < span[1] and b > span[0]) for a, b in offsets] + [0]


def chat_rows(sample: Sample, tokenizer: Any) -> list[dict[str, Any]]:
    from engine.datasets.formats import tokenize_messages
    from engine.datasets.samples import to_messages

    tok = tokenize_messages(to_messages(sample), tokenizer)
    if 1 not in tok["assistant_masks"]:
        return []
    return [{"id": sample.id, **tok}]


def sft_rows(samples: Sequence[Sample], tokenizer: Any, fmt: str = "steps",
             loss_on: str = "completion") -> list[dict[str, Any]]:
    """Pre-tokenized rows (`id`, `input_ids`, `assistant_masks`) for SFTTrainer."""
    if fmt == "chat":
        return [row for s in samples for row in chat_rows(s, tokenizer)]
    return [row for s in samples for row in step_rows(s, tokenizer, loss_on)]


def build_trainer(
    model_path: str | Path,
    samples: Sequence[Sample],
    config: SFTTrainConfig,
    reporter: Reporter | None = None,
    scratch: str | Path | None = None,
) -> tuple[Any, Any, list[dict[str, Any]]]:
    """(trainer, tokenizer, rows) ready to `train()`."""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar

    from engine.train.trl_trainers import SFTConfig, SFTTrainer

    disable_progress_bar()

    if not samples:
        raise TrainError("no samples to train on (check kinds and statuses: by default only approved and edited "
                         "samples are used; include pending ones with --include-pending)")
    reporter = reporter or MemoryReporter()
    model, tokenizer, device, precision = load_model(model_path, config)
    rows = sft_rows(samples, tokenizer, config.format, config.loss_on)
    if not rows:
        raise TrainError(f"{len(samples)} samples, but none has a trained turn")
    args = pin_one_device(SFTConfig(
        **trl_common_args(config, device, precision, scratch or tempfile.mkdtemp(prefix="orchard-sft-")),
        assistant_only_loss=False,
        completion_only_loss=False,
        packing=False,
    ), device)
    reporter.log(f"SFT: {len(samples)} samples -> {len(rows)} rows ({config.format}), device={device}, "
                 f"precision={precision}, lora={config.lora}")
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        peft_config=lora_config(config) if config.lora else None, callbacks=[progress_callback(reporter, "sft")],
    )
    quiet_trainer(trainer)
    return trainer, tokenizer, rows


def train_sft(
    model_path: str | Path,
    samples: Sequence[Sample],
    config: SFTTrainConfig,
    output_dir: str | Path | None,
    reporter: Reporter | None = None,
    kind: str = "sft",
    parent: str | None = None,
) -> TrainResult:
    """SFT the model at `model_path` on `samples`; saved to `output_dir` unless None or stopped."""
    reporter = reporter or MemoryReporter()
    if output_dir is not None:
        check_output_folder(output_dir)  # refused before training, not after
    with with_threads(config), tempfile.TemporaryDirectory(prefix="orchard-sft-") as scratch:
        trainer, tokenizer, rows = build_trainer(model_path, samples, config, reporter, scratch)
        began = time.perf_counter()
        out = trainer.train()
        seconds = time.perf_counter() - began
        history = [dict(h) for h in trainer.state.log_history]
        stopped = trainer.state.global_step < trainer.state.max_steps
        ids = list(dict.fromkeys(s.id for s in samples))
        counts: dict[str, int] = {}
        for s in samples:
            counts[s.kind] = counts.get(s.kind, 0) + 1
        metrics = {**summarize_history([h for h in history if "loss" in h]), "train_loss": out.training_loss,
                   "steps": trainer.state.global_step, "train_seconds": seconds, "rows": len(rows),
                   "samples": counts, "trained_tokens": sum(sum(r["assistant_masks"]) for r in rows)}
        saved = None
        if output_dir is not None and not stopped:
            meta = {"kind": kind, "base_model": str(parent or model_path), "config": asdict(config),
                    "data_ids": ids, "metrics": metrics}
            saved = save_trained(trainer, tokenizer, output_dir, meta)
            if saved is not None:  # the main process (the others of a multi-GPU run save nothing)
                reporter.log(f"{kind.upper()}: saved {saved}")
    return TrainResult(output=saved, data_ids=ids, metrics=metrics, history=history, stopped=stopped)
