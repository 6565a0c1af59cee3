"""VLLMGenerator without vLLM: request building and output mapping on objects shaped like vLLM's
(`RequestOutput.outputs[i]` with token_ids / logprobs [{token_id: Logprob}] / finish_reason), and
the whole sample/logprobs/reload plumbing against the strict stand-in `vllm` (tests/vllm_double.py:
vLLM 0.33.0's names, validation, error classes and grammar mask). The GPU check with
the real engine is bench/gpu/vllm_check.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, ClassVar

import pytest
import vllm_double
from tiny_model_fixture import build_tiny_model

from engine.llm.base import ContextOverflow, GeneratorError, SampleRequest, SamplingParams
from engine.llm.vllm_backend import (
    SCORING_KWARGS,
    VLLMGenerator,
    completions_from_output,
    engine_kwargs,
    prompt_logprob_sum,
    request_error,
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


# ---------------------------------------------------------------- plumbing against the strict stand-in vllm

REPLY = "THOUGHT: I need it.\nACTION: get 1 stick\nEXPLANATION: fetch it\nSTATUS: CONTINUE"


class FakeLLM(vllm_double.LLM):
    """The strict double (tests/vllm_double.py) scripting one reply; worker RPCs with their real
    parameters: a wrong name fails here as it would on a GPU (`reload_weights` takes
    `weights_path` only in current vLLM)."""

    instances: ClassVar[list[vllm_double.LLM]] = []
    fail_rpc: ClassVar[bool] = False
    reload_params: ClassVar[set[str]] = {"weights_path"}  # current vLLM; older: set()
    script: ClassVar[str] = REPLY

    def reply(self, prompt_text: str, params: Any, index: int) -> str:
        return FakeLLM.script

    def rpc(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        signatures = {"update_config": ({"overrides"}, 1), "reload_weights": (FakeLLM.reload_params, 0)}
        if method not in signatures:
            raise AttributeError(f"Worker has no method {method!r}")
        names, n_args = signatures[method]
        if len(args) > n_args or not set(kwargs) <= names:
            raise TypeError(f"{method}() got unexpected arguments {args} {kwargs}")
        if FakeLLM.fail_rpc:
            raise RuntimeError(f"worker failed in {method}")
        return None


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    FakeLLM.fail_rpc, FakeLLM.reload_params, FakeLLM.script = False, {"weights_path"}, REPLY
    vllm_double.install(monkeypatch, FakeLLM)
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
    assert kind == "generate" and len(prompts) == 2 and [p.n for p in params] == [2, 1]
    assert params[0].seed is None  # no per-request seed: it turns off vLLM's batched sampling path
    # Prompt ids are the chat template rendered as text, then encoded without added specials.
    text = gen.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert prompts[0]["prompt_token_ids"] == gen.tokenizer(text, add_special_tokens=False)["input_ids"]
    c = out[0][0]
    n_reply = len(gen.tokenizer(REPLY, add_special_tokens=False)["input_ids"]) + 1  # + EOS
    assert (c.text, c.n_tokens, c.finish_reason) == (REPLY, n_reply, "stop")
    assert c.logprob == pytest.approx(sum(c.token_logprobs)) and c.logprob < 0

    # Teacher-forced scoring is the same raw distribution: an unconstrained EOS-ended sample agrees.
    scores = gen.logprobs([PROMPT, PROMPT[1:]], [REPLY, ""])
    (_, scored, params) = llm.calls[-1]
    assert scored[0]["prompt_token_ids"][-1] == gen.eos_id and params[0].prompt_logprobs == 1
    assert scores[0] == pytest.approx(c.logprob) and scores[1] is not None and scores[1] < scores[0]
    assert gen.sample([]) == [] and gen.logprobs([], []) == []


def test_request_seeds_are_sent_only_when_asked_for(fake_vllm: Path) -> None:
    gen = VLLMGenerator(fake_vllm, request_seeds=True)
    gen.sample([SampleRequest(PROMPT, params=SamplingParams(seed=3))])
    assert FakeLLM.instances[0].calls[-1][2][0].seed == 3
    assert "request_seeds" not in FakeLLM.instances[0].kwargs  # ours, not an engine argument
    assert sampling_kwargs(SamplingParams(seed=3), 1, seeded=False)["seed"] is None


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
    assert gen.sample([SampleRequest(PROMPT)])[0][0].text == REPLY and new.calls[-1][0] == "generate"


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
    """vLLM's client errors (the prompt-length check raises VLLMValidationError, not a ValueError)
    are one-line GeneratorErrors; its server errors (a dead engine) and crashes are not."""
    gen = VLLMGenerator(fake_vllm, max_model_len=8)
    FakeLLM.instances[-1].llm_engine.model_config = None  # an engine that does not say its limit: vLLM refuses
    with pytest.raises(GeneratorError, match=r"vLLM refused the request: The decoder prompt \(length \d+\) is longer"
                       ) as info:
        gen.sample([SampleRequest(PROMPT)])
    assert "\n" not in str(info.value)

    gen = VLLMGenerator(fake_vllm)
    FakeLLM.instances[-1].kill()
    with pytest.raises(vllm_double.EngineDeadError) as dead:  # not "a refused request"
        gen.sample([SampleRequest(PROMPT)])
    assert not isinstance(dead.value, GeneratorError)

    def crash(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    FakeLLM.instances[-1].generate = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="CUDA error"):  # a crash stays a crash, not a "bad request"
        gen.sample([SampleRequest(PROMPT)])


def test_request_error_follows_vllms_client_server_split() -> None:
    """As vLLM's own error responses (entrypoints/serve/exception_handling): client errors and the
    raw ValueError / OverflowError it has not migrated are the request's fault; server errors
    (EngineDeadError, GenerationError) and TypeErrors (an argument this code got wrong) are not."""
    assert request_error(vllm_double.VLLMValidationError("bad")) and request_error(ValueError("bad"))
    assert request_error(OverflowError("too big"))
    assert not request_error(vllm_double.EngineDeadError())
    assert not request_error(vllm_double.EngineGenerateError("x"))
    assert not request_error(TypeError("unexpected keyword argument 'seeds'"))
    assert not request_error(RuntimeError("CUDA error"))


def test_every_finish_reason_is_mapped() -> None:
    reasons = {"stop": "stop", "length": "length", "repetition": "length", "abort": "error", "error": "error"}
    for vllm_reason, ours in reasons.items():
        out = NS(outputs=[seq(0, [3, 4], [-1.0, -1.0], vllm_reason)])
        assert completions_from_output(out, decode, {EOS}, ())[0].finish_reason == ours, vllm_reason
    for odd in ("something-new", None):
        out = NS(outputs=[seq(0, [3], [-1.0], odd)])  # type: ignore[arg-type]
        assert completions_from_output(out, decode, {EOS}, ())[0].finish_reason == "error"


def test_the_double_refuses_what_vllm_033_refuses(fake_vllm: Path) -> None:
    """The double must fail where vLLM fails, or the tests above could not catch a regression."""
    sp, so = vllm_double.SamplingParams, vllm_double.StructuredOutputsParams
    with pytest.raises(vllm_double.VLLMValidationError, match="greedy"):
        sp(n=2, temperature=0.0)
    with pytest.raises(TypeError, match="Unexpected keyword argument 'logprob'"):
        sp(logprob=1)
    with pytest.raises(vllm_double.VLLMValidationError, match="exactly one"):
        so(regex="a", choice=["a"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'pattern'"):
        so(pattern="a")
    assert not isinstance(vllm_double.VLLMValidationError("x"), ValueError)
    with pytest.raises(TypeError, match="EngineArgs.*'gpu_memory_fraction'"):
        FakeLLM(str(fake_vllm), gpu_memory_fraction=0.5)
    llm = FakeLLM(str(fake_vllm), enable_sleep_mode=True, max_model_len=64)
    with pytest.raises(TypeError, match="use_progress"):
        llm.generate([{"prompt_token_ids": [1]}], sp(), use_progress=False)
    with pytest.raises(ValueError, match="NUL"):
        llm.generate([{"prompt_token_ids": [1]}], sp(structured_outputs=so(regex="a\x00")))
    with pytest.raises(TypeError, match="'level_'"):
        llm.sleep(level_=1)
    # Every name the backend sends exists in the pinned version.
    assert set(sampling_kwargs(SamplingParams(seed=1, stop=("x",)), 2)) <= set(vllm_double.NAMES["SamplingParams"])
    assert set(SCORING_KWARGS) <= set(vllm_double.NAMES["SamplingParams"])
    assert set(engine_kwargs("/m", 0, {"logprobs_mode"}, {})) <= set(vllm_double.NAMES["EngineArgs"])


def test_constructor_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GeneratorError, match="does not exist"):
        VLLMGenerator(tmp_path / "missing")
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    with pytest.raises(GeneratorError, match=r"vLLM is not installed.*\[vllm\]"):
        VLLMGenerator(tmp_path)


def test_a_grammar_goes_to_vllm_as_structured_outputs_and_is_applied(fake_vllm: Path) -> None:
    from engine.grammar import ActionGrammar

    FakeLLM.script = REPLY.replace("get 1 stick", "get 1 unobtainium")  # the model wants to leave the grammar
    gen = VLLMGenerator(fake_vllm)
    grammar = ActionGrammar("inventory|get [1-9] stick")
    out = gen.sample([SampleRequest(PROMPT, n=2, params=SamplingParams(grammar=grammar)), SampleRequest(PROMPT, n=1)])
    sent = next(c for c in FakeLLM.instances[0].calls if c[0] == "generate")[2]
    constrained, free = sent
    assert isinstance(constrained.structured_outputs, vllm_double.StructuredOutputsParams)
    assert constrained.structured_outputs.regex == grammar.regex and free.structured_outputs is None
    assert all(grammar.accepts(c.text) for c in out[0]) and "get 1 s" in out[0][0].text
    assert not grammar.accepts(out[1][0].text) and "unobtainium" in out[1][0].text
    del sys.modules["vllm"].sampling_params  # an old vLLM without structured outputs: refused, not ignored
    with pytest.raises(GeneratorError, match="no structured outputs"):
        gen.sample([SampleRequest(PROMPT, n=1, params=SamplingParams(grammar=grammar))])


def test_constrained_log_probs_are_rescored_without_the_mask(fake_vllm: Path) -> None:
    """vLLM masks the logits before it computes raw log-probs, so a constrained sample's are
    renormalised over the allowed tokens; stored as the DPO reference they would be wrong. The
    backend re-scores those completions teacher-forced (no mask): what `logprobs()` and TRL compute."""
    from engine.grammar import ActionGrammar

    FakeLLM.script = REPLY.replace("get 1 stick", "get 1 unobtainium")
    gen = VLLMGenerator(fake_vllm)
    grammar = ActionGrammar("inventory|get [1-9] stick")
    (constrained,), (free,) = gen.sample([SampleRequest(PROMPT, params=SamplingParams(grammar=grammar)),
                                          SampleRequest(PROMPT)])
    assert constrained.finish_reason == "stop" and grammar.accepts(constrained.text)
    masked = next(step for c in FakeLLM.instances[0].calls if c[0] == "generate" for step in c[2])
    assert masked.structured_outputs is not None
    # Teacher-forced over the exact generated ids (a repaired sample need not be the canonical
    # encoding of its text; `canonical` says which, and only canonical ones stand in for the reference).
    prompt_ids = gen.encode_prompt(PROMPT)
    (scored,) = FakeLLM.instances[0].generate([{"prompt_token_ids": prompt_ids + list(constrained.token_ids)}],
                                              [vllm_double.SamplingParams(**SCORING_KWARGS)])
    assert constrained.logprob == pytest.approx(prompt_logprob_sum(scored, len(prompt_ids)), abs=1e-5)
    assert free.logprob == pytest.approx(gen.logprobs([PROMPT], [free.text])[0], abs=1e-5)  # sampled = scored
    if constrained.canonical:
        assert constrained.logprob == pytest.approx(gen.logprobs([PROMPT], [constrained.text])[0], abs=1e-5)
    assert constrained.logprob == pytest.approx(sum(constrained.token_logprobs))
    # What the engine returned for the constrained sample is not that (the mask's renormalisation).
    raw_out = FakeLLM.instances[0].generate([{"prompt_token_ids": gen.encode_prompt(PROMPT)}], [masked])[0]
    engine_sum = sum(step[t].logprob for step, t in zip(raw_out.outputs[0].logprobs, raw_out.outputs[0].token_ids))
    assert engine_sum > constrained.logprob + 1.0


def test_a_prompt_past_max_model_len_is_named_and_the_others_answered(fake_vllm: Path) -> None:
    """The engine's limit is read from its model config; a prompt past it is left out of the batch (vLLM
    would refuse the whole `generate` for it) and ContextOverflow carries the others' completions."""
    gen = VLLMGenerator(fake_vllm)
    gen._llm.llm_engine.model_config.max_model_len = len(gen.encode_prompt(PROMPT)) + 4
    long = [{"role": "user", "content": PROMPT[-1]["content"] * 4}]
    params = SamplingParams(temperature=0.0, max_tokens=3)
    with pytest.raises(ContextOverflow) as err:
        gen.sample([SampleRequest(PROMPT, params=params), SampleRequest(long, params=params)])
    assert list(err.value.overflowed) == [1] and "longer than the engine's max_model_len" in err.value.overflowed[1]
    assert err.value.partial[1] is None and len(err.value.partial[0] or []) == 1


