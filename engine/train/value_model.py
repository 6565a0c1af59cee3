"""A value model learned from the trees' backed-up returns (issue 27 item 1d; docs/decisions.md "A value
model from the trees' returns"); the critic that ranks the next search's candidates with it is
engine/search/value_critic.py.

WHY: the policy model's own critic orders sibling candidates at chance (80 right vs 81 inverted of 468
pairs), while every visited node's Q~ is the mean of the returns of the simulations through it (eq. 8).
`engine/datasets/prm.py` turns stored trees into per-step rows of those values; this module fits a
model to them and scores the next search's candidates with it.

Model: the policy's own weights as a `LlamaForSequenceClassification` with one output (transformers
builds the linear `score` head on the last token's hidden state; the head starts random, the body from
the policy), so the value model reads exactly the tokens the policy read. Input: the actor prompt of
the candidate's parent (`actor_prompt`, chat-templated as the generator feeds it) followed by the
candidate as the PRM rows render a step (`SearchTree.step_text`: the composite action, then the
observation the env answered). At an expansion every candidate has been stepped already, so its
observation is known when the critic scores it.

Loss: binary cross-entropy of sigmoid(logit) against the soft target Q~, weighted by the node's visit
count N. WHY BCE and not squared error: Q~ is a mean of returns in [0, 1] (0/1 rewards, or latched
progress), and the BCE toward a soft target is a proper scoring rule minimised at exactly
sigmoid(logit) = Q~; weighted by N it equals the sum of the BCEs of the N individual returns, so a node
seen once counts once and a node behind twelve simulations twelve times, without a threshold that
would throw the graded progress values away (the prm rows' `labels` are Q~ >= threshold; their
`values` are what is fitted here).

torch and transformers are imported inside the functions that need them (the CLI and the search start
without them).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.config import ConfigError
from engine.datasets.prm import PRMConfig, prm_rows
from engine.datasets.samples import TreeRef
from engine.search.value_critic import (
    KIND,
    encode,
    last_token_logits,
    load_value_model,
    node_prompt,
    right_padded,
)
from engine.torch_threads import torch_threads
from engine.train.common import TrainError, save_model


@dataclass(frozen=True)
class ValueTrainConfig:
    """Training settings of the value model (CPU by default; a few epochs over a search's nodes)."""

    epochs: int = 4
    learning_rate: float = 1e-4
    batch_size: int = 8
    max_length: int = 1024  # tokens per example; longer ones keep their END (the candidate), cut at the left
    weight_by_visits: bool = True  # each node weighs N (its returns), see the module docstring
    seed: int = 0
    num_threads: int | None = 2
    prm: PRMConfig = field(default_factory=PRMConfig)  # which steps are rows (min_visits)

    def __post_init__(self) -> None:
        checks = {"epochs": self.epochs >= 1, "learning_rate": self.learning_rate > 0,
                  "batch_size": self.batch_size >= 1, "max_length": self.max_length >= 16,
                  "num_threads": self.num_threads is None or self.num_threads >= 1}
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"ValueTrainConfig.{name}: invalid value {getattr(self, name)!r}")


@dataclass(frozen=True)
class ValueExample:
    """One visited node: the parent's actor prompt, the candidate's step text, its Q~ and N."""

    prompt: list[dict[str, str]]
    step: str
    target: float
    visits: int
    tree_id: int | None
    node: int


def value_examples(refs: Sequence[TreeRef], config: PRMConfig | None = None) -> list[ValueExample]:
    """The prm rows' steps (`prm_rows`), one example per distinct node: paths share their prefixes, and a
    node on many paths is still one Q~ (its value and visits as the rows carry them)."""
    by_tree = {(r.run_id, r.tree_id, r.tree.task.id): r for r in refs}
    seen: set[tuple[Any, ...]] = set()
    out = []
    for row in prm_rows(refs, config or PRMConfig()):
        ref = by_tree[(row["run_id"], row["tree_id"], row["task_id"])]
        for node_id, value, visits in zip(row["path"], row["values"], row["visits"], strict=True):
            key = (row["run_id"], row["tree_id"], row["task_id"], node_id)
            if key in seen:
                continue
            seen.add(key)
            out.append(ValueExample(node_prompt(ref.tree, node_id, ref.env_description),
                                    ref.tree.step_text(node_id), float(value), int(visits),
                                    ref.tree_id, node_id))
    return out


def train_value_model(base: str | Path, examples: Sequence[ValueExample], out_dir: str | Path,
                      config: ValueTrainConfig = ValueTrainConfig()) -> dict[str, Any]:
    """Fit the value model (module docstring) from the policy folder `base`; saves it to `out_dir`
    (an Orchard model folder: `save_model`, atomic) and returns its metadata."""
    import torch

    if not examples:
        raise TrainError("value model: no examples (no visited step in the trees)")
    t0 = time.perf_counter()
    with torch_threads(config.num_threads):
        torch.manual_seed(config.seed)
        try:
            model, tokenizer = load_value_model(base, base=True)
        except ConfigError as e:
            raise TrainError(str(e)) from None
        torch.nn.init.zeros_(model.score.weight)  # every candidate starts at 0.5: no ordering from noise
        encoded = [encode(tokenizer, e.prompt, e.step, config.max_length) for e in examples]
        targets = torch.tensor([e.target for e in examples], dtype=torch.float32)
        weights = torch.tensor([float(e.visits) if config.weight_by_visits else 1.0 for e in examples])
        opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        rng = random.Random(config.seed)
        order = list(range(len(examples)))
        history = []
        model.train()
        for epoch in range(config.epochs):
            rng.shuffle(order)
            total, weight = 0.0, 0.0
            for start in range(0, len(order), config.batch_size):
                idx = order[start : start + config.batch_size]
                ids, mask = right_padded(tokenizer, [encoded[i] for i in idx])
                logits = last_token_logits(model, ids, mask)
                w = weights[idx]
                loss = (torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, targets[idx], reduction="none") * w).sum() / w.sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * float(w.sum())
                weight += float(w.sum())
            history.append({"epoch": epoch + 1, "loss": total / weight})
        model.eval()
    meta = {"kind": KIND, "base": str(base), "examples": len(examples),
            "mean_target": float(targets.mean()), "visits": int(weights.sum()) if config.weight_by_visits else None,
            "config": asdict(config), "history": history, "train_s": round(time.perf_counter() - t0, 1),
            "loss": "BCE toward Q~, weighted by N"}
    save_model(model, tokenizer, out_dir, meta)
    return meta
