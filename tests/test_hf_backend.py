"""HFGenerator: batching, raw log-probs, per-request settings, seeds, stop strings.

The fixture model is a random-init Llama over a CHARACTER-level tokenizer: every token sequence
then decodes to a text that re-encodes to the same tokens, so "the sampled log-prob equals the
re-scored log-prob" can be checked exactly for every completion (with a merging BPE, a random
model often samples a non-canonical split whose re-scoring legitimately differs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_model_fixture import CHATML_TEMPLATE as CHATML

from engine.actions import CompositeAction
from engine.llm.base import (
    Completion,
    ContextOverflow,
    Generator,
    GeneratorError,
    Prompt,
    SampleRequest,
    SamplingParams,
)
from engine.llm.hf import HFGenerator
from engine.prompts import HistoryStep, actor_prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

def _build_char_model(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
    vocab = {t: i for i, t in enumerate(specials + [chr(c) for c in range(32, 127)] + ["\n"])}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    raw.decoder = decoders.Fuse()
    raw.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|pad|>", unk_token="<|unk|>"
    )
    tok.chat_template = CHATML
    tok.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # make EOS likely enough that many samples end with it
        model.lm_head.weight[tok.eos_token_id] = model.model.norm.weight * 0.3
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> HFGenerator:
    return HFGenerator(_build_char_model(tmp_path_factory.mktemp("charllama")), device="cpu", seed=0)


def _prompt(i: int) -> Prompt:
    history = [
        HistoryStep(CompositeAction(thought="I need logs.", command=f"get {j + 1} oak log"), "Got 1 oak log")
        for j in range(i % 3)
    ]
    return actor_prompt(
        "Commands: get N item; craft N X using N a, N b; inventory.",
        f"craft {i + 1} wooden pickaxe",
        "crafting commands:\ncraft 4 oak planks using 1 oak log",
        history,
        f"Inventory: [oak log] ({i})",
    )


def _teacher_forced(gen: HFGenerator, prompt: Prompt, text: str, with_eos: bool) -> float:
    """Reference: one unpadded forward, written independently of HFGenerator's batching."""
    p = gen.encode_prompt(prompt)
    c = gen.tokenizer(text, add_special_tokens=False)["input_ids"] + ([gen.eos_id] if with_eos else [])
    ids = torch.tensor([p + c])
    with torch.inference_mode():
        logp = torch.log_softmax(gen.model(input_ids=ids).logits[0].double(), -1)
    return float(sum(logp[len(p) - 1 + j, t] for j, t in enumerate(c)))


COMPLETIONS = [
    "THOUGHT: I need planks.\nACTION: craft 4 oak planks using 1 oak log\nEXPLANATION: x\nSTATUS: CONTINUE",
    "ACTION: inventory",
    "",
    "REASON: candidate 2 gets the log first.\nBEST: 2",
    "REASON: the agent crafted the wrong item.\nJudgement: Bad",
    "THOUGHT: done\nACTION: craft 1 wooden pickaxe using 3 oak planks, 2 stick\nSTATUS: SUCCESS",
]


def test_is_a_generator(gen: HFGenerator) -> None:
    assert isinstance(gen, Generator)
    assert gen.name.startswith("hf:")


def test_batched_logprobs_equal_one_at_a_time_and_reference(gen: HFGenerator) -> None:
    prompts = [_prompt(i) for i in range(len(COMPLETIONS))]
    batched = gen.logprobs(prompts, COMPLETIONS)
    single = [gen.logprobs([p], [c])[0] for p, c in zip(prompts, COMPLETIONS, strict=True)]
    small = HFGenerator.from_model(gen.model, gen.tokenizer, batch_size=2).logprobs(prompts, COMPLETIONS)
    for b, s, sm, p, c in zip(batched, single, small, prompts, COMPLETIONS, strict=True):
        assert b is not None and s is not None and sm is not None
        assert abs(b - s) < 1e-5
        assert abs(sm - s) < 1e-5
        assert abs(b - _teacher_forced(gen, p, c, with_eos=True)) < 1e-4
    with pytest.raises(ValueError):
        gen.logprobs(prompts, COMPLETIONS[:2])