def test_sleep_mode_frees_the_engine_and_refuses_requests_until_woken(fake_vllm: Path) -> None:
    gen = VLLMGenerator(fake_vllm, sleep_mode=True)
    llm = FakeLLM.instances[0]
    assert llm.kwargs["enable_sleep_mode"] is True
    awake = gen.sample([SampleRequest(PROMPT)])[0][0]
    gen.sleep(1)
    assert llm.asleep == 1 and gen.asleep == 1
    with pytest.raises(GeneratorError, match="asleep"):
        gen.sample([SampleRequest(PROMPT)])
    with pytest.raises(GeneratorError, match="asleep"):
        gen.logprobs([PROMPT], [REPLY])
    gen.wake_up()
    assert llm.calls[-2:] == [("sleep", 1), ("wake_up", None)] and gen.asleep is None
    assert gen.sample([SampleRequest(PROMPT)])[0][0].logprob == pytest.approx(awake.logprob)  # level 1 kept them
    with pytest.raises(ValueError, match="level"):
        gen.sleep(3)


def test_sleep_needs_an_engine_built_for_it(fake_vllm: Path) -> None:
    gen = VLLMGenerator(fake_vllm)
    assert "enable_sleep_mode" not in FakeLLM.instances[0].kwargs
    with pytest.raises(GeneratorError, match="without sleep mode.*sleep=1"):
        gen.sleep(1)


