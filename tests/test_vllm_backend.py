"""VLLMGenerator without vLLM: request building and output mapping on objects shaped like vLLM's
(`RequestOutput.outputs[i]` with token_ids / logprobs [{token_id: Logprob}] / finish_reason), and
the whole sample/logprobs/reload plumbing against a stand-in `vllm` module. The GPU check with
the real engine is bench/gpu/vllm_check.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, ClassVar

import pytest
from tiny_model_fixture import build_tiny_model

from engine.llm.base import GeneratorError, SampleRequest, SamplingParams
from engine.llm.vllm_backend import (
    SCORING_KWARGS,
    VLLMGenerator,
    completions_from_output,
    engine_kwargs,
    prompt_logprob_sum,
    sampling_kwargs,
)

EOS = 2


def lp(x: float) -> NS:
    return NS(logprob=x, rank=1, decoded_token=None)


def seq(index: int, ids: list[int], lps: list[float] | None, finish: str) -> NS:
    steps = None if lps is None else [{t: lp(x), 999: lp(-9.0)} for t, x in zip(ids, lps, strict=True)]
    return NS(
        index=index,
        text="(ignored)",
        token_ids=ids,
        logprobs=steps,
        cumulative_logprob=None,
        finish_reason=finish,
    )


def decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


def test_importing_the_module_does_not_import_vllm() -> None:
    code = "import sys, engine.llm.vllm_backend; print(sorted({'vllm', 'transformers'} & set(sys.modules)))"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"


def test_sampling_kwargs_per_request() -> None:
    kw = sampling_kwargs(
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=32, stop=("\n", "END"), seed=5), n=4
    )
    assert kw == {
        "n": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 32,
        "stop": ["\n", "END"],
        "seed": 5,
        "logprobs": 1,
    }
    assert (
        sampling_kwargs(SamplingParams(), 1)["stop"] is None
        and sampling_kwargs(SamplingParams(), 1)["seed"] is None
    )
    for bad_params, n in [
        (SamplingParams(), 0),
        (SamplingParams(max_tokens=0), 1),
        (SamplingParams(top_p=0.0), 1),
    ]:
        with pytest.raises(ValueError):
            sampling_kwargs(bad_params, n)
    assert SCORING_KWARGS["prompt_logprobs"] == 1 and SCORING_KWARGS["max_tokens"] == 1


def test_engine_kwargs_ask_for_raw_logprobs_only_where_supported() -> None:
    new = engine_kwargs("/m", 3, {"model", "logprobs_mode"}, {"max_model_len": 2048})
    assert new == {
        "model": "/m",
        "enable_prefix_caching": True,
        "seed": 3,
        "logprobs_mode": "raw_logprobs",
        "max_model_len": 2048,
    }
    assert "logprobs_mode" not in engine_kwargs("/m", 3, {"model"}, {})
    assert (
        engine_kwargs("/m", 3, {"model"}, {"enable_prefix_caching": False})["enable_prefix_caching"] is False
    )


def test_outputs_map_to_completions() -> None:
    output = NS(
        outputs=[
            seq(1, [3, 4, 5], [-0.5, -0.25, -1.0], "length"),  # cut by max_tokens
            seq(0, [1, 3, EOS], [-1.0, -2.0, -0.5], "stop"),  # ended with EOS: not in the text
            seq(2, [3, 0, 3, 4], [-1.0] * 4, "stop"),  # a stop string ("a"): text cut before it
            seq(3, [4], None, "abort"),  # no log-probs asked / returned
        ]
    )
    a, b, c, d = completions_from_output(output, decode, eos_ids={EOS}, stop=("a",))
    assert (a.text, a.logprob, a.token_logprobs, a.n_tokens, a.finish_reason) == (
        "bd",
        -3.5,
        (-1.0, -2.0, -0.5),
        3,
        "stop",
    )
    assert (b.text, b.logprob, b.n_tokens, b.finish_reason) == ("def", -1.75, 3, "length")
    assert (c.text, c.logprob, c.n_tokens, c.finish_reason) == ("d", -4.0, 4, "stop")
    assert (d.text, d.logprob, d.token_logprobs, d.finish_reason) == ("e", None, None, "error")
    # A step that lacks the sampled token (should not happen) means "unknown", not a wrong number.
    odd = NS(
        outputs=[NS(index=0, token_ids=[3, 4], logprobs=[{3: lp(-1.0)}, {7: lp(-1.0)}], finish_reason="stop")]
    )
    assert completions_from_output(odd, decode, {EOS}, ())[0].logprob is None


def test_prompt_logprob_sum() -> None:
    out = NS(
        prompt_token_ids=[7, 8, 9, 10],
        prompt_logprobs=[None, {8: lp(-1.0)}, {9: lp(-2.0), 1: lp(-0.1)}, {10: lp(-4.0)}],
    )
    assert prompt_logprob_sum(out, start=2) == -6.0
    assert prompt_logprob_sum(out, start=4) == 0.0  # nothing to score
    assert prompt_logprob_sum(NS(prompt_token_ids=[7, 8], prompt_logprobs=None), start=1) is None


# ---------------------------------------------------------------- plumbing against a stand-in vllm


class FakeLLM:
    """Records calls; answers each prompt with `n` completions of fixed ids (+ EOS)."""

    instances: ClassVar[list[FakeLLM]] = []
    fail_rpc: ClassVar[bool] = False
    reload_params: ClassVar[set[str]] = {"weights_path"}  # current vLLM; older: set()
    eos: ClassVar[int] = -1  # the tiny tokenizer's EOS id, set by the fixture

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.calls, self.shut = kwargs, [], False
        self.llm_engine = NS(engine_core=NS(shutdown=self._shutdown))
        FakeLLM.instances.append(self)

    def _shutdown(self) -> None:
        self.shut = True

    def generate(self, prompts: list[dict], params: list[Any], use_tqdm: bool) -> list[NS]:
        self.calls.append(("generate", prompts, params))
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            ids = p["prompt_token_ids"]
            if getattr(sp, "prompt_logprobs", None):
                outs.append(
                    NS(
                        prompt_token_ids=ids,
                        prompt_logprobs=[None] + [{t: lp(-0.5)} for t in ids[1:]],
                        outputs=[],
                    )
                )
            else:
                comp = [seq(i, [5, 6, FakeLLM.eos], [-1.0, -1.0, -0.25], "stop") for i in range(sp.n)]
                outs.append(NS(prompt_token_ids=ids, prompt_logprobs=None, outputs=comp))
        return outs

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Only the worker methods vLLM has, with their real parameters: a wrong name fails here
        as it would on a GPU (`reload_weights` takes `weights_path` only in current vLLM)."""
        self.calls.append(("rpc", method, args, kwargs or {}))
        signatures = {"update_config": ({"overrides"}, 1), "reload_weights": (FakeLLM.reload_params, 0)}
        if method not in signatures:
            raise AttributeError(f"Worker has no method {method!r}")
        names, n_args = signatures[method]
        if len(args) > max(n_args, 0) or not set(kwargs or {}) <= names:
            raise TypeError(f"{method}() got unexpected arguments {args} {kwargs}")
        if FakeLLM.fail_rpc:
            raise RuntimeError(f"worker failed in {method}")
        return [None]

    def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache",))
        return True


