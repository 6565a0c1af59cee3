"""Step-level DPO on curated preference pairs (Agent Q, arXiv 2408.07199; docs/algorithms.md §3.2) and the
trajectory-level baseline (§3.3).

Tokenization is the generator's, not TRL's: a step pair's prompt is the chat-templated actor prompt
with the generation header, and each completion is the tokenizer's encoding of the action text
followed by the EOS (end-of-turn) token — exactly what `HFGenerator.sample` generated and logged
as the replay buffer's log-prob, and what `HFGenerator.logprobs` re-scores. TRL's own tokenization
would also score the template's glue after the EOS (a newline), which the policy never generates
and the stored log-probs do not include. Rows reach TRL pre-tokenized (`prompt_ids`, `chosen_ids`,
`rejected_ids` plus per-token completion masks), so TRL scores exactly the tokens that were
generated.

Reference log-probs (`ref_source`):
- "auto" (default): the replay buffer's stored log-probs where they are the reference's, a one-off
  reference pass (TRL's precompute) for the rest. A stored value is used only when the pair is
  not edited, no completion is cut by `max_length`, the node's generated token count equals the
  canonical encoding + EOS (the sample ended at EOS and was tokenized canonically; checked when
  the store's token counts are given; a backend that returns the sampled ids stores no log-prob
  for a sample whose ids are not the canonical encoding, see `Completion.canonical`), and a spot
  check passes: `verify_per_run` pairs of each run are re-scored by the reference model and must
  agree within the run's tolerance in nats per token (a run searched with another model fails and
  is re-scored entirely). The tolerance is `ref_tolerance` when set, else `REF_TOLERANCE` for the
  backend that searched the run and the training precision (bf16 numerics differ between search
  and training kernels; 1e-3 would re-score every bf16 run). Each run's count of stored and
  re-scored reference values is logged.
- "stored": stored values only: an error if any pair lacks a usable one or a run fails the spot
  check (set verify_per_run=0 to skip the check and trust the buffer blindly).
- "precompute": TRL's one-off reference pass for every pair.
- "live": TRL's default, a reference forward at every step (an explicit copy of the starting
  weights is passed, so TRL never reloads the reference from the config's path).
Trajectory pairs are multi-turn chats scored on their assistant tokens only; their stored values
(sums of per-step log-probs under step prompts) are not the chat's, so they are always re-scored.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError
from engine.datasets.pairs import Pair
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

REF_SOURCES = ("auto", "stored", "precompute", "live")
_REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")

# Spot-check tolerance, nats per token, by (backend that searched the run, training precision).
# Measured on CPU with bench/gpu/ref_tolerance.py on the trained tiny model (48 sampled completions,
# ~27 tokens): HFGenerator.logprobs vs the trainer's reference pass, worst per-token gap (mean):
# fp32 vs fp32 1.0e-6 (2.6e-7); fp32 vs bf16 autocast 1.9e-2 (3.4e-3); bf16 weights vs fp32
# 1.8e-2 (3.6e-3); bf16 weights vs bf16 autocast 2.0e-2 (3.3e-3). The old 1e-3 would have re-scored
# every bf16 run. bf16 gets 2.5x the worst measured gap. fp32 keeps 1e-3, since the search dtype is
# not recorded: a run searched in bf16 (HF on a GPU) and trained in fp32 is re-scored, as logged.
# vLLM (bf16 or fp32 kernels) has NOT been measured (vLLM needs a GPU): 2x the HF bf16 value until a
# GPU run of the bench measures it; "openai" servers are unknown models and dtypes, the same.
REF_TOLERANCE: dict[tuple[str, str], float] = {
    ("hf", "fp32"): 1e-3,
    ("hf", "bf16"): 5e-2,
    ("vllm", "fp32"): 1e-1,
    ("vllm", "bf16"): 1e-1,
    ("openai", "fp32"): 1e-1,
    ("openai", "bf16"): 1e-1,
}


def spec_backend(spec: str | None) -> str:
    """hf | vllm | openai for a model spec (tiny, PATH and hf:PATH are the HF backend)."""
    text = (spec or "").strip()
    return "vllm" if text.startswith("vllm:") else "openai" if text.startswith("openai:") else "hf"


def reference_tolerance(config: DPOTrainConfig, backend: str, precision: str) -> float:
    """The spot check's tolerance for a run searched by `backend`, trained in `precision`."""
    if config.ref_tolerance is not None:
        return config.ref_tolerance
    return REF_TOLERANCE.get((backend, precision), REF_TOLERANCE[("vllm", "bf16")])