def test_an_engine_setting_this_vllm_lacks_is_named_before_the_engine_starts(fake_vllm: Path) -> None:
    with pytest.raises(GeneratorError, match="vLLM 0.33.0 has no engine setting 'gpu_memory_fraction'"):
        VLLMGenerator(fake_vllm, gpu_memory_fraction=0.5)
    assert FakeLLM.instances == []


def test_level_2_drops_the_weights_until_they_are_reloaded(fake_vllm: Path) -> None:
    """The double as vLLM: after a level-2 sleep and wake_up the engine computes with garbage; a
    reload_weights writes the folder back. Level 1 keeps them (the test above)."""
    gen = VLLMGenerator(fake_vllm, sleep_mode=True)
    before = gen.logprobs([PROMPT], [REPLY])[0]
    gen.sleep(2)
    gen.wake_up()
    assert gen.logprobs([PROMPT], [REPLY])[0] != pytest.approx(before, abs=1.0)
    gen.reload(fake_vllm)
    assert gen.logprobs([PROMPT], [REPLY])[0] == pytest.approx(before)


def test_the_double_sleeps_as_vllms_executor(fake_vllm: Path) -> None:
    sp = vllm_double.SamplingParams
    with pytest.raises(ValueError, match="Sleep mode is not enabled"):
        FakeLLM(str(fake_vllm)).sleep(level=1)
    llm = FakeLLM(str(fake_vllm), enable_sleep_mode=True)
    llm.sleep(level=2)
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate([{"prompt_token_ids": [1]}], sp())
    with pytest.raises(RuntimeError, match="unmapped"):  # writing weights whose memory is not mapped
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(fake_vllm)})
    llm.wake_up(tags=["weights"])
    assert llm.sleeping_tags == {"kv_cache"} and llm.asleep == 2  # still asleep: no KV cache
    llm.wake_up(tags=["weights"])  # not sleeping: a warning in vLLM, nothing done
    assert llm.sleeping_tags == {"kv_cache"}
    llm.wake_up()
    assert llm.asleep is None and llm.weights_lost
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(fake_vllm)})
    assert not llm.weights_lost and len(llm.generate([{"prompt_token_ids": [1]}], sp())) == 1
