"""`VLLMGenerator`: the offline vLLM engine (GPU), with the same conventions as `HFGenerator`.

vLLM is imported lazily in the constructor: it pins its own torch/transformers and is installed by
the GPU set-up (`pip install -e ".[vllm]" -c constraints-gpu.txt`), so this module must import without it. The pure
parts (request -> SamplingParams kwargs, vLLM outputs -> Completions) are module functions,
tested on CPU with stand-in objects shaped like vLLM's.

WHY we apply the chat template ourselves and call `llm.generate` on token ids, not `llm.chat`:
- `sample()` and `logprobs()` see exactly HFGenerator's prompt ids (template rendered to text,
  encoded without added special tokens), so the prompt/completion boundary is exact and vLLM's
  own special-token handling cannot add a second BOS;
- one `generate` call takes every request with its own SamplingParams; search siblings share
  long token prefixes, which `enable_prefix_caching=True` then computes once.
Text is decoded by us from the token ids with HFGenerator's rules (trailing EOS dropped, special
tokens kept, cut at the first stop string), whatever vLLM's detokenizer options.

Log-probs: `logprobs=1` makes vLLM return, per step, the sampled token's log-prob (plus the top-1;
1 rather than 0, which old vLLM versions answered with no log-probs at all). With
`logprobs_mode="raw_logprobs"` (set when the installed vLLM has the option, >= 0.10.2; it is
also the V1 default) they come from the raw model distribution, not the temperature/top-p
processed one, as the replay buffer needs. `Completion.logprob` sums over all generated ids:
the EOS when the model ended, and for a stop string the tokens up to the one completing it.
`logprobs()` scores prompt + completion + EOS (HFGenerator's convention) with `prompt_logprobs=1`.
A constrained sample's log-probs are re-scored that way (`_unmasked`): vLLM's come after the
grammar mask, renormalised over the allowed tokens.
"""

from __future__ import annotations

import gc
import inspect
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from engine.errors import cause_line
from engine.llm.base import (
    Completion,
    ContextOverflow,
    GeneratorError,
    Prompt,
    SampleRequest,
    SamplingParams,
    is_canonical,
)
from engine.llm.openai_reply import cut_at_stop

log = logging.getLogger(__name__)

# vLLM's finish reasons -> ours ("stop" | "length" | "error"). "stop" is EOS or a stop string;
# "repetition" (vLLM's repetition detector cut the text) is a cut, not a natural end; "abort" and
# "error" mean the engine gave up on the request. Anything else is unknown: "error", and logged.
FINISH_REASONS = {"stop": "stop", "length": "length", "repetition": "length", "abort": "error", "error": "error"}

# vLLM's own limits (SamplingParams._verify_args, 0.33): refused here first, naming our setting.
MAX_TEMPERATURE = 2.0
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it is greedy decoding


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_BELOW


def sampling_kwargs(params: SamplingParams, n: int, seeded: bool = True) -> dict[str, Any]:
    """`vllm.SamplingParams` kwargs for one request; raises ValueError, naming the setting, on
    settings vLLM rejects. `seeded=False` leaves the request's seed out (see VLLMGenerator).

    Greedy decoding with n > 1 (vLLM refuses it: "n must be 1 when using greedy sampling") asks
    for ONE completion; `VLLMGenerator.sample` hands it out n times. Greedy is deterministic, so
    that is exactly what n greedy samples are (the HF backend returns n equal texts too)."""
    if n < 1:
        raise ValueError("n must be >= 1 (requests with n=0 are not sent)")
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (got {params.max_tokens})")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (got {params.top_p})")
    if not 0 <= params.temperature <= MAX_TEMPERATURE:
        raise ValueError(
            f"temperature must be in [0, {MAX_TEMPERATURE}] for vLLM (got {params.temperature})"
        )
    return {
        "n": 1 if is_greedy(params) else n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "stop": list(params.stop) or None,
        "seed": params.seed if seeded else None,
        "logprobs": 1,  # each step's dict holds the sampled token (and the top-1)
    }


# Teacher-forced scoring: one throw-away generated token; prompt_logprobs=1 gives each prompt
# token's own log-prob (the first is None: it has no context).
SCORING_KWARGS: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}