class VLLMValidationError(Exception):
    """As in vLLM 0.33: a validation error that is NOT a ValueError."""


VLLMValidationError.__module__ = "vllm.exceptions"

# The fields of vllm.SamplingParams (0.33) that a request could set; anything else is a TypeError.
SAMPLING_FIELDS = {
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens",
    "logprobs", "prompt_logprobs", "detokenize", "skip_special_tokens", "include_stop_str_in_output",
    "logit_bias", "allowed_token_ids", "bad_words", "structured_outputs", "extra_args",
}


def fake_sampling_params(**kw: Any) -> NS:
    """A double that enforces vLLM's documented SamplingParams rules (and its field names)."""
    unknown = set(kw) - SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"SamplingParams.__init__() got an unexpected keyword argument {min(unknown)!r}")
    sp = NS(**{"n": 1, "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, **kw})
    if sp.temperature < 0 or sp.temperature > 2:
        raise VLLMValidationError(f"temperature must be in [0, 2], got {sp.temperature}.")
    if sp.temperature < 1e-5 and sp.n > 1:
        raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {sp.n}.")
    if sp.max_tokens is not None and sp.max_tokens < 1:
        raise VLLMValidationError(f"max_tokens must be at least 1, got {sp.max_tokens}.")
    return sp


@dataclasses.dataclass
class FakeEngineArgs:
    model: str = ""
    logprobs_mode: str = "raw_logprobs"


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    from transformers import AutoTokenizer

    FakeLLM.eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    FakeLLM.instances, FakeLLM.fail_rpc, FakeLLM.reload_params = [], False, {"weights_path"}
    module = types.ModuleType("vllm")
    module.LLM, module.EngineArgs = FakeLLM, FakeEngineArgs
    module.SamplingParams = fake_sampling_params
    monkeypatch.setitem(sys.modules, "vllm", module)
    return model_dir


PROMPT = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "TASK: craft a stick"},
]


