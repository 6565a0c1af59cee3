"""A value model learned from the trees' backed-up returns, and the critic that ranks candidates with it
(issue 27 item 1d; docs/decisions.md "A value model from the trees' returns").

WHY: the policy model's own critic orders sibling candidates at chance (80 right vs 81 inverted of 468
pairs), while every visited node's Q~ is the mean of the returns of the simulations through it (eq. 8).
`engine/datasets/prm.py` turns stored trees into per-step rows of those values; this module fits a
model to them and scores the next search's candidates with it.

Model: the policy's own weights as a `LlamaForSequenceClassification` with one output (transformers
builds the linear `score` head on the last token's hidden state; the head starts random, the body from
the policy), so the value model reads exactly the tokens the policy read. Input: the actor prompt of
the candidate's parent (`actor_prompt`, chat-templated as the generator feeds it) followed by the
candidate as the PRM rows render a step (`prm.tree_step_text`: the composite action, then the
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

import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.config import ConfigError
from engine.datasets.prm import PRMConfig, prm_rows, tree_step_text
from engine.datasets.samples import TreeRef
from engine.prompts import actor_prompt
from engine.search.tree import SearchTree
from engine.torch_threads import torch_threads
from engine.train.common import TrainError, read_train_meta, save_model

KIND = "value_model"  # `kind` in the folder's orchard_train.json


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


def node_prompt(tree: SearchTree, node_id: int, env_description: str) -> list[dict[str, str]]:
    """The actor prompt the policy answered when it proposed `node_id` (its parent's state)."""
    node = tree.nodes[node_id]
    if node.parent is None:
        raise ValueError(f"task {tree.task.id} node {node_id}: the root is no candidate")
    parent = tree.nodes[node.parent]
    task = tree.task
    return actor_prompt(env_description, task.goal, task.context, tree.history(parent), parent.observation)


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
                                    tree_step_text(ref.tree, node_id), float(value), int(visits),
                                    ref.tree_id, node_id))
    return out


def encode(tokenizer: Any, prompt: list[dict[str, str]], step: str, max_length: int) -> list[int]:
    """The prompt's ids as the generator makes them, the step text and EOS; cut at the left to fit."""
    from engine.train.tokens import encode_completion, encode_prompt

    ids = encode_prompt(tokenizer, prompt) + encode_completion(tokenizer, step)
    return ids[-max_length:]


def _batch(tokenizer: Any, rows: Sequence[list[int]]) -> tuple[Any, Any]:
    """Right-padded ids and mask (the head reads each row's last non-pad token)."""
    import torch

    pad = tokenizer.pad_token_id
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def _logits(model: Any, ids: Any, mask: Any) -> Any:
    """One logit per row, read at each row's last real token (not the head's pad-token search: the
    pad id may be a token of the text, e.g. where pad = eos)."""
    import torch

    out = model.model(input_ids=ids, attention_mask=mask)
    last = mask.sum(dim=1) - 1
    hidden = out.last_hidden_state[torch.arange(ids.shape[0]), last]
    return model.score(hidden).squeeze(-1)


def load_value_model(path: str | Path, base: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) from a value-model folder, or with `base` from a policy folder (a fresh head)."""
    from transformers import AutoTokenizer, LlamaForSequenceClassification
    from transformers.utils import logging as hf_logging

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the new head's "newly initialized weights" notice is expected
        try:
            model = LlamaForSequenceClassification.from_pretrained(
                path, num_labels=1, local_files_only=True, use_safetensors=True)
        finally:
            hf_logging.set_verbosity(verbosity)
    except (OSError, ValueError) as e:
        raise TrainError(f"cannot load a {'policy' if base else 'value'} model from {path}: {e}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


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
        model, tokenizer = load_value_model(base, base=True)
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
                ids, mask = _batch(tokenizer, [encoded[i] for i in idx])
                logits = _logits(model, ids, mask)
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


class ValueCritic:
    """Q^ of an expansion's candidates = the value model's prediction sigmoid(logit) in [0, 1]."""

    def __init__(self, path: str | Path, num_threads: int | None = 2, max_length: int | None = None) -> None:
        meta = read_train_meta(path)
        if not isinstance(meta, dict) or meta.get("kind") != KIND:
            raise ConfigError(f"SearchConfig.value_model: {path} is not a value-model folder "
                              f"(no orchard_train.json of kind {KIND!r}; train one with engine/train/value_model.py)")
        try:
            self.model, self.tokenizer = load_value_model(path)
        except TrainError as e:
            raise ConfigError(f"SearchConfig.value_model: {e}") from None
        self.model.eval()
        self.path = str(path)
        self.num_threads = num_threads
        trained = meta.get("config", {}).get("max_length") if isinstance(meta.get("config"), dict) else None
        self.max_length = max_length or (trained if isinstance(trained, int) and trained >= 16 else 1024)

    def score(self, prompt: list[dict[str, str]], steps: Sequence[str]) -> list[float]:
        """Predicted values of the candidates `steps` (step texts) after the actor `prompt`."""
        if not steps:
            return []
        import torch

        with torch_threads(self.num_threads), torch.no_grad():
            ids, mask = _batch(self.tokenizer, [encode(self.tokenizer, prompt, s, self.max_length) for s in steps])
            logits = _logits(self.model, ids, mask)
        values = [float(v) for v in torch.sigmoid(logits)]
        return [v if math.isfinite(v) else 0.0 for v in values]

    def score_nodes(self, tree: SearchTree, node_ids: Sequence[int], env_description: str) -> list[float]:
        """`score` of sibling tree nodes (one parent's candidates)."""
        if not node_ids:
            return []
        prompt = node_prompt(tree, node_ids[0], env_description)
        return self.score(prompt, [tree_step_text(tree, n) for n in node_ids])


_LOADED: dict[tuple[str, float], ValueCritic] = {}


def value_critic(path: str | Path) -> ValueCritic:
    """The critic of a value-model folder, loaded once per process (and again when the folder changes):
    MCTS at inference builds a search per real step."""
    folder = Path(path).expanduser()
    marker = folder / "orchard_train.json"
    try:
        stamp = marker.stat().st_mtime
    except OSError:
        raise ConfigError(f"SearchConfig.value_model: {folder} is not a value-model folder "
                          "(no orchard_train.json)") from None
    key = (str(folder.resolve()), stamp)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = ValueCritic(folder)
    return _LOADED[key]