def engine_kwargs(
    model_dir: str | Path, seed: int, engine_arg_names: Collection[str], overrides: dict[str, Any]
) -> dict[str, Any]:
    """`vllm.LLM` kwargs: prefix caching on, raw log-probs where this vLLM has the option."""
    kwargs: dict[str, Any] = {"model": str(model_dir), "enable_prefix_caching": True, "seed": seed}
    if "logprobs_mode" in engine_arg_names:
        kwargs["logprobs_mode"] = "raw_logprobs"
    return {**kwargs, **overrides}


def _sampled_logprobs(steps: Sequence[dict[int, Any]] | None, ids: Sequence[int]) -> tuple[float, ...] | None:
    """The log-prob of each sampled id from vLLM's per-step {token_id: Logprob} dicts."""
    if steps is None or len(steps) != len(ids):
        return None
    out = []
    for step, tid in zip(steps, ids, strict=True):
        entry = step.get(tid)
        if entry is None:
            return None
        out.append(float(entry.logprob))
    return tuple(out)


def completions_from_output(
    output: Any, decode: Callable[[list[int]], str], eos_ids: Collection[int], stop: Sequence[str],
    encode: Callable[[str], list[int]] | None = None, eos_id: int | None = None,
) -> list[Completion]:
    """Map one vLLM `RequestOutput` (its `outputs[i]`: token_ids, logprobs, finish_reason);
    with `encode` and `eos_id`, each completion says whether its ids are canonical."""
    comps = []
    for o in sorted(output.outputs, key=lambda o: o.index):
        ids = list(o.token_ids)
        visible = ids[:-1] if ids and ids[-1] in eos_ids else ids
        text, cut = cut_at_stop(decode(visible), stop)
        lps = _sampled_logprobs(o.logprobs, ids)
        comps.append(
            Completion(
                text=text,
                logprob=float(sum(lps)) if lps is not None else None,
                token_logprobs=lps,
                n_tokens=len(ids),
                finish_reason="stop" if cut else finish_reason(o.finish_reason),
                token_ids=tuple(ids),
                canonical=None if encode is None else is_canonical(ids, text, encode, eos_id, eos_ids),
            )
        )
    return comps


def finish_reason(reason: Any) -> str:
    """Our finish reason for vLLM's (see FINISH_REASONS); an unknown one is an error, logged."""
    mapped = FINISH_REASONS.get(str(reason))
    if mapped is None:
        log.warning("vLLM finish reason %r is unknown; recorded as 'error'", reason)
        return "error"
    return mapped


def _vllm_classes(exc: BaseException) -> set[str]:
    """The names of `exc`'s classes that vLLM defines (its module is `vllm` or under it)."""
    return {c.__name__ for c in type(exc).__mro__ if c.__module__.split(".")[0] == "vllm"}


def request_error(exc: BaseException) -> bool:
    """Is this vLLM refusing a request or a setting (a one-line GeneratorError for the user) rather
    than failing itself? vLLM's own split (0.33, `vllm.exceptions`; its HTTP error responses map
    them to 4xx / 5xx): `VLLMClientError` (e.g. `VLLMValidationError`, NOT a ValueError) is the
    request's fault, and so are the raw ValueError / OverflowError its not-yet-migrated validations
    raise; `VLLMServerError` (`EngineDeadError`, `EngineGenerateError`, `GenerationError`) is the
    engine's, and propagates with its traceback. A TypeError is never a refused request here: every
    argument is built by this module, so it means an argument this vLLM does not take."""
    names = _vllm_classes(exc)
    if "VLLMServerError" in names:
        return False
    if "VLLMClientError" in names:
        return True
    return isinstance(exc, (ValueError, OverflowError)) and not isinstance(exc, TypeError)


def prompt_logprob_sum(output: Any, start: int) -> float | None:
    """Sum of the prompt log-probs of tokens [start, end) of a scored `RequestOutput`."""
    ids, steps = list(output.prompt_token_ids), output.prompt_logprobs
    if steps is None or len(steps) != len(ids) or start < 1:
        return None
    lps = _sampled_logprobs(steps[start:], ids[start:])
    return float(sum(lps)) if lps is not None else None


def check_engine_options(overrides: dict[str, Any], known: Collection[str], version: str) -> None:
    """GeneratorError naming the first engine setting this vLLM does not take (vLLM itself raises a
    TypeError deep in EngineArgs, after the tokenizer is loaded)."""
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise GeneratorError(f"vLLM {version} has no engine setting {unknown[0]!r} (a vllm: spec option or "
                             "engine override)")


