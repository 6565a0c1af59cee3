"""`PrefixCache`: the key/value states of recent prompts, reused by any later prompt that starts the same way.

WHY: search prompts repeat themselves. Every prompt of a tree is the system text, the task block and
the history so far, then the current observation; a child's prompt is its parent's up to the end of
the history, a rollout's next prompt is its last one plus a step. Measured on the shipped 5.3M policy
(MCTS at inference, 4 TextCraft tasks), the prefill of ~480-token prompts was half the generation
time, and most of those tokens had been prefilled before. This is vLLM's automatic prefix caching
in miniature, for the transformers backend: states are kept per prompt (batch 1, every layer), found
again by the longest block-aligned prefix, and the caller prefills only the rest.

Rules that keep it correct:
- a key is the exact token ids of a prefix, at multiples of `block` tokens; each points to an entry
  whose prompt starts with it, so any hit is valid, however the index was overwritten or evicted;
- states depend only on the prefix's tokens and positions (the caller places every prompt at
  positions 0.., whatever the padding), so states from one batch are valid in any other;
- the owner clears the cache when the model's weights change (`HFGenerator` checks the parameters'
  in-place version counters before every call: a model trained in place, as DAgger does, never
  reads states of its old weights);
- entries are copies (never views of a batch's tensors), evicted least recently used beyond
  `budget_bytes`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [1, heads, tokens, dim]


@dataclass
class _Entry:
    ids: tuple[int, ...]
    layers: Layers
    nbytes: int


class PrefixCache:
    """LRU of prompt states keyed by block-aligned token prefixes. `hits`/`misses` count lookups,
    `reused` the prompt tokens whose prefill a hit saved."""

    def __init__(self, budget_bytes: int, block: int = 16) -> None:
        if block < 1:
            raise ValueError("block must be >= 1")
        self.budget_bytes = budget_bytes
        self.block = block
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[tuple[int, ...], int] = {}
        self._next = 0
        self.nbytes = 0
        self.hits = self.misses = self.reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.nbytes = 0

    def lookup(self, ids: Sequence[int]) -> tuple[int, Layers | None]:
        """(L, states of ids[:L]) for the longest indexed prefix that leaves at least one token to
        prefill (the last token's logits are needed), or (0, None)."""
        b = self.block
        hi = (len(ids) - 1) // b  # in blocks
        lo, found = 0, None
        # Binary search on the block count: indexed prefixes are (nearly always) prefix-closed;
        # where eviction broke that, a shorter hit is still a valid one.
        while lo < hi:
            mid = (lo + hi + 1) // 2
            key = self._index.get(tuple(ids[: mid * b]))
            if key is not None:
                lo, found = mid, key
            else:
                hi = mid - 1
        if found is None:
            self.misses += 1
            return 0, None
        length = lo * b
        self._entries.move_to_end(found)
        self.hits += 1
        self.reused += length
        entry = self._entries[found]
        return length, [(k[:, :, :length], v[:, :, :length]) for k, v in entry.layers]

    def store(self, ids: Sequence[int], layers: Layers) -> None:
        """Keep the states of `ids` (each [1, heads, len(ids), dim]), trimmed to whole blocks."""
        length = len(ids) // self.block * self.block
        if length == 0 or self.budget_bytes <= 0:
            return
        kept = [(k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in layers]
        nbytes = sum(k.nbytes + v.nbytes for k, v in kept)
        if nbytes > self.budget_bytes:
            return
        key = self._next
        self._next += 1
        prefix = tuple(ids[:length])
        self._entries[key] = _Entry(prefix, kept, nbytes)
        self.nbytes += nbytes
        for m in range(self.block, length + 1, self.block):
            self._index[prefix[:m]] = key
        while self.nbytes > self.budget_bytes:
            self._evict()

    def _evict(self) -> None:
        key, entry = self._entries.popitem(last=False)
        self.nbytes -= entry.nbytes
        for m in range(self.block, len(entry.ids) + 1, self.block):
            prefix = entry.ids[:m]
            if self._index.get(prefix) == key:
                del self._index[prefix]
