"""Step-level DPO: the replay buffer's log-probs as the reference, checked against TRL's own passes.

The fixture is a random Llama over a CHARACTER tokenizer with a likely EOS: every sampled token
sequence is the canonical encoding of its text and many samples end at EOS, so a sampled
completion's stored log-prob is exactly the reference value of the tokens TRL scores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from tiny_model_fixture import CHATML_TEMPLATE as CHATML

from engine.datasets.pairs import Pair
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.prompts import actor_prompt
from engine.train.common import TRAIN_META, TrainError
from engine.train.dpo import DPOTrainConfig, build_trainer, pair_rows, stored_reference, train_dpo


def build_char_model(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
    vocab = {t: i for i, t in enumerate(specials + [chr(c) for c in range(32, 127)] + ["\n"])}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    raw.decoder = decoders.Fuse()
    raw.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|pad|>",
                                  unk_token="<|unk|>", padding_side="left")
    tok.chat_template = CHATML
    tok.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=96, max_position_embeddings=2048,
                         tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a likely EOS: many samples end with it
        model.lm_head.weight[tok.eos_token_id] = model.model.norm.weight * 0.4
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_model(tmp_path_factory.mktemp("char-dpo"))


def _prompt(i: int) -> list[dict[str, str]]:
    return actor_prompt("Commands: get N item; craft N X using N a.", f"craft {i + 1} stick", "", [],
                        f"You hold {i} planks.")


@pytest.fixture(scope="module")
def replay(model_dir: Path) -> tuple[list[Pair], dict[tuple[int | None, int], int]]:
    """Step pairs from real samples that ended at EOS, with their generation log-probs and
    generated token counts, as search stores them."""
    torch.set_num_threads(1)
    gen = HFGenerator(model_dir, device="cpu", seed=0)
    prompts = [_prompt(i) for i in range(8)]
    out = gen.sample([SampleRequest(p, 6, SamplingParams(temperature=1.0, max_tokens=24, seed=i))
                      for i, p in enumerate(prompts)])
    pairs, tokens = [], {}
    for i, (prompt, cs) in enumerate(zip(prompts, out, strict=True)):
        ended = [c for c in cs if c.finish_reason == "stop" and c.text]
        distinct = list({c.text: c for c in ended}.values())
        if len(distinct) < 2:
            continue
        a, b = distinct[:2]
        tokens[(i, 1)], tokens[(i, 2)] = a.n_tokens, b.n_tokens
        pairs.append(Pair(id=f"p{i}", kind="step", run_id="run-a" if i % 2 else "run-b", tree_id=i, task_id=f"t{i}",
                          node_id=0, chosen_node=1, rejected_node=2, prompt=prompt, chosen=a.text, rejected=b.text,
                          q_chosen=1.0, q_rejected=0.0, logprob_chosen=a.logprob, logprob_rejected=b.logprob,
                          depth=0, status="approved"))
    assert len(pairs) >= 4, "the fixture should give several EOS-ended pairs"
    return pairs, tokens


def _cfg(**kw) -> DPOTrainConfig:
    return DPOTrainConfig.for_cpu(**{"max_steps": 3, "batch_size": 4, "learning_rate": 5e-3, "seed": 0, **kw})


def _losses(result) -> list[float]:
    return [h["loss"] for h in result.history if "loss" in h]


def test_rows_are_what_the_generator_scored(model_dir: Path, replay) -> None:
    pairs, tokens = replay
    gen = HFGenerator(model_dir, device="cpu")
    rows = pair_rows(pairs, gen.tokenizer)
    for p, row in zip(pairs, rows, strict=True):
        assert row["prompt_ids"] == gen.encode_prompt(p.prompt)
        assert row["chosen_ids"][-1] == gen.eos_id and row["chosen_ids"].count(gen.eos_id) == 1
        assert len(row["chosen_ids"]) == tokens[(p.tree_id, 1)]  # generated tokens = text + EOS
    # TRL's own reference pass over these rows reproduces the stored generation log-probs.
    trainer, _, _ = build_trainer(model_dir, pairs, _cfg(ref_source="precompute"))
    ds = trainer.train_dataset
    for p, c, r in zip(pairs, ds["ref_chosen_logps"], ds["ref_rejected_logps"], strict=True):
        assert c == pytest.approx(p.logprob_chosen, abs=2e-4)
        assert r == pytest.approx(p.logprob_rejected, abs=2e-4)


@pytest.mark.slow
def test_stored_reference_gives_the_same_training_as_an_explicit_reference_pass(model_dir: Path, replay) -> None:
    pairs, tokens = replay
    live = train_dpo(model_dir, pairs, _cfg(ref_source="live"), None)
    stored = train_dpo(model_dir, pairs, _cfg(ref_source="stored"), None, node_tokens=tokens)
    auto = train_dpo(model_dir, pairs, _cfg(ref_source="auto", verify_per_run=1), None, node_tokens=tokens)
    assert stored.metrics["ref_stored"] == len(pairs) and stored.metrics["ref_groups_rejected"] == []
    assert auto.metrics["ref_stored"] == len(pairs) and auto.metrics["ref_verified"] == 2  # one per run
    assert live.metrics.get("ref_live")
    ref = _losses(live)
    assert len(ref) == 3 and ref[0] == pytest.approx(math.log(2), abs=1e-5)
    assert ref[-1] < ref[0] - 1e-3  # it learns, so later steps compare more than the trivial log 2
    for other in (_losses(stored), _losses(auto)):
        assert other == pytest.approx(ref, abs=1e-4)
    margins = [h["rewards/margins"] for h in stored.history if "loss" in h]
    assert margins == pytest.approx([h["rewards/margins"] for h in live.history if "loss" in h], abs=1e-4)


def test_stored_values_from_another_model_fail_the_spot_check(model_dir: Path, replay) -> None:
    pairs, tokens = replay
    from dataclasses import replace

    from engine.progress import MemoryReporter

    other = [replace(p, logprob_chosen=p.logprob_chosen - 3.0) if p.run_id == "run-a" else p for p in pairs]
    reporter = MemoryReporter()
    auto = train_dpo(model_dir, other, _cfg(ref_source="auto", max_steps=1), None, reporter, node_tokens=tokens)
    assert auto.metrics["ref_groups_rejected"] == ["run-a"]
    assert auto.metrics["ref_stored"] == sum(p.run_id == "run-b" for p in pairs)
    n_a, n_b = sum(p.run_id == "run-a" for p in pairs), sum(p.run_id == "run-b" for p in pairs)
    # The log counts stored vs re-scored references per search run.
    assert f"run run-a: 0 stored, {n_a} re-scored" in "\n".join(reporter.lines)
    assert f"run run-b: {n_b} stored, 0 re-scored" in "\n".join(reporter.lines)
    assert _losses(auto)[0] == pytest.approx(math.log(2), abs=1e-5)  # a wrong reference would move step 1
    with pytest.raises(TrainError, match="stored"):
        train_dpo(model_dir, other, _cfg(ref_source="stored", max_steps=1), None, node_tokens=tokens)


def test_unusable_stored_values_are_recognised(model_dir: Path, replay) -> None:
    from dataclasses import replace

    pairs, tokens = replay
    gen = HFGenerator(model_dir, device="cpu")
    rows = pair_rows(pairs, gen.tokenizer)
    edited = replace(pairs[0], status="edited")
    missing = replace(pairs[1], logprob_rejected=None)
    cut = {**tokens, (pairs[2].tree_id, 1): tokens[(pairs[2].tree_id, 1)] + 3}  # e.g. cut by max_tokens
    got = stored_reference([edited, missing, pairs[2], pairs[3]], rows[:4], cut)
    assert got[0] is None and got[1] is None and got[2] is None and got[3] is not None
    room = len(rows[3]["prompt_ids"]) + 2  # the collator would cut both completions to 2 tokens
    assert stored_reference([pairs[3]], rows[3:4], tokens, max_length=room) == [None]
    with pytest.raises(TrainError, match="no usable stored"):
        build_trainer(model_dir, [edited, *pairs[1:]], _cfg(ref_source="stored"), node_tokens=tokens)
    with pytest.raises(TrainError, match="no preference pairs"):
        build_trainer(model_dir, [], _cfg())


def test_trajectory_pairs_score_assistant_tokens_only(model_dir: Path) -> None:
    system = [{"role": "system", "content": "Act."}, {"role": "user", "content": "TASK: go"}]
    chosen = [{"role": "assistant", "content": "ACTION: a"}, {"role": "user", "content": "obs one"},
              {"role": "assistant", "content": "ACTION: b"}]
    rejected = [{"role": "assistant", "content": "ACTION: c"}, {"role": "user", "content": "obs two is long"},
                {"role": "assistant", "content": "ACTION: d"}]
    pair = Pair(id="tp", kind="trajectory", run_id="r", tree_id=None, task_id="t", node_id=0, chosen_node=1,
                rejected_node=2, prompt=system, chosen=json.dumps(chosen), rejected=json.dumps(rejected),
                q_chosen=1.0, q_rejected=0.0, logprob_chosen=-3.0, logprob_rejected=-4.0, depth=0, status="approved")
    trainer, tok, _ = build_trainer(model_dir, [pair], _cfg(kinds=("trajectory",)))
    assert trainer.ref_stats["ref_stored"] == 0  # a chat's reference is never the per-step buffer's
    batch = trainer.data_collator([dict(trainer.train_dataset[0])])
    ids, mask = batch["input_ids"][0], batch["completion_mask"][0]
    scored = tok.decode([int(t) for t, m in zip(ids, mask, strict=True) if m])
    assert scored == "ACTION: a<|im_end|>ACTION: b<|im_end|>"
    scored_rej = tok.decode([int(t) for t, m in zip(batch["input_ids"][1], batch["completion_mask"][1],
                                                    strict=True) if m])
    assert scored_rej == "ACTION: c<|im_end|>ACTION: d<|im_end|>"


def test_lora_dpo_saves_a_merged_model_that_loads_as_a_generator(model_dir: Path, replay, tmp_path: Path) -> None:
    from engine.llm.registry import load_generator

    pairs, tokens = replay
    out = tmp_path / "dpo-lora"
    result = train_dpo(model_dir, pairs, _cfg(lora=True, lora_r=4, max_steps=2, learning_rate=5e-2), out,
                       node_tokens=tokens)
    assert result.output == out.resolve() and (out / "model.safetensors").exists()
    meta = json.loads((out / TRAIN_META).read_text())
    assert meta["kind"] == "dpo" and meta["data_ids"] == [p.id for p in pairs] and meta["config"]["lora"]
    assert not (out / "adapter_config.json").exists()  # merged into a plain transformers folder
    gen = load_generator(str(out))
    before = HFGenerator(model_dir, device="cpu").logprobs([pairs[0].prompt], [pairs[0].chosen])[0]
    after = gen.logprobs([pairs[0].prompt], [pairs[0].chosen])[0]
    assert after is not None and before is not None and after != pytest.approx(before, abs=1e-6)
    assert gen.sample([SampleRequest(pairs[0].prompt, 1, SamplingParams(max_tokens=4, seed=0))])[0][0].n_tokens >= 1


def test_sft_weight_adds_the_chosen_completions_nll_to_the_dpo_loss(model_dir: Path, replay) -> None:
    """RPO's extra term: at step 1 (policy = reference, so DPO reads log 2) the logged loss is
    log 2 + w x the mean per-token NLL of the chosen completions, their stored log-probs' mean."""
    pairs, tokens = replay
    w = 0.5
    cfg = _cfg(ref_source="stored", max_steps=1, batch_size=len(pairs), sft_weight=w)
    result = train_dpo(model_dir, pairs, cfg, None, node_tokens=tokens)
    nll = -sum(p.logprob_chosen for p in pairs) / sum(tokens[(p.tree_id, 1)] for p in pairs)
    assert _losses(result)[0] == pytest.approx(math.log(2) + w * nll, abs=1e-3)
    plain = train_dpo(model_dir, pairs, _cfg(ref_source="stored", max_steps=1, batch_size=len(pairs)), None,
                      node_tokens=tokens)
    assert _losses(plain)[0] == pytest.approx(math.log(2), abs=1e-5)
    with pytest.raises(ValueError, match="sft_weight"):
        DPOTrainConfig(sft_weight=-1.0)