class VLLMGenerator:
    """A `Generator` over `vllm.LLM` (see the module docstring). `engine_overrides` go to
    `vllm.LLM` as they are (e.g. `max_model_len`, `enforce_eager`, `dtype`), each checked against
    the installed vLLM's `LLM` / `EngineArgs` names first.

    `sleep_mode`: build the engine with `enable_sleep_mode=True`, so `sleep()` can hand its GPU
    memory (weights and KV cache) to training in this process and `wake_up()` take it back
    (engine.train.vllm_policy does so around every training phase of the loop). While asleep,
    `sample` / `logprobs` raise GeneratorError: vLLM would queue the requests behind a paused
    scheduler, and an offline `generate` would wait forever.

    `request_seeds` (off by default): send each request's seed. vLLM 0.33 gives every seeded
    request its own torch.Generator, drawn one request at a time (sampler's random_sample), and a
    batch with any such generator leaves FlashInfer's top-p/top-k kernel for the sort-based native
    path (topk_topp_sampler); MCTS seeds every request. Unseeded, the engine's seed (`seed`) still
    fixes the run's stream, but a sample then depends on its batch."""

    name: str

    def __init__(
        self,
        model_dir: str | Path,
        seed: int = 0,
        gpu_memory_utilization: float = 0.85,
        name: str | None = None,
        request_seeds: bool = False,
        sleep_mode: bool = False,
        **engine_overrides: Any,
    ) -> None:
        path = Path(model_dir)
        if not path.is_dir():
            raise GeneratorError(f"model folder {path} does not exist")
        try:
            import vllm
        except ImportError as exc:
            raise GeneratorError(
                "vLLM is not installed: install the GPU set-up (pip install -e '.[vllm]' -c constraints-gpu.txt; "
                f"it pins its own torch): {exc}"
            ) from exc
        self._vllm = vllm
        self._seed = seed
        self.request_seeds = request_seeds
        self._overrides = {"gpu_memory_utilization": gpu_memory_utilization, **engine_overrides}
        if sleep_mode:
            self._overrides["enable_sleep_mode"] = True
        self._engine_arg_names = frozenset(inspect.signature(vllm.EngineArgs).parameters)
        check_engine_options(self._overrides, self._engine_arg_names | _parameters(vllm.LLM.__init__),
                             getattr(vllm, "__version__", "?"))
        self.sleep_mode = sleep_mode
        self.asleep: int | None = None  # the sleep level while asleep
        self._llm = vllm.LLM(**engine_kwargs(path, seed, self._engine_arg_names, self._overrides))
        self._load_tokenizer(path)
        self.name = name or f"vllm:{path}"
        # What follows the folder in `name` ("?max_model_len=4096..."), kept across reloads.
        self._name_tail = self.name[len(f"vllm:{path}"):] if self.name.startswith(f"vllm:{path}") else ""

    def sleep(self, level: int) -> None:
        """Free the engine's GPU memory (vLLM's `LLM.sleep`): level 1 copies the weights to host RAM
        and drops the KV cache; level 2 drops the weights too (serve again only after `reload`).
        GeneratorError when the engine was built without sleep mode."""
        if not self.sleep_mode:
            raise GeneratorError(f"{self.name}: the engine was built without sleep mode (vllm: spec option sleep=1)")
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2 (got {level})")
        if self.asleep is None:
            self._llm.sleep(level=level)
            self.asleep = level

    def wake_up(self) -> None:
        """Take the GPU memory back (weights, KV cache); after a level-2 sleep the weights hold
        garbage until `reload` writes a model folder into them."""
        if self.asleep is not None:
            self._llm.wake_up()
            self.asleep = None

    def _awake(self) -> None:
        if self.asleep is not None:
            raise GeneratorError(f"{self.name}: the engine is asleep (level {self.asleep}); wake_up() it first")

    @property
    def llm(self) -> Any:
        """The underlying `vllm.LLM` (for benchmarks and vLLM-specific calls)."""
        return self._llm

    def _load_tokenizer(self, path: Path) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
            eos = (GenerationConfig.from_pretrained(path, local_files_only=True).eos_token_id
                   if (path / "generation_config.json").exists() else None)
        except Exception as exc:  # noqa: BLE001 - a broken folder: one line
            raise GeneratorError(f"cannot read the tokenizer of {path}: {cause_line(exc)}") from None
        if getattr(tok, "chat_template", None) is None:
            raise GeneratorError(f"{path}: the tokenizer has no chat template")
        eos_ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        eos_ids |= {e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int) and not isinstance(e, bool)}
        if not eos_ids:
            raise GeneratorError(
                f"{path}: neither the tokenizer nor the generation config names an EOS token"
            )
        self.tokenizer = tok
        self.eos_ids = frozenset(eos_ids)
        self.eos_id: int = tok.eos_token_id if tok.eos_token_id is not None else min(eos_ids)
        self.model_dir = path

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids of the chat-templated prompt, as HFGenerator.encode_prompt."""
        text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _encode_text(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _decode(self, ids: list[int]) -> str:
        # One sequence decodes to one str; transformers types decode() as str | list[str] for both cases.
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _generate(self, prompts: list[dict[str, list[int]]], params: list[Any]) -> list[Any]:
        try:
            return self._llm.generate(prompts, params, use_tqdm=False)
        except Exception as exc:  # e.g. a prompt longer than max_model_len
            if not request_error(exc):
                raise
            raise GeneratorError(f"{self.name}: vLLM refused the request: {_one_line(exc)}") from exc

    def _structured(self, r: int, pattern: str) -> dict[str, Any]:
        """The `vllm.SamplingParams` kwarg that constrains decoding to `pattern`: structured outputs
        (vLLM >= 0.11), else the guided decoding they replaced (removed in 0.12)."""
        module = getattr(self._vllm, "sampling_params", self._vllm)
        if hasattr(module, "StructuredOutputsParams"):
            return {"structured_outputs": module.StructuredOutputsParams(regex=pattern)}
        if hasattr(module, "GuidedDecodingParams"):
            return {"guided_decoding": module.GuidedDecodingParams(regex=pattern)}
        raise GeneratorError(f"{self.name}: request {r}: this vLLM has no structured outputs for constrained decoding")

    def _sampling_params(self, r: int, kwargs: dict[str, Any]) -> Any:
        try:
            return self._vllm.SamplingParams(**kwargs)
        except Exception as exc:
            if not request_error(exc):
                raise
            raise GeneratorError(f"{self.name}: request {r}: vLLM refused the sampling settings: "
                                 f"{_one_line(exc)}") from exc

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        """For each request, `request.n` completions, in order; all requests in one `generate`. A prompt
        longer than the engine's max_model_len is left out and named by ContextOverflow."""
        self._awake()
        sent: list[int] = []
        prompts: list[dict[str, list[int]]] = []
        params: list[Any] = []
        overflowed: dict[int, str] = {}
        limit = self._max_model_len()
        for r, req in enumerate(requests):
            if req.n < 0:
                raise ValueError(f"request {r}: n must be >= 0")
            if req.n == 0:
                continue
            try:
                kwargs = sampling_kwargs(req.params, req.n, seeded=self.request_seeds)
            except ValueError as exc:
                raise GeneratorError(f"{self.name}: request {r}: {exc}") from None
            if req.params.grammar is not None:
                kwargs.update(self._structured(r, req.params.grammar.regex))
            ids = self.encode_prompt(req.prompt)
            if limit is not None and len(ids) > limit:  # vLLM would refuse the whole batch for it
                overflowed[r] = (f"{self.name}: request {r}: prompt of {len(ids)} tokens is longer than the "
                                 f"engine's max_model_len {limit}")
                continue
            sent.append(r)
            prompts.append({"prompt_token_ids": ids})
            params.append(self._sampling_params(r, kwargs))
        out: list[list[Completion]] = [[] for _ in requests]
        if prompts:
            for r, prompt, output in zip(sent, prompts, self._generate(prompts, params), strict=True):
                comps = completions_from_output(output, self._decode, self.eos_ids, requests[r].params.stop,
                                                encode=self._encode_text, eos_id=self.eos_id)
                if requests[r].params.grammar is not None:
                    comps = self._unmasked(prompt["prompt_token_ids"], comps)
                if is_greedy(requests[r].params) and len(comps) == 1:
                    comps = comps * requests[r].n  # greedy: n equal completions (see sampling_kwargs)
                out[r] = comps
        if overflowed:
            raise ContextOverflow(overflowed, [None if r in overflowed else o for r, o in enumerate(out)])
        return out

    def _max_model_len(self) -> int | None:
        """The engine's context limit (`LLM.llm_engine.model_config.max_model_len`), None where unknown."""
        config = getattr(getattr(self._llm, "llm_engine", None), "model_config", None)
        limit = getattr(config, "max_model_len", None)
        return limit if isinstance(limit, int) and limit > 0 else None

    def _unmasked(self, prompt_ids: list[int], comps: list[Completion]) -> list[Completion]:
        """Constrained completions with their log-probs re-scored teacher-forced, without the mask.

        WHY: vLLM applies the grammar's bitmask to the logits before its sampler computes
        `raw_logprobs` (0.33: the model runner's apply_grammar_bitmask, then the sampler), so a
        constrained sample's log-probs are renormalised over the allowed tokens: not the policy's,
        and not what DPO's reference pass computes. One prompt-scoring pass over the exact ids (the
        prefix cache holds the prompt) gives the unmasked ones; where it is refused (a sequence at
        max_model_len) the log-probs are unknown (None), never the masked values."""
        batch = [{"prompt_token_ids": prompt_ids + list(c.token_ids or ())} for c in comps]
        try:
            scored = self._generate(batch, [self._sampling_params(0, SCORING_KWARGS)] * len(batch))
        except GeneratorError as exc:
            log.warning("%s: constrained completions could not be re-scored (%s); their log-probs are unknown",
                        self.name, exc)
            return [replace(c, logprob=None, token_logprobs=None) for c in comps]
        out = []
        for c, o in zip(comps, scored, strict=True):
            steps = o.prompt_logprobs
            ids = list(c.token_ids or ())
            lps = _sampled_logprobs(steps[len(prompt_ids):], ids) if steps is not None and ids else None
            out.append(replace(c, logprob=float(sum(lps)) if lps is not None else None, token_logprobs=lps))
        return out

    def logprobs(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float | None]:
        """Teacher-forced sum of RAW log-probs of each completion + EOS as the assistant reply."""
        if len(prompts) != len(completions):
            raise ValueError("prompts and completions differ in length")
        if not prompts:
            return []
        self._awake()
        starts, batch = [], []
        for prompt, text in zip(prompts, completions, strict=True):
            p = self.encode_prompt(prompt)
            c = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos_id]
            starts.append(len(p))
            batch.append({"prompt_token_ids": p + c})
        scoring = self._sampling_params(0, SCORING_KWARGS)
        outputs = self._generate(batch, [scoring] * len(batch))
        return [prompt_logprob_sum(o, s) for o, s in zip(outputs, starts, strict=True)]

    def reload(self, model_dir: str | Path) -> str:
        """Serve new weights (same architecture and vocabulary, e.g. after training); returns how:
        "in-place" or "rebuilt".

        In place through the worker's `reload_weights(weights_path=...)` (current vLLM), else the
        older RL recipe (`update_config` pointing the model config at the new folder, then
        `reload_weights()`); cached prefixes belong to the old weights, so the prefix cache is
        reset. If neither in-place path works in this vLLM the engine is rebuilt (a full start),
        with a WARNING in the log: never silently. `name` becomes "vllm:<model_dir>" with the spec's
        options (if any) kept. Call it awake: an asleep engine's weights are not mapped."""
        path = Path(model_dir)
        if not path.is_dir():
            raise GeneratorError(f"model folder {path} does not exist")
        self._awake()
        how = "in-place"
        try:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        except Exception as new_exc:  # noqa: BLE001 (an older vLLM: try its recipe, then rebuild)
            try:
                self._llm.collective_rpc("update_config", args=({"model_config": {"model": str(path)}},))
                self._llm.collective_rpc("reload_weights")
            except Exception as exc:  # noqa: BLE001
                log.warning(
                    "%s: in-place weight reload failed (%s; %s); REBUILDING the vLLM engine",
                    self.name, _one_line(new_exc), _one_line(exc),
                )
                self._rebuild(path)
                how = "rebuilt"
        if how == "in-place":
            self._llm.reset_prefix_cache()
        self._load_tokenizer(path)
        self.name = f"vllm:{path}{self._name_tail}"
        log.info("%s: weights reloaded (%s)", self.name, how)
        return how

    def _rebuild(self, path: Path) -> None:
        old, self._llm = self._llm, None
        shutdown = getattr(getattr(old.llm_engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()  # V1 runs the engine in a child process: free its GPU memory first
        del old
        gc.collect()
        import torch  # present wherever vLLM is

        torch.cuda.empty_cache()  # for an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        self._llm = self._vllm.LLM(**engine_kwargs(path, self._seed, self._engine_arg_names, self._overrides))


def _parameters(fn: Any) -> frozenset[str]:
    """The keyword names `fn` takes (not self, *args, **kwargs)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(n for n, p in inspect.signature(fn).parameters.items() if p.kind in kinds and n != "self")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
