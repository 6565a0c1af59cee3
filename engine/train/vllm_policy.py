"""The loop's policy on vLLM: one engine for every iteration, new weights reloaded into it.

WHY: starting a vLLM engine costs minutes (weights, CUDA graphs, KV cache); an iterated loop
(engine.loop) trains a new policy folder each iteration and searches with it next. The
first `load` starts the engine; a later one with another folder reloads the weights into the same
engine (`VLLMGenerator.reload`: `reload_weights(weights_path=...)`, prefix cache reset) and checks
the engine now answers differently: the greedy completion and the log-probs of a fixed probe before
vs after. A reload that leaves them unchanged is an error (the old weights would be searched again
and the loop would look as if training did nothing); a rebuild fallback is logged, never silent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.llm.base import GeneratorError, SampleRequest, SamplingParams

PROBE_PROMPT = [
    {"role": "system", "content": "You are an agent that completes tasks in an environment."},
    {"role": "user", "content": "TASK: craft a wooden pickaxe. OBSERVATION: You have 1 oak log."},
]
PROBE_TEXT = "THOUGHT: I need planks first.\nACTION: craft 4 oak planks using 1 oak log"


def probe(generator: Any) -> tuple[str, float | None, float | None]:
    """(greedy text, its log-prob, teacher-forced log-prob of PROBE_TEXT): what changes with the weights."""
    (c,) = generator.sample([SampleRequest(PROBE_PROMPT, 1, SamplingParams(temperature=0.0, max_tokens=24, seed=0))])[0]
    (scored,) = generator.logprobs([PROBE_PROMPT], [PROBE_TEXT])
    return c.text, c.logprob, scored


def _changed(before: tuple, after: tuple, eps: float = 1e-6) -> bool:
    if before[0] != after[0]:
        return True
    return any(a is not None and b is not None and abs(a - b) > eps for a, b in zip(before[1:], after[1:], strict=True))


class VLLMPolicy:
    """`load(folder) -> Generator` for `run_loop` with a `vllm:` model (see the module docstring)."""

    def __init__(self, log: Callable[[str], None] = print, make: Callable[[Path], Any] | None = None) -> None:
        self.log = log
        self._make = make
        self.generator: Any = None
        self.path: Path | None = None
        self.reloads: list[str] = []  # "in-place" | "rebuilt", one per new folder

    def _start(self, path: Path) -> Any:
        if self._make is not None:
            return self._make(path)
        from engine.llm.vllm_backend import VLLMGenerator

        return VLLMGenerator(path, name=f"vllm:{path}")

    def __call__(self, folder: str | Path) -> Any:
        path = Path(folder).resolve()
        if self.generator is None:
            self.generator, self.path = self._start(path), path
            self.log(f"vLLM: engine started on {path}")
            return self.generator
        if path == self.path:
            return self.generator
        before = probe(self.generator)
        how = self.generator.reload(path)
        after = probe(self.generator)
        self.path = path
        self.reloads.append(how)
        if how != "in-place":
            self.log(f"WARNING vLLM: the weights of {path} could not be reloaded in place; the engine was "
                     f"REBUILT (a full start)")
        if not _changed(before, after):
            raise GeneratorError(f"vLLM: after loading {path} ({how}) the engine's outputs are unchanged (greedy "
                                 f"probe and its log-probs identical): it still serves the old weights")
        self.log(f"vLLM: weights of {path} loaded {how}, prefix cache reset; probe log-prob "
                 f"{_fmt(before[2])} -> {_fmt(after[2])}, greedy text {'changed' if before[0] != after[0] else 'same'}")
        return self.generator


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