def run_backends(store: Any, run_ids: Sequence[str | None]) -> dict[str, str]:
    """{run id: backend} from the runs' model specs (for the per-run tolerance)."""
    out = {}
    for run_id in dict.fromkeys(r for r in run_ids if r):
        try:
            out[run_id] = spec_backend(store.run(run_id).model)
        except Exception:  # noqa: BLE001 - an unknown run keeps the default (hf)
            out[run_id] = "hf"
    return out


@dataclass(frozen=True)
class DPOTrainConfig(TrainConfig):
    """DPO settings. Data: pairs of `kinds` whose final label (engine.store.review: `labels` rule
    "settled" or "majority") is in `statuses` (approved and edited by default; `include_pending` adds
    undecided ones, never unsettled ones: `keep_labelled`), optionally only with Q gap >= min_gap."""

    learning_rate: float = field(default=1e-6, metadata={"help": "learning rate"})
    beta: float = field(default=0.1, metadata={"help": "DPO beta"})
    loss_type: str = "sigmoid"
    sft_weight: float = field(default=0.0, metadata={
        "help": "weight of an SFT term (mean NLL of the chosen completions) added to the DPO loss, as RPO; "
                "0 = plain DPO"})
    statuses: tuple[str, ...] = field(default=("approved", "edited"), metadata={"help": "curation statuses to use"})
    include_pending: bool = field(default=False, metadata={
        "help": "also train on undecided rows (pending, never reviewed); unsettled ones never"})
    labels: str = field(default="settled", metadata={
        "help": "final-label rule for reviewed pairs: settled (maintainer or unanimous) or majority",
        "choices": LABEL_RULES})
    kinds: tuple[str, ...] = ("step",)
    min_gap: float | None = field(default=None, metadata={"help": "only pairs with Q gap at least this"})
    ref_source: str = field(default="auto", metadata={
        "help": "reference log-probs: the stored replay buffer where valid (auto), stored only, precomputed "
                "or live", "choices": REF_SOURCES})
    verify_per_run: int = 4
    ref_tolerance: float | None = None  # nats per token; None: REF_TOLERANCE by backend and precision

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta <= 0:
            raise ConfigError(f"DPOTrainConfig.beta: must be > 0, got {self.beta!r}")
        if not self.sft_weight >= 0:
            raise ConfigError(f"DPOTrainConfig.sft_weight: must be >= 0, got {self.sft_weight!r}")
        if self.labels not in LABEL_RULES:
            raise ConfigError(f"DPOTrainConfig.labels: {self.labels!r} is not one of {', '.join(LABEL_RULES)}")
        if self.ref_source not in REF_SOURCES:
            raise ConfigError(f"DPOTrainConfig.ref_source: {self.ref_source!r} is not one of {', '.join(REF_SOURCES)}")
        if self.verify_per_run < 0 or (self.ref_tolerance is not None and self.ref_tolerance < 0):
            raise ConfigError("DPOTrainConfig: verify_per_run and ref_tolerance must be >= 0")
        bad = set(self.kinds) - {"step", "trajectory"}
        if bad or not self.kinds:
            raise ConfigError(f"DPOTrainConfig.kinds: expected step and/or trajectory, got {self.kinds!r}")


# ------------------------------------------------------------------ data


def select_pairs(store: Store, config: DPOTrainConfig, runs: Sequence[str] | None = None) -> list[Pair]:
    """The pairs a DPO job trains on, in a stable order."""
    return labelled_pairs(store, config, runs)[0]


