"""Orchard's TRL subclasses and the TRL names the trainers use: the one module of the engine that
imports TRL (tests/test_architecture.py checks it).

TRL (and torch with it) takes seconds to import, so this module is imported only inside the
functions that train (`dpo.build_trainer`, `sft.build_trainer`), never at the top of a module:
`orchard --help`, the dashboard and the job runner start without it.

- `MaskedPreferenceCollator`: TRL's preference collator with the completion mask narrowed to the
  rows' `chosen_mask` / `rejected_mask` (trajectory pairs train on assistant tokens only).
- `OrchardDPOTrainer`: DPOTrainer on pre-tokenized rows (`dpo.pair_rows`) whose reference
  log-probs are partly supplied by a plan (the replay buffer's stored values, spot-checked per run;
  engine/train/dpo.py's docstring), the rest scored by a reference pass gathered from every process.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference

from engine.train.common import TrainError

__all__ = ["DPOConfig", "MaskedPreferenceCollator", "OrchardDPOTrainer", "SFTConfig", "SFTTrainer"]


class MaskedPreferenceCollator(DataCollatorForPreference):
    """TRL's collator, with the completion mask narrowed to `chosen_mask`/`rejected_mask`
    (trajectory pairs: assistant tokens only)."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        out = super().torch_call(examples)
        if "chosen_mask" not in examples[0]:
            return out
        masks = [[0] * len(e["prompt_ids"]) + list(e["chosen_mask"]) for e in examples]
        masks += [[0] * len(e["prompt_ids"]) + list(e["rejected_mask"]) for e in examples]
        width = out["completion_mask"].shape[1]
        narrowed = torch.zeros_like(out["completion_mask"])
        for i, m in enumerate(masks):
            m = m[:width] if self.truncation_mode == "keep_start" or self.max_length is None else m[-width:]
            narrowed[i, : len(m)] = torch.tensor(m, dtype=narrowed.dtype)
        out["completion_mask"] = out["completion_mask"] * narrowed
        return out


class OrchardDPOTrainer(DPOTrainer):
    """DPOTrainer taking pre-tokenized rows with per-token masks and partly supplied reference
    log-probs (`ref_plan`: stored values, run groups, tolerances, the rows to spot-check)."""

    ref_stats: dict[str, Any]

    def __init__(self, *args: Any, ref_plan: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._ref_plan = ref_plan or {}
        self.ref_stats = {}
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        if "prompt_ids" not in dataset.column_names:
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        if args.max_length is not None and args.truncation_mode == "keep_start":
            dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
        return dataset

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        # transformers' Trainer sets `_signature_columns = None` in __init__, so mypy infers the
        # type None; the super() call above has made it the list of column names.
        columns = [*self._signature_columns, "chosen_mask", "rejected_mask"]  # type: ignore[misc]
        self._signature_columns = columns  # type: ignore[assignment]

    def _reference_pass(self, dataset, batch_size: int) -> tuple[list[float], list[float]]:
        """The reference's (chosen, rejected) log-probs of every row, in order, from every process.
        TRL's own pass caches them in a file that only rank 0 writes, in a per-process temp
        folder for an in-memory dataset, so the other ranks of a multi-GPU run cannot read it;
        this pass keeps them in memory and gathers them instead."""
        from torch.utils.data import DataLoader

        loader = self.accelerator.prepare(DataLoader(dataset, batch_size=batch_size, shuffle=False,
                                                     collate_fn=self.data_collator, num_workers=0))
        model = self.ref_model or self.model
        chosen: list[float] = []
        rejected: list[float] = []
        for batch in loader:
            c, r = self.compute_ref_log_probs(model, batch)
            c, r = self.accelerator.gather_for_metrics((c, r))
            chosen += [float(v) for v in c.cpu()]
            rejected += [float(v) for v in r.cpu()]
        return chosen, rejected

    def _precompute_ref_logps(self, dataset, name, batch_size):
        """Fill only what the plan does not supply; spot-check stored values per group."""
        plan = self._ref_plan
        if "stored" not in plan or name != "train":
            chosen, rejected = self._reference_pass(dataset, batch_size)
            return dataset.add_column("ref_chosen_logps", chosen).add_column("ref_rejected_logps", rejected)
        stored: list[tuple[float, float] | None] = list(plan["stored"])
        groups: list[str] = plan["groups"]
        verify: set[int] = set(plan["verify"])
        n_tokens = [(sum(r["chosen_mask"]), sum(r["rejected_mask"])) for r in dataset]
        computed: dict[int, tuple[float, float]] = {}

        def score(indices: list[int]) -> None:
            todo = [i for i in indices if i not in computed]
            if not todo:
                return
            chosen, rejected = self._reference_pass(dataset.select(todo), batch_size)
            for i, c, r in zip(todo, chosen, rejected, strict=True):
                computed[i] = (c, r)

        score(sorted(verify | {i for i, s in enumerate(stored) if s is None}))
        worst: dict[str, float] = {}
        for i in verify:
            s = stored[i]
            if s is None:
                continue
            diff = max(abs(s[k] - computed[i][k]) / max(1, n_tokens[i][k]) for k in (0, 1))
            worst[groups[i]] = max(worst.get(groups[i], 0.0), diff)
        tolerance: dict[str, float] = plan["tolerance"]
        rejected_groups = sorted(g for g, d in worst.items() if d > tolerance[g])
        if rejected_groups:
            score([i for i, g in enumerate(groups) if g in rejected_groups])
        final: list[tuple[float, float]] = []
        used_stored = 0
        per_run: dict[str, dict[str, Any]] = {}
        for i, s in enumerate(stored):
            row = per_run.setdefault(groups[i], {"stored": 0, "rescored": 0, "verified": 0,
                                                 "max_diff_per_token": worst.get(groups[i]),
                                                 "tolerance": tolerance[groups[i]]})
            row["verified"] += i in verify
            if s is not None and groups[i] not in rejected_groups:
                final.append(s)
                used_stored += 1
                row["stored"] += 1
            else:
                final.append(computed[i])
                row["rescored"] += 1
        self.ref_stats = {
            "ref_stored": used_stored, "ref_computed": len(computed), "ref_verified": len(verify),
            "ref_verify_max_diff_per_token": max(worst.values(), default=None),
            "ref_groups_rejected": rejected_groups, "ref_per_run": per_run,
        }
        if plan.get("require_stored") and used_stored < len(final):
            raise TrainError(f"ref_source=stored: {len(final) - used_stored} pairs have no usable stored "
                             f"log-probs (groups failing the spot check: {rejected_groups or 'none'})")
        return dataset.add_column("ref_chosen_logps", [c for c, _ in final]).add_column(
            "ref_rejected_logps", [r for _, r in final])
