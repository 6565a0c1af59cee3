"""The value critic: Q^ of an expansion's candidates from a value model learned from earlier trees.

The inference half of issue 27 item 1d (the training half, and why BCE toward Q~, is in
engine/train/value_model.py). The value model is the policy's weights as a
`LlamaForSequenceClassification` with one output; it reads the actor prompt of the candidate's parent,
chat-templated as the generator feeds it, then the candidate's step text (its composite action and the
observation the env answered: at an expansion every candidate has been stepped already). Here, below
the trainers, so the search reaches no higher floor. torch and transformers are imported inside the
functions that need them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.config import ConfigError
from engine.errors import cause_line
from engine.llm.tokens import encode_completion, encode_prompt
from engine.paths import TRAIN_META, read_train_meta
from engine.prompts import actor_prompt
from engine.torch_threads import torch_threads
from engine.tree_nodes import SearchTree

KIND = "value_model"  # `kind` in the folder's orchard_train.json


def node_prompt(tree: SearchTree, node_id: int, env_description: str) -> list[dict[str, str]]:
    """The actor prompt the policy answered when it proposed `node_id` (its parent's state)."""
    node = tree.nodes[node_id]
    if node.parent is None:
        raise ValueError(f"task {tree.task.id} node {node_id}: the root is no candidate")
    parent = tree.nodes[node.parent]
    task = tree.task
    return actor_prompt(env_description, task.goal, task.context, tree.history(parent), parent.observation)


def encode(tokenizer: Any, prompt: list[dict[str, str]], step: str, max_length: int) -> list[int]:
    """The prompt's ids as the generator makes them, the step text and EOS; cut at the left to fit."""
    ids = encode_prompt(tokenizer, prompt) + encode_completion(tokenizer, step)
    return ids[-max_length:]


def right_padded(tokenizer: Any, rows: Sequence[list[int]]) -> tuple[Any, Any]:
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


def last_token_logits(model: Any, ids: Any, mask: Any) -> Any:
    """One logit per row, read at each row's last real token (not the head's pad-token search: the
    pad id may be a token of the text, e.g. where pad = eos)."""
    import torch

    out = model.model(input_ids=ids, attention_mask=mask)
    last = mask.sum(dim=1) - 1
    hidden = out.last_hidden_state[torch.arange(ids.shape[0]), last]
    return model.score(hidden).squeeze(-1)


def load_value_model(path: str | Path, base: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) from a value-model folder, or with `base` from a policy folder (a fresh head).
    A folder that cannot be loaded is a ConfigError naming it."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the new head's "newly initialized weights" notice is expected
        try:  # the policy's own architecture (a Llama class would drop a Qwen2's attention biases unsaid)
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, local_files_only=True, use_safetensors=True)
        finally:
            hf_logging.set_verbosity(verbosity)
    except Exception as e:  # noqa: BLE001 - a broken folder (cut weights, a config of another shape): one line
        raise ConfigError(f"cannot load a {'policy' if base else 'value'} model from {path}: {cause_line(e)}") from None
    if not (hasattr(model, "model") and hasattr(model, "score")):  # what value_logits reads (Llama, Qwen2, Mistral)
        raise ConfigError(f"cannot load a {'policy' if base else 'value'} model from {path}: its architecture "
                          f"({type(model).__name__}) has no body 'model' and head 'score'")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


class ValueCritic:
    """Q^ of an expansion's candidates = the value model's prediction sigmoid(logit) in [0, 1]."""

    def __init__(self, path: str | Path, num_threads: int | None = 2, max_length: int | None = None) -> None:
        meta = read_train_meta(path)
        if meta is None or meta.get("kind") != KIND:
            raise ConfigError(f"SearchConfig.value_model: {path} is not a value-model folder "
                              f"(no {TRAIN_META} of kind {KIND!r}; train one with engine/train/value_model.py)")
        try:
            self.model, self.tokenizer = load_value_model(path)
        except ConfigError as e:
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
            rows = [encode(self.tokenizer, prompt, s, self.max_length) for s in steps]
            ids, mask = right_padded(self.tokenizer, rows)
            logits = last_token_logits(self.model, ids, mask)
        values = [float(v) for v in torch.sigmoid(logits)]
        return [v if math.isfinite(v) else 0.0 for v in values]

    def score_nodes(self, tree: SearchTree, node_ids: Sequence[int], env_description: str) -> list[float]:
        """`score` of sibling tree nodes (one parent's candidates)."""
        if not node_ids:
            return []
        prompt = node_prompt(tree, node_ids[0], env_description)
        return self.score(prompt, [tree.step_text(n) for n in node_ids])


_LOADED: dict[tuple[str, float], ValueCritic] = {}


def value_critic(path: str | Path) -> ValueCritic:
    """The critic of a value-model folder, loaded once per process (and again when the folder changes):
    MCTS at inference builds a search per real step."""
    folder = Path(path).expanduser()
    marker = folder / TRAIN_META
    try:
        stamp = marker.stat().st_mtime
    except OSError:
        raise ConfigError(f"SearchConfig.value_model: {folder} is not a value-model folder "
                          f"(no {TRAIN_META})") from None
    key = (str(folder.resolve()), stamp)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = ValueCritic(folder)
    return _LOADED[key]