def labelled_pairs(store: Store, config: DPOTrainConfig,
                   runs: Sequence[str] | None = None) -> tuple[list[Pair], dict[str, FinalLabel]]:
    """The pairs a DPO job trains on, and the final label of each that has one (the decisions it
    rests on: what the job records)."""
    out: list[Pair] = []
    seen: set[str] = set()
    for run in runs if runs else [None]:
        run_id = store.find_run(run) if run is not None else None
        # a pair several runs built is one pair (merged, with a source per run): trained once
        got = store.pairs(run_id=run_id, kind=list(config.kinds), min_gap=config.min_gap)
        out.extend(p for p in got if p.id not in seen)
        seen.update(p.id for p in got)
    return keep_labelled(store, "pair", out, config.statuses, config.include_pending, config.labels)


def _trajectory_ids(tokenizer: Any, prompt: list[dict[str, str]], messages: list[dict[str, str]],
                    prompt_ids: list[int]) -> tuple[list[int], list[int]]:
    from engine.datasets.formats import tokenize_messages

    rows = [{**m, "train": m["role"] == "assistant" or None} for m in [*prompt, *messages]]
    tok = tokenize_messages(rows, tokenizer)
    ids, mask = tok["input_ids"], tok["assistant_masks"]
    if ids[: len(prompt_ids)] != prompt_ids:
        raise TrainError("trajectory pair: the chat template does not render the prompt as a prefix of the chat")
    return ids[len(prompt_ids) :], mask[len(prompt_ids) :]


def pair_rows(pairs: Sequence[Pair], tokenizer: Any) -> list[dict[str, Any]]:
    """Pre-tokenized DPO rows: prompt/chosen/rejected ids and per-token completion masks."""
    rows = []
    prompts: dict[int, list[int]] = {}
    for p in pairs:
        key = id(p.prompt)
        if key not in prompts:
            prompts[key] = encode_prompt(tokenizer, p.prompt)
        prompt_ids = prompts[key]
        if p.kind == "step":
            chosen, rejected = encode_completion(tokenizer, p.chosen), encode_completion(tokenizer, p.rejected)
            chosen_mask, rejected_mask = [1] * len(chosen), [1] * len(rejected)
        else:
            chosen, chosen_mask = _trajectory_ids(tokenizer, p.prompt, p.messages("chosen"), prompt_ids)
            rejected, rejected_mask = _trajectory_ids(tokenizer, p.prompt, p.messages("rejected"), prompt_ids)
        rows.append({"id": p.id, "prompt_ids": prompt_ids, "chosen_ids": chosen, "rejected_ids": rejected,
                     "chosen_mask": chosen_mask, "rejected_mask": rejected_mask})
    return rows


def stored_reference(
    pairs: Sequence[Pair], rows: Sequence[dict[str, Any]], node_tokens: dict[tuple[int | None, int], int] | None,
    max_length: int | None = None,
) -> list[tuple[float, float] | None]:
    """Per pair, the stored (chosen, rejected) log-probs when they can be the reference's values
    for the tokens TRL scores, else None: a step pair, not edited, both values finite, neither
    completion cut by `max_length`, and (when `node_tokens` is given) each node's generated token
    count equal to the completion's ids (text + EOS)."""
    out: list[tuple[float, float] | None] = []
    for p, row in zip(pairs, rows, strict=True):
        chosen_lp, rejected_lp = p.logprob_chosen, p.logprob_rejected
        if chosen_lp is None or rejected_lp is None:
            out.append(None)
            continue
        ok = p.kind == "step" and p.status != "edited"
        ok = ok and math.isfinite(chosen_lp) and math.isfinite(rejected_lp)
        if ok and max_length is not None:
            longest = len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"]))
            ok = longest <= max_length  # the collator would cut the completion: not what was stored
        if ok and node_tokens is not None:
            for node, ids in ((p.chosen_node, row["chosen_ids"]), (p.rejected_node, row["rejected_ids"])):
                if node_tokens.get((p.tree_id, node)) != len(ids):
                    ok = False
        out.append((float(chosen_lp), float(rejected_lp)) if ok else None)
    return out


