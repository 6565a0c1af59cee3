"""The loop's policy on vLLM: one engine for every iteration, new weights reloaded into it, the
engine asleep while the loop trains.

WHY one engine: starting a vLLM engine costs minutes (weights, CUDA graphs, KV cache); an iterated
loop (engine.loop) trains a new policy folder each iteration and searches with it next. The
first `load` starts the engine; a later one with another folder reloads the weights into the same
engine (`VLLMGenerator.reload`: `reload_weights(weights_path=...)`, prefix cache reset) and checks
the engine now answers differently: the greedy completion and the log-probs of a fixed probe before
vs after. A reload that leaves them unchanged is an error (the old weights would be searched again
and the loop would look as if training did nothing); a rebuild fallback is logged, never silent.

WHY sleep: the loop trains in this process on the GPU the engine holds (gpu_memory_utilization of
it: 0.85 by default, ~21 GB of an H200 left to DPO). Before each training phase `release()` puts
the engine to sleep at level 2 (weights and KV cache dropped; sleep mode is on by default here, off
with the spec option sleep=0), and the next `load` wakes it and writes a model folder into it. Level
2, not 1: after training the next folder served is read from disk whatever the level (the candidate
for the gate and the evaluation, or the current policy again), so level 1's copy of the weights in
host RAM, made while the trainer needs that RAM, would be thrown away; the one case it would save
(the same folder served again) costs one read of that folder, checked against the probe taken
before the sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.gpu_memory import device_used_gib, free_cached
from engine.llm.base import GeneratorError, SampleRequest, SamplingParams

PROBE_PROMPT = [
    {"role": "system", "content": "You are an agent that completes tasks in an environment."},
    {"role": "user", "content": "TASK: craft a wooden pickaxe. OBSERVATION: You have 1 oak log."},
]
PROBE_TEXT = "THOUGHT: I need planks first.\nACTION: craft 4 oak planks using 1 oak log"
SLEEP_LEVEL = 2  # see the module docstring
# The same folder written back after a level-2 sleep must score the probe as before it, up to kernel
# noise (bf16 sums over ~25 tokens: ~1e-2 nats); weights left as garbage miss by tens of nats.
RESTORE_TOLERANCE = 0.1


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
    """`load(folder) -> Generator` for `run_loop` with a `vllm:` model (see the module docstring);
    `options`: the spec's options (engine.llm.registry.VLLM_SPEC_OPTIONS)."""

    def __init__(self, log: Callable[[str], None] = print, make: Callable[[Path], Any] | None = None,
                 options: dict[str, Any] | None = None) -> None:
        self.log = log
        self._make = make
        self.options = dict(options or {})
        self.sleeps = bool(self.options.get("sleep", True))  # on unless the spec says sleep=0
        self.generator: Any = None
        self.path: Path | None = None
        self.reloads: list[str] = []  # "in-place" | "rebuilt", one per folder written into the engine
        self._before: tuple[str, float | None, float | None] | None = None  # the probe before the sleep

    def _start(self, path: Path) -> Any:
        if self._make is not None:
            return self._make(path)
        from engine.llm.registry import vllm_generator_kwargs, vllm_query
        from engine.llm.vllm_backend import VLLMGenerator

        kwargs = {**vllm_generator_kwargs(self.options), "sleep_mode": self.sleeps}
        return VLLMGenerator(path, name=f"vllm:{path}{vllm_query(self.options)}", **kwargs)

    def release(self) -> None:
        """Before training in this process: the engine sleeps (level 2), its GPU memory freed; a no-op
        before the engine starts or while it sleeps. With sleep=0 it stays, and the log says so."""
        gen = self.generator
        if gen is None or getattr(gen, "asleep", None) is not None:
            return
        if not self.sleeps:
            self.log("WARNING vLLM: sleep=0: the engine keeps its GPU memory while the loop trains")
            return
        self._before = probe(gen)
        used = device_used_gib()
        gen.sleep(SLEEP_LEVEL)
        self.log(f"vLLM: engine asleep (level {SLEEP_LEVEL}: weights and KV cache freed) for training; device memory "
                 f"in use {_gib(used)} -> {_gib(device_used_gib())}")

    def __call__(self, folder: str | Path) -> Any:
        path = Path(folder).resolve()
        if self.generator is None:
            self.generator, self.path = self._start(path), path
            self.log(f"vLLM: engine started on {path}")
            return self.generator
        if getattr(self.generator, "asleep", None) is not None:
            return self._wake(path)
        if path == self.path:
            return self.generator
        return self._reload(path, probe(self.generator))

    def _wake(self, path: Path) -> Any:
        """Wake the engine and write `path` into it: a level-2 sleep dropped the weights, so even the
        folder it served before is read again, and must answer the probe as it did then."""
        free_cached()  # the trainer's cached blocks, which the engine's process cannot use
        self.generator.wake_up()
        # release() probes before every sleep; an engine put to sleep elsewhere has nothing to compare.
        before, self._before = self._before or ("", None, None), None
        if path != self.path:
            return self._reload(path, before)
        how = self.generator.reload(path)
        self.reloads.append(how)
        after = probe(self.generator)
        if before[2] is not None and after[2] is not None and abs(after[2] - before[2]) > RESTORE_TOLERANCE:
            raise GeneratorError(f"vLLM: after waking, the weights of {path} ({how}) score the probe {after[2]:.4f}, "
                                 f"not {before[2]:.4f} as before the sleep: they were not restored")
        self.log(f"vLLM: engine awake, weights of {path} restored {how}; probe log-prob {_fmt(before[2])} -> "
                 f"{_fmt(after[2])}; device memory in use {_gib(device_used_gib())}")
        return self.generator

    def _reload(self, path: Path, before: tuple[str, float | None, float | None]) -> Any:
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


def _gib(value: float | None) -> str:
    return "n/a (no CUDA here)" if value is None else f"{value:.2f} GiB"