def test_sample_n_per_request_with_raw_logprobs_that_rescore(gen: HFGenerator) -> None:
    prompts = [_prompt(i) for i in range(4)]
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=1)
    out = gen.sample([SampleRequest(p, n=5, params=params) for p in prompts])
    assert [len(cs) for cs in out] == [5] * 4
    flat = [(p, c) for p, cs in zip(prompts, out, strict=True) for c in cs]
    ended = [(p, c) for p, c in flat if c.finish_reason == "stop"]
    cut = [(p, c) for p, c in flat if c.finish_reason == "length"]
    assert ended and cut, "the fixture should produce both EOS-ended and length-cut samples"
    for _, c in flat:
        assert c.token_logprobs is not None and len(c.token_logprobs) == c.n_tokens
        assert c.logprob == pytest.approx(sum(c.token_logprobs), abs=1e-9)
        assert all(lp <= 0 for lp in c.token_logprobs)
    rescored = gen.logprobs([p for p, _ in ended], [c.text for _, c in ended])
    for (_, c), r in zip(ended, rescored, strict=True):
        assert r is not None and abs(c.logprob - r) < 1e-4  # EOS included on both sides
    for p, c in cut:  # no EOS was generated: the raw log-prob of the generated text alone
        assert c.n_tokens == 40
        assert abs(c.logprob - _teacher_forced(gen, p, c.text, with_eos=False)) < 1e-4


def test_raw_logprobs_ignore_temperature_and_top_p(gen: HFGenerator) -> None:
    """A temperature-0.3 / top-p 0.5 sample still reports the model's own (T=1) log-probs."""
    p = _prompt(1)
    params = SamplingParams(temperature=0.3, top_p=0.5, max_tokens=20, seed=3)
    (c,) = gen.sample([SampleRequest(p, n=1, params=params)])[0]
    expected = _teacher_forced(gen, p, c.text, with_eos=c.finish_reason == "stop")
    assert abs(c.logprob - expected) < 1e-4


def test_mixed_requests_in_one_call(gen: HFGenerator) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    reqs = [
        SampleRequest(_prompt(0), n=1, params=greedy),
        SampleRequest(_prompt(1), n=3, params=SamplingParams(temperature=1.0, max_tokens=7, seed=5)),
        SampleRequest(_prompt(2), n=2, params=SamplingParams(temperature=0.7, top_p=0.9, max_tokens=9)),
        SampleRequest(_prompt(3), n=0),
        SampleRequest(_prompt(0), n=2, params=greedy),  # same prompt as the first: shares its prefill
    ]
    out = gen.sample(reqs)
    assert [len(cs) for cs in out] == [1, 3, 2, 0, 2]
    assert all(c.n_tokens <= 7 for c in out[1]) and all(c.n_tokens <= 9 for c in out[2])
    alone = gen.sample([SampleRequest(_prompt(0), n=1, params=greedy)])[0][0]
    assert out[0][0].text == alone.text == out[4][0].text == out[4][1].text
    assert out[0][0].logprob == pytest.approx(alone.logprob, abs=1e-4)  # padding changes float noise only


def test_a_request_past_the_positions_is_named_and_the_others_answered(gen: HFGenerator) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    reqs = [SampleRequest(_prompt(0), params=greedy), SampleRequest(_prompt(1), params=SamplingParams(max_tokens=5000)),
            SampleRequest(_prompt(2), n=2, params=greedy)]
    with pytest.raises(ContextOverflow) as err:
        gen.sample(reqs)
    assert list(err.value.overflowed) == [1] and "exceeds the model's 4096 positions" in err.value.overflowed[1]
    partial = err.value.partial
    assert partial[1] is None and [len(o or []) for o in partial] == [1, 0, 2]
    assert partial[0] is not None and partial[0][0].text == gen.sample([reqs[0]])[0][0].text