def _verify_indices(groups: Sequence[str], stored: Sequence[Any], per_group: int) -> list[int]:
    chosen: dict[str, list[int]] = {}
    for i, (g, s) in enumerate(zip(groups, stored, strict=True)):
        if s is not None and len(chosen.setdefault(g, [])) < per_group:
            chosen[g].append(i)
    return sorted(i for ids in chosen.values() for i in ids)


def build_trainer(
    model_path: str | Path,
    pairs: Sequence[Pair],
    config: DPOTrainConfig,
    reporter: Reporter | None = None,
    node_tokens: dict[tuple[int | None, int], int] | None = None,
    scratch: str | Path | None = None,
    backends: dict[str, str] | None = None,
) -> tuple[Any, Any, list[dict[str, Any]]]:
    """(trainer, tokenizer, rows) ready to `train()`; reference log-probs are resolved here.
    `backends`: {run id: hf | vllm | openai}, the backend that searched each run (its tolerance)."""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar

    from engine.train.trl_trainers import DPOConfig, MaskedPreferenceCollator, OrchardDPOTrainer

    disable_progress_bar()

    if not pairs:
        raise TrainError("no preference pairs to train on (check the statuses: by default only approved and "
                         "edited pairs are used; include pending ones with --include-pending)")
    reporter = reporter or MemoryReporter()
    model, tokenizer, device, precision = load_model(model_path, config)
    rows = pair_rows(pairs, tokenizer)
    if config.max_length is not None:  # TRL would drop these (nothing of the completion fits)
        keep = [i for i, r in enumerate(rows) if len(r["prompt_ids"]) < config.max_length]
        if len(keep) < len(rows):
            reporter.log(f"DPO: {len(rows) - len(keep)} pairs dropped: the prompt alone fills max_length "
                         f"{config.max_length}")
            rows, pairs = [rows[i] for i in keep], [pairs[i] for i in keep]
        if not rows:
            raise TrainError(f"every pair's prompt is longer than max_length {config.max_length}")
    mode = config.ref_source
    plan: dict[str, Any] | None = None
    if mode in ("auto", "stored"):
        stored = stored_reference(pairs, rows, node_tokens, config.max_length)
        groups = [p.run_id for p in pairs]
        tolerance = {g: reference_tolerance(config, (backends or {}).get(g, "hf"), precision) for g in set(groups)}
        plan = {"stored": stored, "groups": groups, "tolerance": tolerance,
                "verify": _verify_indices(groups, stored, config.verify_per_run),
                "require_stored": mode == "stored"}
        if mode == "stored" and any(s is None for s in stored):
            missing = sum(s is None for s in stored)
            raise TrainError(f"ref_source=stored: {missing} of {len(stored)} pairs have no usable stored log-probs "
                             "(edited, trajectory, missing, or not ended at EOS); use ref_source=auto")
    args = pin_one_device(DPOConfig(
        **trl_common_args(config, device, precision, scratch or tempfile.mkdtemp(prefix="orchard-dpo-")),
        beta=config.beta,
        loss_type=[config.loss_type, *(["sft"] if config.sft_weight else [])],
        loss_weights=[1.0, config.sft_weight] if config.sft_weight else None,
        precompute_ref_log_probs=mode != "live",
        remove_unused_columns=False,
    ), device)
    ref_model = None
    if mode == "live" and not config.lora:
        ref_model = copy.deepcopy(model).eval()  # never let TRL reload it from the config's path
    collator = MaskedPreferenceCollator(pad_token_id=tokenizer.pad_token_id, max_length=config.max_length,
                                  truncation_mode=args.truncation_mode)
    dataset = Dataset.from_list(rows)
    reporter.log(f"DPO: {len(rows)} pairs, ref_source={mode}, device={device}, precision={precision}, "
                 f"lora={config.lora}")
    began = time.perf_counter()
    trainer = OrchardDPOTrainer(
        model=model, ref_model=ref_model, args=args, train_dataset=dataset, processing_class=tokenizer,
        data_collator=collator, peft_config=lora_config(config) if config.lora else None,
        callbacks=[progress_callback(reporter, "dpo")], ref_plan=plan,
    )
    quiet_trainer(trainer)
    if mode == "precompute":
        trainer.ref_stats = {"ref_stored": 0, "ref_computed": len(rows)}
    elif mode == "live":
        trainer.ref_stats = {"ref_stored": 0, "ref_computed": 0, "ref_live": True}
    trainer.ref_stats["ref_setup_s"] = time.perf_counter() - began
    return trainer, tokenizer, rows