def test_sample_and_logprobs_through_one_generate_call(fake_vllm: Path) -> None:
    gen = VLLMGenerator(fake_vllm, seed=1, max_model_len=512)
    llm = FakeLLM.instances[0]
    assert gen.name == f"vllm:{fake_vllm}"
    assert llm.kwargs["enable_prefix_caching"] is True and llm.kwargs["logprobs_mode"] == "raw_logprobs"
    assert llm.kwargs["max_model_len"] == 512 and llm.kwargs["gpu_memory_utilization"] == 0.85
    reqs = [
        SampleRequest(PROMPT, n=2, params=SamplingParams(seed=3)),
        SampleRequest(PROMPT, n=0),
        SampleRequest(PROMPT[1:], n=1),
    ]
    out = gen.sample(reqs)
    assert [len(c) for c in out] == [2, 0, 1]
    (kind, prompts, params) = llm.calls[-1]
    assert (
        kind == "generate" and len(prompts) == 2 and [p.n for p in params] == [2, 1] and params[0].seed == 3
    )
    # Prompt ids are the chat template rendered as text, then encoded without added specials.
    text = gen.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert prompts[0]["prompt_token_ids"] == gen.tokenizer(text, add_special_tokens=False)["input_ids"]
    c = out[0][0]
    assert (
        c.text == gen.tokenizer.decode([5, 6])
        and c.logprob == -2.25
        and c.n_tokens == 3
        and c.finish_reason == "stop"
    )

    scores = gen.logprobs([PROMPT, PROMPT[1:]], ["get 1 stick", ""])
    (_, scored, params) = llm.calls[-1]
    n_completion = len(gen.tokenizer("get 1 stick", add_special_tokens=False)["input_ids"]) + 1  # + EOS
    assert scored[0]["prompt_token_ids"][-1] == gen.eos_id and params[0].prompt_logprobs == 1
    assert scores == [-0.5 * n_completion, -0.5]
    assert gen.sample([]) == [] and gen.logprobs([], []) == []


def test_reload_in_place_resets_prefix_cache(fake_vllm: Path, tmp_path: Path) -> None:
    gen = VLLMGenerator(fake_vllm)
    new_dir = build_tiny_model(tmp_path / "trained", seed=1)
    assert gen.reload(new_dir) == "in-place"
    llm = FakeLLM.instances[0]
    assert len(FakeLLM.instances) == 1 and gen.name == f"vllm:{new_dir}"
    assert llm.calls == [("rpc", "reload_weights", (), {"weights_path": str(new_dir)}), ("reset_prefix_cache",)]


def test_reload_on_an_older_vllm_uses_update_config(fake_vllm: Path, tmp_path: Path) -> None:
    FakeLLM.reload_params = set()  # reload_weights() takes no weights_path there
    gen = VLLMGenerator(fake_vllm)
    new_dir = build_tiny_model(tmp_path / "trained", seed=1)
    assert gen.reload(new_dir) == "in-place"
    assert FakeLLM.instances[0].calls[1:] == [
        ("rpc", "update_config", ({"model_config": {"model": str(new_dir)}},), {}),
        ("rpc", "reload_weights", (), {}),
        ("reset_prefix_cache",),
    ]