def test_greedy_is_deterministic_and_seeds_reproduce(gen: HFGenerator) -> None:
    greedy = SampleRequest(_prompt(2), n=3, params=SamplingParams(temperature=0.0, max_tokens=16))
    a, b = gen.sample([greedy]), gen.sample([greedy])
    assert a == b and len({c.text for c in a[0]}) == 1

    def texts(seed: int, n: int, extra: bool = False) -> list[str]:
        req = SampleRequest(_prompt(1), n=n, params=SamplingParams(max_tokens=16, seed=seed))
        others = [SampleRequest(_prompt(3), n=3, params=SamplingParams(max_tokens=5))] if extra else []
        return [c.text for c in gen.sample(others + [req])[-1]]

    first = texts(7, 4)
    assert texts(7, 4) == first
    assert texts(7, 4, extra=True) == first  # other requests in the batch change nothing
    assert texts(7, 1) == first[:1]  # sample k depends only on (seed, k)
    assert texts(8, 4) != first
    assert len(set(first)) > 1
    g1, g2 = (HFGenerator.from_model(gen.model, gen.tokenizer, seed=11) for _ in range(2))
    unseeded = SampleRequest(_prompt(1), n=2, params=SamplingParams(max_tokens=12))
    assert g1.sample([unseeded]) == g2.sample([unseeded])  # generator-level seed


def test_stop_strings_and_max_tokens(gen: HFGenerator) -> None:
    prompt = _prompt(4)
    full = gen.sample([SampleRequest(prompt, params=SamplingParams(temperature=0.0, max_tokens=30))])[0][0]
    assert len(full.text) >= 5
    at = next(i for i in range(2, len(full.text) - 1) if full.text.find(full.text[i : i + 2]) == i)
    params = SamplingParams(temperature=0.0, max_tokens=30, stop=("never-there", full.text[at : at + 2]))
    cut = gen.sample([SampleRequest(prompt, params=params)])[0][0]
    assert (cut.text, cut.finish_reason) == (full.text[:at], "stop")
    assert cut.n_tokens == at + 2  # generation ended at the token that completed the stop string
    short = gen.sample([SampleRequest(prompt, params=SamplingParams(temperature=0.0, max_tokens=3))])[0][0]
    assert (short.text, short.n_tokens, short.finish_reason) == (full.text[:3], 3, "length")
    sampled = gen.sample([SampleRequest(prompt, n=8, params=SamplingParams(max_tokens=4, seed=0))])[0]
    assert all(c.n_tokens <= 4 for c in sampled)
    assert any(c.finish_reason == "length" for c in sampled)
    with pytest.raises(ValueError):
        gen.sample([SampleRequest(prompt, params=SamplingParams(max_tokens=0))])


def test_many_prompts_one_batched_pass(gen: HFGenerator) -> None:
    """16 trees x 4 samples: one prefill over the 16 prompts, then <= max_tokens decode forwards."""
    batches: list[int] = []
    hook = gen.model.register_forward_hook(
        lambda _m, _a, kw, _o: batches.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        params = SamplingParams(temperature=1.0, max_tokens=8, seed=0)
        out = gen.sample([SampleRequest(_prompt(i), n=4, params=params) for i in range(16)])
    finally:
        hook.remove()
    assert [len(cs) for cs in out] == [4] * 16
    assert all(isinstance(c, Completion) for cs in out for c in cs)
    assert batches[0] == 16  # distinct prompts prefilled together
    assert len(batches) <= 8  # one forward per new token for ALL 64 rows, not 64 x 8
    assert batches[1] <= 64 and batches[1:] == sorted(batches[1:], reverse=True)  # finished rows leave


def test_bad_folder_is_a_generator_error(tmp_path: Path) -> None:
    with pytest.raises(GeneratorError):
        HFGenerator(tmp_path / "missing")
    with pytest.raises(GeneratorError):
        HFGenerator(tmp_path)  # exists, but holds no model


def test_num_threads_apply_during_calls_only(gen: HFGenerator) -> None:
    one = HFGenerator.from_model(gen.model, gen.tokenizer, num_threads=1)
    seen: list[int] = []
    hook = one.model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        one.sample([SampleRequest(_prompt(0), params=SamplingParams(temperature=0.0, max_tokens=3))])
        one.logprobs([_prompt(0)], ["ACTION: inventory"])
    finally:
        hook.remove()
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before


def test_cuda_forward_context_leaves_out_cudnn_attention(gen: HFGenerator) -> None:
    """On CUDA, torch's cuDNN attention rebuilt a plan per decode length (bf16 sampling 18x slower than
    fp32 on an H200): the generator's forward context turns that backend off, and only inside it."""
    on_cuda = HFGenerator.from_model(gen.model, gen.tokenizer)
    on_cuda.device = torch.device("cuda")  # the context's choice only; nothing runs on a GPU here
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with on_cuda._forward_context():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.is_inference_mode_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with gen._forward_context():  # on the CPU the backends are left as they are
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
