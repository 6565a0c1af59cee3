"""Prompt prefix reuse: the index finds the longest cached block prefix, evicts by bytes, and the
generator's output with reuse is the output without it (same log-probs, same greedy text), and a
model changed in place never reads states of its old weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_hf_backend import _build_char_model, _prompt

from engine.actions import CompositeAction
from engine.llm.base import Prompt, SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.prefix_cache import PrefixCache
from engine.prompts import HistoryStep, actor_prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _states(n: int, fill: float = 1.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two layers of [1, heads 2, n tokens, dim 4]; token t's key holds t (to check slicing)."""
    k = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 2, n, 4).clone() * fill
    return [(k, k + 100), (k, k + 200)]


def test_lookup_finds_the_longest_block_prefix_and_leaves_a_token() -> None:
    cache = PrefixCache(budget_bytes=10**6, block=4)
    ids = list(range(10, 23))  # 13 tokens: whole blocks of 4 -> 12 kept
    cache.store(ids, _states(13))
    n, layers = cache.lookup(ids[:9] + [99, 98])  # shares 9 tokens -> 2 whole blocks
    assert n == 8 and layers is not None
    assert layers[0][0].shape == (1, 2, 8, 4) and layers[1][1][0, 0, 7, 0] == 207
    n, _ = cache.lookup(ids[:12])  # the same 12 tokens: one must be left to prefill -> 8
    assert n == 8
    assert cache.lookup([1, 2, 3, 4, 5]) == (0, None)
    assert (cache.hits, cache.misses, cache.reused) == (2, 1, 16)


def test_eviction_keeps_the_budget_and_never_points_to_a_dropped_entry() -> None:
    one = sum(k.nbytes + v.nbytes for k, v in _states(8))  # one 8-token entry
    cache = PrefixCache(budget_bytes=2 * one, block=4)
    a, b, c = [1] * 8, [2] * 8, [3] * 8
    for ids in (a, b):
        cache.store(ids, _states(8))
    cache.lookup(a + [0])  # a used last: b is the oldest
    cache.store(c, _states(8))
    assert cache.nbytes <= 2 * one and len(cache) == 2
    assert cache.lookup(b + [0]) == (0, None)
    assert cache.lookup(a + [0])[0] == 8 and cache.lookup(c + [0])[0] == 8
    big = PrefixCache(budget_bytes=one - 1, block=4)
    big.store(a, _states(8))  # larger than the whole budget: not kept
    assert len(big) == 0


def test_stored_states_are_copies() -> None:
    cache = PrefixCache(budget_bytes=10**6, block=4)
    states = _states(8)
    cache.store(list(range(8)), states)
    states[0][0].zero_()
    _, layers = cache.lookup(list(range(8)) + [9])
    assert layers is not None and layers[0][0][0, 0, 3, 0] == 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_char_model(tmp_path_factory.mktemp("charllama"))


def _related_prompts() -> list[Prompt]:
    """Prompts of one task that share their system text, task block and a growing history."""
    step = HistoryStep(CompositeAction(thought="logs first", command="get 1 oak log"), "Got 1 oak log")
    return [actor_prompt("Commands: get N item; craft N X using N a, N b.", "craft 1 stick",
                         "crafting commands:\ncraft 4 oak planks using 1 oak log", [step] * h, f"Inventory ({h})")
            for h in range(4)] + [_prompt(1), _prompt(2)]


def test_reuse_gives_the_same_log_probs_and_greedy_text(model_dir: Path) -> None:
    plain = HFGenerator(model_dir, device="cpu", seed=0, prefix_cache_mb=0)
    reuse = HFGenerator(model_dir, device="cpu", seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    prompts = _related_prompts()
    for p in prompts:  # one at a time: each later prompt finds the earlier ones' states
        (a,), (b,) = plain.sample([SampleRequest(p, 1, params)])[0], reuse.sample([SampleRequest(p, 1, params)])[0]
        assert a.text == b.text
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)
    # and batched, where rows have different cached lengths
    many = [SampleRequest(p, 2, SamplingParams(temperature=1.0, max_tokens=16, seed=3)) for p in prompts]
    for ra, rb in zip(plain.sample(many), reuse.sample(many), strict=True):
        for a, b in zip(ra, rb, strict=True):
            assert a.token_ids is not None and b.token_ids is not None
            assert a.token_logprobs is not None and b.token_logprobs is not None
            assert a.token_ids[:4] == b.token_ids[:4]
            assert a.token_logprobs[:4] == pytest.approx(b.token_logprobs[:4], abs=1e-4)
    assert reuse.prefix_cache.hits > len(prompts) and reuse.prefix_cache.reused > 0
    assert plain.prefix_cache.hits == 0 and len(plain.prefix_cache) == 0


def test_a_model_changed_in_place_does_not_read_old_states(model_dir: Path) -> None:
    gen = HFGenerator(model_dir, device="cpu", seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    prompt = _related_prompts()[3]
    gen.sample([SampleRequest(prompt, 1, params)])
    assert len(gen.prefix_cache) == 1
    with torch.no_grad():
        next(gen.model.parameters()).mul_(1.5)  # as an optimizer step does
    (changed,) = gen.sample([SampleRequest(prompt, 1, params)])[0]
    fresh = HFGenerator.from_model(gen.model, gen.tokenizer, seed=0, prefix_cache_mb=0)
    (expected,) = fresh.sample([SampleRequest(prompt, 1, params)])[0]
    assert changed.token_logprobs == pytest.approx(expected.token_logprobs, abs=1e-5)
    assert gen.prefix_cache.hits == 0  # the old entry was dropped before the lookup


def test_negative_budget_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        HFGenerator(model_dir, device="cpu", prefix_cache_mb=-1)