def test_reload_rebuilds_the_engine_when_in_place_fails_and_says_so(
    fake_vllm: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gen = VLLMGenerator(fake_vllm, max_model_len=256)
    FakeLLM.fail_rpc = True
    new_dir = build_tiny_model(tmp_path / "trained", seed=1)
    with caplog.at_level("WARNING", logger="engine.llm.vllm_backend"):
        assert gen.reload(new_dir) == "rebuilt"
    assert "REBUILDING" in caplog.text
    old, new = FakeLLM.instances
    assert old.shut and new.kwargs["model"] == str(new_dir) and new.kwargs["max_model_len"] == 256
    assert gen.sample([SampleRequest(PROMPT)])[0][0].n_tokens == 3 and new.calls[-1][0] == "generate"


def test_greedy_with_several_samples_sends_one_and_repeats_it(fake_vllm: Path) -> None:
    gen = VLLMGenerator(fake_vllm)
    out = gen.sample([SampleRequest(PROMPT, n=4, params=SamplingParams(temperature=0.0))])
    (_, _, params) = FakeLLM.instances[0].calls[-1]
    assert params[0].n == 1 and len(out[0]) == 4 and len({c.text for c in out[0]}) == 1


def test_settings_vllm_refuses_are_one_line_generator_errors(fake_vllm: Path) -> None:
    gen = VLLMGenerator(fake_vllm)
    with pytest.raises(GeneratorError, match=r"request 0: temperature must be in \[0, 2.0\].*got 2.5"):
        gen.sample([SampleRequest(PROMPT, params=SamplingParams(temperature=2.5))])
    with pytest.raises(GeneratorError, match="request 1: top_p"):
        gen.sample([SampleRequest(PROMPT), SampleRequest(PROMPT, params=SamplingParams(top_p=0))])


def test_validation_errors_from_the_engine_are_generator_errors(fake_vllm: Path) -> None:
    gen = VLLMGenerator(fake_vllm)

    def too_long(*_a: Any, **_k: Any) -> None:
        raise VLLMValidationError("The decoder prompt (length 9000) is longer than the maximum model length")

    FakeLLM.instances[0].generate = too_long  # type: ignore[method-assign]
    with pytest.raises(GeneratorError, match="vLLM refused the request: The decoder prompt") as info:
        gen.sample([SampleRequest(PROMPT)])
    assert "\n" not in str(info.value)

    def crash(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    FakeLLM.instances[0].generate = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="CUDA error"):  # a crash stays a crash, not a "bad request"
        gen.sample([SampleRequest(PROMPT)])


def test_every_finish_reason_is_mapped() -> None:
    reasons = {"stop": "stop", "length": "length", "repetition": "length", "abort": "error", "error": "error"}
    for vllm_reason, ours in reasons.items():
        out = NS(outputs=[seq(0, [3, 4], [-1.0, -1.0], vllm_reason)])
        assert completions_from_output(out, decode, {EOS}, ())[0].finish_reason == ours, vllm_reason
    for odd in ("something-new", None):
        out = NS(outputs=[seq(0, [3], [-1.0], odd)])  # type: ignore[arg-type]
        assert completions_from_output(out, decode, {EOS}, ())[0].finish_reason == "error"


def test_the_double_enforces_vllms_rules() -> None:
    """The double must fail where vLLM fails, or the tests above could not catch a regression."""
    with pytest.raises(VLLMValidationError, match="greedy"):
        fake_sampling_params(n=2, temperature=0.0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        fake_sampling_params(banana=1)
    assert not isinstance(VLLMValidationError("x"), ValueError)


def test_constructor_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GeneratorError, match="does not exist"):
        VLLMGenerator(tmp_path / "missing")
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    with pytest.raises(GeneratorError, match=r"vLLM is not installed.*\[vllm\]"):
        VLLMGenerator(tmp_path)


def test_a_grammar_goes_to_vllm_as_structured_outputs(fake_vllm: Path) -> None:
    from engine.grammar import ActionGrammar

    sys.modules["vllm"].sampling_params = NS(StructuredOutputsParams=lambda regex: NS(regex=regex))
    gen = VLLMGenerator(fake_vllm)
    grammar = ActionGrammar("inventory|get [1-9] stick")
    gen.sample([SampleRequest(PROMPT, n=2, params=SamplingParams(grammar=grammar)), SampleRequest(PROMPT, n=1)])
    constrained, free = FakeLLM.instances[0].calls[-1][2]
    assert constrained.structured_outputs.regex == grammar.regex
    assert not hasattr(free, "structured_outputs")
    del sys.modules["vllm"].sampling_params  # an old vLLM without structured outputs: refused, not ignored
    with pytest.raises(GeneratorError, match="no structured outputs"):
        gen.sample([SampleRequest(PROMPT, n=1, params=SamplingParams(grammar=grammar))])
