"""A KV cache layer written in place into a buffer sized for the whole generation.

transformers' DynamicLayer appends each decoded token with `torch.cat`, copying every row's whole
cache at every step: on CPU, with many rows of long prompts, that copy costs as much as the
attention that reads the cache (bench/kv_buffer.py). HFGenerator knows, after the prefill, how many
tokens a chunk can still generate, so it moves the prefilled states once into a buffer with that
room (`preallocate`) and each step writes one column. Imported lazily: it needs transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class BufferedLayer(DynamicLayer):
    """A DynamicLayer whose `keys` / `values` are views of the first `length` columns of a buffer
    with `room` more; past the room it falls back to growing by copy, so it never fails."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        batch, heads, length, dim = keys.shape
        self._k = keys.new_empty((batch, heads, length + room, dim))
        self._v = values.new_empty((batch, values.shape[1], length + room, values.shape[3]))
        self._k[:, :, :length] = keys
        self._v[:, :, :length] = values
        self._length = length
        self.device, self.is_initialized = keys.device, True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self._length], self._v[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        end = self._length + n
        if end > self._k.shape[-2]:  # out of room: grow (doubling), as a vector does
            grow = max(end, 2 * self._k.shape[-2]) - self._k.shape[-2]
            self._k = torch.cat([self._k, self._k.new_empty((*self._k.shape[:2], grow, self._k.shape[3]))], dim=-2)
            self._v = torch.cat([self._v, self._v.new_empty((*self._v.shape[:2], grow, self._v.shape[3]))], dim=-2)
        self._k[:, :, self._length : end] = key_states
        self._v[:, :, self._length : end] = value_states
        self._length = end
        self._views()
        return self._k[:, :, :end], self._v[:, :, :end]

    def get_seq_length(self) -> int:
        return self._length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        idx = beam_idx.to(self._k.device)
        self._k, self._v = self._k.index_select(0, idx), self._v.index_select(0, idx)
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices, ...], self._v[indices, ...]
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self._length = max(self._length + tokens_to_remove, 0)
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self._views()

    def reset(self) -> None:
        self._length = 0
        self._views()


def preallocate(cache: Any, room: int) -> bool:
    """Swap every plain DynamicLayer of `cache` for a BufferedLayer with `room` more columns. Returns
    False (cache untouched) when any layer is of another kind (sliding window, quantized...)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return False
    cache.layers = [BufferedLayer(layer.keys, layer.values, room) for layer in layers]
    return True
