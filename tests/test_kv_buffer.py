"""The in-place KV buffer: each step writes one column instead of copying the whole cache, and the
generator's samples with it equal the samples without it (texts, tokens, log-probs)."""

from __future__ import annotations

import pytest
import torch
from test_hf_backend import _build_char_model, _prompt

from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> HFGenerator:
    return HFGenerator(_build_char_model(tmp_path_factory.mktemp("charllama")), device="cpu", seed=0)


def test_a_buffered_layer_holds_what_concatenation_holds_through_growth_and_reorders() -> None:
    from transformers.cache_utils import DynamicLayer

    from engine.llm.kv_buffer import BufferedLayer

    k0, v0 = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    plain, buffered = DynamicLayer(), BufferedLayer(k0, v0, room=2)
    plain.update(k0, v0)
    for step in range(6):  # past its room of 2: it grows and keeps going
        rows = plain.keys.shape[0]
        k, v = torch.randn(rows, 2, 1, 4), torch.randn(rows, 2, 1, 4)
        for layer in (plain, buffered):
            keys, values = layer.update(k, v)
        assert torch.equal(keys, plain.keys) and torch.equal(values, plain.values)
        if step == 3:
            for layer in (plain, buffered):
                layer.reorder_cache(torch.tensor([2, 0]))
    assert buffered.get_seq_length() == plain.get_seq_length() == 11
    assert torch.equal(buffered.keys, plain.keys) and torch.equal(buffered.values, plain.values)
    buffered.crop(-3)
    assert buffered.get_seq_length() == 8 and torch.equal(buffered.keys, plain.keys[:, :, :8])


def test_samples_with_the_buffer_equal_samples_without_it(gen: HFGenerator) -> None:
    reqs = [
        SampleRequest(_prompt(0), n=3, params=SamplingParams(temperature=1.0, max_tokens=24, seed=3)),
        SampleRequest(_prompt(1), n=1, params=SamplingParams(temperature=0.0, max_tokens=9)),
        SampleRequest(_prompt(2), n=2, params=SamplingParams(temperature=0.7, max_tokens=30, seed=8, stop=("e",))),
    ]
    gen.kv_buffer = False
    gen.prefix_cache.clear()
    plain = gen.sample(reqs)
    gen.kv_buffer = True
    gen.prefix_cache.clear()
    buffered = gen.sample(reqs)
    finishes = {c.finish_reason for out in plain for c in out}
    assert len(finishes) > 1, "the requests should end rows at different steps (the buffer is reordered)"
    for a_out, b_out in zip(plain, buffered, strict=True):
        for a, b in zip(a_out, b_out, strict=True):
            assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


def test_a_cache_of_another_kind_is_left_alone() -> None:
    from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

    from engine.llm.kv_buffer import preallocate

    cache = DynamicCache()
    cache.layers = [DynamicSlidingWindowLayer(sliding_window=4)]
    cache.layers[0].update(torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2))
    assert preallocate(cache, 8) is False and type(cache.layers[0]) is DynamicSlidingWindowLayer
    assert preallocate(DynamicCache(), 8) is False  # nothing prefilled

