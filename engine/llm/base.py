"""The `Generator` protocol: what search, critics and dataset builders need from an LLM.

One call takes MANY requests (from many trees, each with its own n and sampling settings) and
returns every completion with the raw token log-probs of the generating model (not the
temperature-processed distribution), so the replay buffer can serve as the DPO reference.
Prompts are chat messages; each backend applies its own chat template.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from concurrent.futures import Future, as_completed, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from engine.grammar import ActionGrammar

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
Prompt = list[Message]


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy. `stop` strings end a completion (not included in it).
    `grammar`: decode only completions the composite-action grammar accepts (engine/grammar.py);
    backends that cannot constrain refuse it rather than ignore it."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    grammar: ActionGrammar | None = None


@dataclass(frozen=True)
class SampleRequest:
    prompt: Prompt
    n: int = 1
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class Completion:
    """One sampled completion. `logprob` is the sum of `token_logprobs` (None when the backend
    could not provide them, e.g. a hosted API without log-probs)."""

    text: str
    logprob: float | None = None
    token_logprobs: tuple[float, ...] | None = None
    n_tokens: int = 0
    finish_reason: str = ""  # "stop" | "length" | "error"
    token_ids: tuple[int, ...] | None = None  # the generated ids, where the backend has them
    # For a sample that ended at EOS: are `token_ids` the canonical encoding of `text` + EOS, the
    # ids teacher-forced scoring and DPO training score? False: `logprob` belongs to another token
    # sequence (a different segmentation of the same text) and must not stand in for the
    # reference. None: unknown, or the sample did not end at EOS (cut by a stop string or length).
    canonical: bool | None = None


def is_canonical(ids: Sequence[int], text: str, encode: Callable[[str], Sequence[int]], eos_id: int | None,
                 eos_ids: Collection[int]) -> bool | None:
    """The token-id check behind `Completion.canonical`."""
    if not ids or ids[-1] not in eos_ids or eos_id is None:
        return None
    return list(ids) == [*encode(text), eos_id]


class GeneratorError(RuntimeError):
    """A backend failed in a way the caller should report (bad URL, auth, model missing)."""


class PromptTooLong(GeneratorError):
    """One request's prompt plus its max_tokens does not fit the model's context: that request's
    fault, not the batch's nor the server's, so the batch's other requests still get answers."""


class ContextOverflow(GeneratorError):
    """Raised by `sample` when some of the batch's requests did not fit the model's context.
    `overflowed` maps their indices to the backend's message; `partial` holds every other request's
    completions (None at the overflowed ones), so a caller that can drop a request loses no work."""

    def __init__(self, overflowed: dict[int, str], partial: list[list[Completion] | None]) -> None:
        first = min(overflowed)
        super().__init__(f"{len(overflowed)} of {len(partial)} prompts do not fit the model's context; "
                         f"request {first}: {overflowed[first]}")
        self.overflowed, self.partial = overflowed, partial


def gather(futures: Sequence[Future[list[Completion]]], abort: Any = None) -> list[list[Completion]]:
    """The futures' results in order. The first error other than PromptTooLong sets `abort` (an
    Event the calls watch, if given) and is raised once all have ended; PromptTooLong errors are
    collected into one ContextOverflow after the others have answered."""
    for fut in as_completed(futures):
        exc = fut.exception()
        if exc is not None and not isinstance(exc, PromptTooLong):
            if abort is not None:
                abort.set()
            wait(futures)
            raise exc
    overflowed = {i: str(f.exception()) for i, f in enumerate(futures) if f.exception() is not None}
    if overflowed:
        raise ContextOverflow(overflowed, [None if i in overflowed else f.result() for i, f in enumerate(futures)])
    return [f.result() for f in futures]


@runtime_checkable
class Generator(Protocol):
    name: str  # e.g. "tiny", "hf:/models/x", "openai:http://host/v1#model"

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        """For each request, `request.n` completions, in order. One batched call."""
        ...

    def logprobs(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float | None]:
        """Teacher-forced sum of log-probs of each completion as the assistant reply to its prompt."""
        ...


@runtime_checkable
class SupportsSubmit(Protocol):
    """A backend that serves requests independently (an HTTP server with continuous batching):
    search sends each request as soon as a tree needs it and advances that tree when ITS
    completions arrive, with no round barrier. Batched backends (HF) offer only `sample`.
    `affinity` names the request's tree: a multi-server backend keeps one key on one server so
    that server's prefix cache holds the tree's shared history."""

    def submit(self, request: SampleRequest, affinity: Hashable | None = None) -> Future[list[Completion]]:
        """Start `request`; the future resolves to its `request.n` completions (or the error)."""
        ...


@runtime_checkable
class SupportsDriven(Protocol):
    """A `submit` backend whose I/O the submitting thread can run itself (`OpenAIGenerator` over its event
    loop): inside `driven()`, the yielded driver's `wait(until)` runs the I/O until `until()` holds and the
    futures' callbacks run on the caller's thread, with no hand-off between threads per request; `send()`
    sends what was submitted since without waiting. Yields None where it cannot (the caller then waits on
    the futures as for any `submit` backend)."""

    def driven(self) -> AbstractContextManager[Any]:
        ...
