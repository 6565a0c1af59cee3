"""Reference log-probs that survive bf16: the tolerance by backend and precision, the token-id
check behind `Completion.canonical`, and search storing no log-prob for a non-canonical sample."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from doubles import ScriptedGenerator, SnapshotLineEnv
from tiny_model_fixture import build_tiny_model

from engine.config import SearchConfig
from engine.llm.base import SampleRequest, SamplingParams, is_canonical
from engine.llm.hf import HFGenerator
from engine.search.mcts import MCTS, start_tree
from engine.train.dpo import REF_TOLERANCE, DPOTrainConfig, reference_lines, reference_tolerance, spec_backend


def test_the_tolerance_follows_the_backend_and_the_training_precision() -> None:
    cfg = DPOTrainConfig()
    assert [spec_backend(s) for s in ("tiny", "/m", "hf:/m", "vllm:/m", "openai:http://h/v1#m")] == [
        "hf", "hf", "hf", "vllm", "openai"]
    assert reference_tolerance(cfg, "hf", "fp32") == 1e-3  # fp32 on both sides agrees to ~1e-6
    assert reference_tolerance(cfg, "hf", "bf16") == REF_TOLERANCE[("hf", "bf16")] > 2.0e-2  # measured worst gap
    assert reference_tolerance(cfg, "vllm", "bf16") >= reference_tolerance(cfg, "hf", "bf16")  # unmeasured: wider
    assert reference_tolerance(replace(cfg, ref_tolerance=0.3), "vllm", "bf16") == 0.3  # an explicit one wins


def test_the_token_id_check(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m")
    gen = HFGenerator(model, device="cpu", seed=0)
    tok, eos = gen.tokenizer, gen.eos_id

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    text = "craft 4 oak planks"
    canonical = encode(text)
    assert len(canonical) < len(text)  # merges: the characters one by one are another segmentation
    by_char = [i for ch in text for i in encode(ch)]
    assert tok.decode(by_char) == text
    assert is_canonical([*canonical, eos], text, encode, eos, {eos}) is True
    assert is_canonical([*by_char, eos], text, encode, eos, {eos}) is False  # same text, other ids
    assert is_canonical(canonical, text, encode, eos, {eos}) is None  # no EOS: cut, the count check's case
    # The HF backend marks its samples; a True is an independent re-encoding match.
    torch.manual_seed(0)
    comps = gen.sample([SampleRequest([{"role": "user", "content": "go"}], 8,
                                      SamplingParams(temperature=1.0, max_tokens=12, seed=1))])[0]
    for c in comps:
        ended = c.token_ids[-1] == eos
        assert c.canonical is (None if not ended else list(c.token_ids) == [*encode(c.text), eos])


class NonCanonical(ScriptedGenerator):
    """Every other actor completion comes back with ids that are not its text's canonical encoding."""

    def sample(self, requests):
        out = super().sample(requests)
        return [[replace(c, canonical=False) if i % 2 else replace(c, canonical=True) for i, c in enumerate(cs)]
                for cs in out]


def test_search_keeps_no_logprob_for_a_non_canonical_sample() -> None:
    cfg = SearchConfig(simulations=6, k=3, depth_limit=4)
    env = SnapshotLineEnv()
    jobs = [start_tree(t, SnapshotLineEnv, cfg.simulations) for t in env.tasks()[:2]]
    MCTS(NonCanonical(), cfg).run(jobs)
    nodes = [n for j in jobs for n in j.tree.nodes if n.parent is not None]
    assert nodes and any(n.logprob is None for n in nodes) and any(n.logprob is not None for n in nodes)


def test_the_log_counts_stored_and_rescored_references_per_run() -> None:
    stats = {"ref_stored": 3, "ref_computed": 4, "ref_per_run": {
        "run-a": {"stored": 0, "rescored": 2, "verified": 1, "max_diff_per_token": 0.2, "tolerance": 1e-3},
        "run-b": {"stored": 3, "rescored": 0, "verified": 1, "max_diff_per_token": 2e-7, "tolerance": 1e-3},
        "run-c": {"stored": 0, "rescored": 1, "verified": 0, "max_diff_per_token": None, "tolerance": 1e-3}}}
    lines = reference_lines(stats, 6)
    assert lines[0].startswith("DPO reference: 6 pairs, 3 stored, 3 re-scored")
    assert "run run-a: 0 stored, 2 re-scored" in lines[1] and "REJECTED" in lines[1]
    assert "run run-b: 3 stored, 0 re-scored" in lines[2] and "REJECTED" not in lines[2]
    assert "run run-c: 0 stored, 1 re-scored; not spot-checked" in lines[3]
    assert reference_lines({"ref_stored": 0, "ref_computed": 5}, 5) == [
        "DPO reference: 5 pairs, 0 stored, 5 re-scored by a reference pass"]
