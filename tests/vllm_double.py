"""A stand-in `vllm` package for CPU tests that refuses what vLLM 0.33.0 refuses.

WHY strict: a double that accepts any argument and ignores the grammar lets the CPU tests pass
whatever real vLLM does (issue 29). This one holds the pinned version's facts, read from its wheel
(tests/data/vllm_0.33.0_names.json; the behaviours cited from its source files below):

- names: `vllm.LLM(...)` takes its own parameters plus `EngineArgs` fields, anything else is a
  TypeError (`EngineArgs(**kwargs)`); `SamplingParams` is a msgspec Struct (an unknown keyword is
  "Unexpected keyword argument"); `StructuredOutputsParams` is a dataclass that needs exactly one
  constraint; `LLM.generate` / `collective_rpc` / `sleep` / `wake_up` take their real parameters.
- validation (`SamplingParams._verify_args`, `_verify_greedy_sampling`; the input processor's prompt
  length check) raises `vllm.exceptions.VLLMValidationError`, a `VLLMClientError`, not a ValueError;
  a regex holding a NUL is a ValueError (backend_xgrammar.validate_xgrammar_grammar).
- a dead engine raises `vllm.v1.engine.exceptions.EngineDeadError`, a `VLLMServerError`.
- sleep mode (docs/features/sleep_mode.md; the executor's sleep / wake_up): `sleep` needs an engine
  built with `enable_sleep_mode=True`; level 1 keeps the weights (offloaded to host RAM), level 2
  discards them, so after `wake_up` the engine computes with garbage until `reload_weights` writes
  a model in; `wake_up(tags=...)` wakes only those of {"weights", "kv_cache"}, and the engine is
  asleep while any is. A request while asleep is refused here (vLLM would queue it behind a paused
  scheduler and an offline `generate` would never return).
- the grammar is applied: the bitmask goes onto the logits BEFORE the sampler computes
  `raw_logprobs` (gpu_model_runner: apply_grammar_bitmask, then sampler), so a constrained sample's
  log-probs are renormalised over the allowed tokens; `prompt_logprobs` are never masked.

The model is a toy over the folder's tokenizer: at each reply position the logits are 0, +1 on
newline tokens and EOS, and +8 (+ `shift`) on the scripted next token (`LLM.reply` text, then EOS).
Decoding is greedy over the (masked) logits, so a grammatical script comes out as it is and a
script that leaves the grammar is repaired token by token, as a real constrained model's would be.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, ClassVar

import regex
import torch

NAMES: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "vllm_0.33.0_names.json").read_text())
VERSION = "0.33.0"
SAMPLING_EPS = 1e-5  # vllm.sampling_params._SAMPLING_EPS
SCRIPT_LOGIT = 8.0


# -- vllm.exceptions and vllm.v1.engine.exceptions (class names and bases as in 0.33.0) -----------

class VLLMError(Exception):
    pass


class VLLMClientError(VLLMError):
    pass


class VLLMServerError(VLLMError):
    pass


class VLLMValidationError(VLLMClientError):
    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value


class EngineDeadError(VLLMServerError):
    def __init__(self, *args: Any) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the root cause.", *args)


class EngineGenerateError(VLLMServerError):
    pass


for _cls in (VLLMError, VLLMClientError, VLLMServerError, VLLMValidationError):
    _cls.__module__ = "vllm.exceptions"
for _cls in (EngineDeadError, EngineGenerateError):
    _cls.__module__ = "vllm.v1.engine.exceptions"


# -- vllm.sampling_params ----------------------------------------------------------------------------

class StructuredOutputsParams:
    CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(NAMES["StructuredOutputsParams"]))
        if unknown:
            raise TypeError(f"StructuredOutputsParams.__init__() got an unexpected keyword argument {unknown[0]!r}")
        for name in NAMES["StructuredOutputsParams"]:
            setattr(self, name, kwargs.get(name, False if name.startswith("disable_") else None))
        count = sum(getattr(self, c) is not None for c in self.CONSTRAINTS)
        if count != 1:
            raise VLLMValidationError(f"You must use exactly one kind of structured outputs constraint, got {count}")


class SamplingParams:
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
        "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": None, "stop_token_ids": None,
        "ignore_eos": False, "max_tokens": 16, "min_tokens": 0, "logprobs": None, "prompt_logprobs": None,
        "detokenize": True, "skip_special_tokens": True, "include_stop_str_in_output": False,
        "structured_outputs": None, "logit_bias": None, "allowed_token_ids": None, "extra_args": None,
        "bad_words": None,
    }

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(NAMES["SamplingParams"]))
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")  # msgspec.Struct's message
        for name, value in {**self.DEFAULTS, **kwargs}.items():
            setattr(self, name, value)
        self.stop = [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._verify_args()
        if self.temperature < SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise TypeError("structured_outputs must be a StructuredOutputsParams")

    def _verify_args(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        if not math.isfinite(self.temperature):
            raise VLLMValidationError(f"temperature must be a finite number, got {self.temperature}.")
        if self.temperature < 0.0:
            raise VLLMValidationError(f"temperature must be non-negative, got {self.temperature}.")
        if self.temperature > 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}.",
                                      parameter="temperature", value=self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value != -1 and value < 0:
                raise VLLMValidationError(f"{name} must be non-negative or -1, got {value}.")
        if any(not s for s in self.stop):
            raise VLLMValidationError("stop cannot contain an empty string.")


EngineArgs = dataclasses.make_dataclass("EngineArgs", [(name, Any, None) for name in NAMES["EngineArgs"]])


# -- vllm.LLM ----------------------------------------------------------------------------------------

def _check_call(method: str, args: tuple, kwargs: dict[str, Any]) -> None:
    names = NAMES[f"LLM.{method}"]
    if len(args) > len(names):
        raise TypeError(f"LLM.{method}() takes {len(names)} arguments, got {len(args)}")
    unknown = sorted(set(kwargs) - set(names[len(args):]))
    if unknown:
        raise TypeError(f"LLM.{method}() got an unexpected keyword argument {unknown[0]!r}")


class LLM:
    """The offline engine. Subclasses script the replies (`reply`) and answer worker RPCs (`rpc`)."""

    instances: ClassVar[list[LLM]] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(NAMES["LLM.__init__"]) - set(NAMES["EngineArgs"]))
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
        from transformers import AutoTokenizer

        from engine.llm.hf_constrain import token_pieces

        self.kwargs = {"model": model, **kwargs}
        self.calls: list[tuple[Any, ...]] = []
        self.tok = AutoTokenizer.from_pretrained(model)
        self.eos = self.tok.eos_token_id
        self.vocab = len(self.tok)
        self.pieces = token_pieces(self.tok, self.vocab, set(self.tok.all_special_ids))
        self.newlines = [i for i, p in enumerate(self.pieces) if "\n" in p]
        self.header = self.tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        self.max_model_len = kwargs.get("max_model_len") or 4096
        self.shift = 0.0
        self.dead = False
        self.asleep: int | None = None  # the level of the last sleep, while any tag sleeps
        self.sleeping_tags: set[str] = set()
        self.weights_lost = False  # a level-2 sleep discarded them; reload_weights writes them again
        # As vLLM's LLMEngine: the engine core, and the model config that carries the context limit.
        self.llm_engine = NS(engine_core=NS(shutdown=self._shutdown), model_config=NS(max_model_len=self.max_model_len))
        self.shut = False
        type(self).instances.append(self)

    # What a subclass scripts -----------------------------------------------------------------------
    def reply(self, prompt_text: str, params: SamplingParams | None, index: int) -> str:
        return "ok"

    def rpc(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        raise AttributeError(f"Worker has no method {method!r}")

    # The engine --------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        self.shut = True

    def kill(self) -> None:
        """The engine core process died: every later call raises EngineDeadError."""
        self.dead = True

    def _split(self, ids: list[int]) -> int:
        """Where the reply starts in `ids`: after the last assistant header (0 when there is none)."""
        h = len(self.header)
        for at in range(len(ids) - h, -1, -1):
            if ids[at:at + h] == self.header:
                return at + h
        return 0

    def _script(self, prompt_ids: list[int], params: SamplingParams | None, index: int) -> list[int]:
        text = self.reply(self.tok.decode(prompt_ids), params, index)
        return self.tok(text, add_special_tokens=False)["input_ids"] + [self.eos]

    def _logits(self, script: list[int], k: int) -> torch.Tensor:
        if self.weights_lost:  # memory handed back by a level-2 sleep: whatever it holds now
            return torch.randn(self.vocab, generator=torch.Generator().manual_seed(len(script) * 7919 + k)) * 4
        logits = torch.zeros(self.vocab)
        logits[self.newlines] = 1.0
        logits[self.eos] = 1.0
        logits[script[k] if k < len(script) else self.eos] = SCRIPT_LOGIT + self.shift
        return logits

    def _allowed(self, pattern: Any, text: str) -> torch.Tensor:
        allowed = torch.tensor([bool(p) and pattern.fullmatch(text + p, partial=True) is not None
                                for p in self.pieces])
        allowed[self.eos] = pattern.fullmatch(text) is not None
        return allowed

    def _validate(self, prompt: Any, sp: Any) -> None:
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"sampling_params must be SamplingParams, got {type(sp).__name__}")
        if not isinstance(prompt, dict) or set(prompt) != {"prompt_token_ids"}:
            raise TypeError(f"this double takes TokensPrompt dicts only, got {prompt!r:.80}")
        n = len(prompt["prompt_token_ids"])
        if n > self.max_model_len:
            raise VLLMValidationError(f"The decoder prompt (length {n}) is longer than the maximum model length "
                                      f"of {self.max_model_len}. Make sure that `max_model_len` is no smaller "
                                      "than the number of text tokens.")
        so = sp.structured_outputs
        if so is not None:
            if so.regex is None:
                raise NotImplementedError("this double applies regex constraints only")
            if "\x00" in so.regex:
                raise ValueError("structured_outputs.regex must not contain a NUL character ('\\x00')")
            try:
                regex.compile(so.regex)
            except regex.error as exc:
                raise VLLMValidationError(f"Failed to transform regex into a grammar: {exc}") from exc

    def generate(self, prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any) -> list[NS]:
        _check_call("generate", (prompts, sampling_params, *args), kwargs)
        if self.dead:
            raise EngineDeadError()
        if self.asleep is not None:
            raise RuntimeError("the engine is asleep: wake_up() before generate()")
        prompts = list(prompts) if isinstance(prompts, Sequence) and not isinstance(prompts, dict) else [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        for prompt, sp in zip(prompts, params, strict=True):
            self._validate(prompt, sp)
        self.calls.append(("generate", prompts, params))
        return [self._one(p["prompt_token_ids"], sp) for p, sp in zip(prompts, params, strict=True)]

    def _one(self, ids: list[int], sp: SamplingParams) -> NS:
        prompt_logprobs = None
        if sp.prompt_logprobs is not None:
            start = self._split(ids)
            script = self._script(ids[:start], None, 0)
            prompt_logprobs = [None] + [
                {t: NS(logprob=float(torch.log_softmax(self._logits(script, k - start) if k >= start
                                                       else torch.zeros(self.vocab), -1)[t]), rank=1)}
                for k, t in enumerate(ids[1:], start=1)
            ]
        pattern = regex.compile(sp.structured_outputs.regex) if sp.structured_outputs is not None else None
        outputs = []
        for i in range(sp.n):
            script = self._script(ids, sp, i)
            gen: list[int] = []
            steps: list[dict[int, NS]] = []
            text, finish = "", "length"
            while len(gen) < (sp.max_tokens or 16):
                logits = self._logits(script, len(gen))
                if pattern is not None:  # the bitmask, before the log-probs (as vLLM's model runner)
                    logits = logits.masked_fill(~self._allowed(pattern, text), float("-inf"))
                logps = torch.log_softmax(logits, -1)
                tid = int(torch.argmax(logits))
                gen.append(tid)
                steps.append({tid: NS(logprob=float(logps[tid]), rank=1, decoded_token=None)})
                if tid == self.eos:
                    finish = "stop"
                    break
                text += self.pieces[tid]
                if any(s in text for s in sp.stop):
                    finish = "stop"
                    break
            outputs.append(NS(index=i, text=text, token_ids=gen, cumulative_logprob=None,
                              logprobs=steps if sp.logprobs is not None else None, finish_reason=finish))
        return NS(prompt_token_ids=ids, prompt_logprobs=prompt_logprobs, outputs=outputs, finished=True)

    def collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        _check_call("collective_rpc", (method, *args), kwargs)
        if self.dead:
            raise EngineDeadError()
        call_args, call_kwargs = tuple(kwargs.get("args", ())), dict(kwargs.get("kwargs") or {})
        if method == "reload_weights" and "weights" in self.sleeping_tags:
            raise RuntimeError("CUDA error: an illegal memory access (the weights' memory is unmapped while asleep)")
        self.calls.append(("rpc", method, call_args, call_kwargs))
        result = [self.rpc(method, call_args, call_kwargs)]
        if method == "reload_weights":  # the weights are written again (the subclass's rpc did not fail)
            self.weights_lost = False
        return result

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        _check_call("reset_prefix_cache", args, kwargs)
        self.calls.append(("reset_prefix_cache",))
        return True

    def sleep(self, *args: Any, **kwargs: Any) -> None:
        _check_call("sleep", args, kwargs)
        level = (args or (kwargs.get("level", 1),))[0]
        if not self.kwargs.get("enable_sleep_mode"):
            raise ValueError("Sleep mode is not enabled. Start the engine with enable_sleep_mode=True.")
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2 in this double, got {level!r}")
        if self.dead:
            raise EngineDeadError()
        self.calls.append(("sleep", level))
        if self.sleeping_tags:  # the executor: "Executor is already sleeping." (a warning, nothing done)
            return
        self.asleep, self.sleeping_tags = level, {"weights", "kv_cache"}
        self.weights_lost = self.weights_lost or level == 2

    def wake_up(self, *args: Any, **kwargs: Any) -> None:
        _check_call("wake_up", args, kwargs)
        tags = (args or (kwargs.get("tags"),))[0]
        if self.dead:
            raise EngineDeadError()
        self.calls.append(("wake_up", tags))
        if tags and any(t not in self.sleeping_tags for t in tags):
            return  # the executor warns "Tag ... is not in sleeping tags" and wakes nothing
        self.sleeping_tags -= set(tags) if tags else self.sleeping_tags
        if not self.sleeping_tags:
            self.asleep = None


def install(monkeypatch: Any, llm_cls: type[LLM]) -> types.ModuleType:
    """Put the stand-in `vllm` (with `llm_cls` as `vllm.LLM`) into sys.modules for one test."""
    root = types.ModuleType("vllm")
    root.__version__ = VERSION  # type: ignore[attr-defined]
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.SamplingParams, sampling.StructuredOutputsParams = SamplingParams, StructuredOutputsParams  # type: ignore[attr-defined]
    exceptions = types.ModuleType("vllm.exceptions")
    for cls in (VLLMError, VLLMClientError, VLLMServerError, VLLMValidationError):
        setattr(exceptions, cls.__name__, cls)
    engine_exceptions = types.ModuleType("vllm.v1.engine.exceptions")
    engine_exceptions.EngineDeadError, engine_exceptions.EngineGenerateError = EngineDeadError, EngineGenerateError  # type: ignore[attr-defined]
    root.LLM, root.EngineArgs, root.SamplingParams = llm_cls, EngineArgs, SamplingParams  # type: ignore[attr-defined]
    root.sampling_params, root.exceptions = sampling, exceptions  # type: ignore[attr-defined]
    for name, module in {"vllm": root, "vllm.sampling_params": sampling, "vllm.exceptions": exceptions,
                         "vllm.v1": types.ModuleType("vllm.v1"), "vllm.v1.engine": types.ModuleType("vllm.v1.engine"),
                         "vllm.v1.engine.exceptions": engine_exceptions}.items():
        monkeypatch.setitem(sys.modules, name, module)
    llm_cls.instances = []
    return root