def reference_lines(stats: dict[str, Any], pairs: int) -> list[str]:
    """What the log says about the reference: per search run, how many pairs use the stored
    log-probs and how many were re-scored, with the spot check's worst gap and tolerance."""
    per_run = stats.get("ref_per_run")
    if not per_run:
        how = "live reference forward each step" if stats.get("ref_live") else "re-scored by a reference pass"
        return [f"DPO reference: {pairs} pairs, 0 stored, {stats.get('ref_computed', pairs)} {how}"]
    head = (f"DPO reference: {pairs} pairs, {stats['ref_stored']} stored, {pairs - stats['ref_stored']} re-scored "
            f"({stats['ref_computed']} scored by the reference pass, spot checks included)")
    lines = [head]
    for run, r in sorted(per_run.items(), key=lambda kv: str(kv[0])):
        check = ("not spot-checked" if r["max_diff_per_token"] is None else
                 f"spot check {r['verified']} pairs, worst {r['max_diff_per_token']:.2e} nats/token vs tolerance "
                 f"{r['tolerance']:.1e}" + (": REJECTED, run re-scored" if r["max_diff_per_token"] > r["tolerance"]
                                            else ""))
        lines.append(f"  run {run}: {r['stored']} stored, {r['rescored']} re-scored; {check}")
    return lines


def train_dpo(
    model_path: str | Path,
    pairs: Sequence[Pair],
    config: DPOTrainConfig,
    output_dir: str | Path | None,
    reporter: Reporter | None = None,
    node_tokens: dict[tuple[int | None, int], int] | None = None,
    parent: str | None = None,
    backends: dict[str, str] | None = None,
) -> TrainResult:
    """DPO-train the model at `model_path` on `pairs` and save it to `output_dir` (None: don't save)."""
    reporter = reporter or MemoryReporter()
    if output_dir is not None:
        check_output_folder(output_dir)  # refused before training, not after
    with with_threads(config), tempfile.TemporaryDirectory(prefix="orchard-dpo-") as scratch:
        trainer, tokenizer, rows = build_trainer(model_path, pairs, config, reporter, node_tokens, scratch, backends)
        for line in reference_lines(trainer.ref_stats, len(rows)):
            reporter.log(line)
        began = time.perf_counter()
        out = trainer.train()
        seconds = time.perf_counter() - began
        history = [dict(h) for h in trainer.state.log_history]
        stopped = trainer.state.global_step < trainer.state.max_steps
        metrics = {**summarize_history([h for h in history if "loss" in h]), **trainer.ref_stats,
                   "train_loss": out.training_loss, "steps": trainer.state.global_step,
                   "train_seconds": seconds, "steps_per_s": trainer.state.global_step / seconds if seconds else None,
                   "pairs": len(rows)}
        ids = [r["id"] for r in rows]
        saved = None
        if output_dir is not None and not stopped:
            meta = {"kind": "dpo", "base_model": str(parent or model_path), "config": asdict(config),
                    "data_ids": ids, "metrics": metrics}
            saved = save_trained(trainer, tokenizer, output_dir, meta)
            if saved is not None:  # the main process (the others of a multi-GPU run save nothing)
                reporter.log(f"DPO: saved {saved}")
    return TrainResult(output=saved, data_ids=ids, metrics=metrics, history=history, stopped=stopped)
