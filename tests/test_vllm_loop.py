"""The loop on vLLM, against the strict stand-in `vllm` (tests/vllm_double.py): one
engine for the whole loop, each trained policy reloaded into it, the outputs checked to change."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
import vllm_double
from doubles import LineEnv, action_text
from tiny_model_fixture import build_tiny_model

from engine.llm.base import GeneratorError
from engine.loop import IterateConfig, run_loop
from engine.store import Store
from engine.train.vllm_policy import VLLMPolicy, probe


def _weights_shift(folder: str) -> float:
    digest = hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).digest()
    return digest[0] / 2560.0  # what the stand-in's log-probs depend on: the weights it serves


class WeightsLLM(vllm_double.LLM):
    """The strict stand-in `vllm.LLM` (tests/vllm_double.py) whose answers depend on the weights it
    has loaded: actor prompts get parseable line-env actions, critic prompts a BEST pick, and the
    scripted token's logit moves with the weights (so log-probs do)."""

    instances: ClassVar[list[vllm_double.LLM]] = []
    stale: ClassVar[bool] = False  # reload_weights accepted but the old weights kept
    fail_rpc: ClassVar[bool] = False

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.shift = _weights_shift(model)

    def reply(self, prompt_text: str, params: Any, index: int) -> str:
        if "CANDIDATES:" in prompt_text:
            listed = re.findall(r"^\[(\d+)\] ACTION: (\S+)", prompt_text, re.MULTILINE)
            best = next((k for k, c in listed if c == "right"), "1")
            return f"REASON: right approaches the goal.\nBEST: {best}"
        seed = getattr(params, "seed", None)
        rng = random.Random(f"{seed}-{self.shift}-{len(prompt_text)}-{index}")
        return action_text("right" if rng.random() < 0.6 else rng.choice(["left", "wait"]))

    def rpc(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        if method != "reload_weights" or set(kwargs) - {"weights_path"} or args:
            raise TypeError(f"no worker method {method}{args}{kwargs}")
        if WeightsLLM.fail_rpc:
            raise RuntimeError("worker failed in reload_weights")
        if not WeightsLLM.stale:
            self.shift = _weights_shift(kwargs["weights_path"])
        return None


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    import trl  # noqa: F401 - before the stand-in, which TRL's import would probe as a real vLLM

    WeightsLLM.stale, WeightsLLM.fail_rpc = False, False
    vllm_double.install(monkeypatch, WeightsLLM)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vllm-loop")
    return build_tiny_model(root / "base", seed=0), build_tiny_model(root / "trained", seed=1)


def test_a_new_policy_is_reloaded_into_the_same_engine_and_checked(fake_vllm, models) -> None:
    base, trained = models
    lines: list[str] = []
    load = VLLMPolicy(log=lines.append)
    gen = load(base)
    assert load(base) is gen and len(WeightsLLM.instances) == 1
    assert load(trained) is gen and len(WeightsLLM.instances) == 1  # the same engine, new weights
    llm = WeightsLLM.instances[0]
    rpc = [c for c in llm.calls if c[0] != "generate"]
    assert rpc == [("rpc", "reload_weights", (), {"weights_path": str(trained.resolve())}), ("reset_prefix_cache",)]
    assert load.reloads == ["in-place"] and gen.name == f"vllm:{trained.resolve()}"
    assert any("loaded in-place, prefix cache reset; probe log-prob" in line for line in lines)


def test_a_reload_that_changes_nothing_is_an_error(fake_vllm, models) -> None:
    base, trained = models
    load = VLLMPolicy(log=lambda _m: None)
    load(base)
    WeightsLLM.stale = True
    with pytest.raises(GeneratorError, match="outputs are unchanged"):
        load(trained)


def test_a_rebuild_fallback_is_logged(fake_vllm, models) -> None:
    base, trained = models
    lines: list[str] = []
    load = VLLMPolicy(log=lines.append)
    load(base)
    WeightsLLM.fail_rpc = True
    load(trained)
    assert load.reloads == ["rebuilt"] and len(WeightsLLM.instances) == 2
    assert any(line.startswith("WARNING vLLM") and "REBUILT" in line for line in lines)


def test_release_sleeps_the_engine_and_the_same_folder_is_written_back(fake_vllm, models) -> None:
    base, _ = models
    lines: list[str] = []
    load = VLLMPolicy(log=lines.append)
    gen = load(base)
    llm = WeightsLLM.instances[0]
    assert llm.kwargs["enable_sleep_mode"] is True  # on by default for the loop's engine
    before = probe(gen)
    load.release()
    load.release()  # asleep already: nothing more
    assert [c for c in llm.calls if c[0] == "sleep"] == [("sleep", 2)] and gen.asleep == 2
    assert any(line.startswith("vLLM: engine asleep (level 2") for line in lines)
    assert load(base) is gen and gen.asleep is None
    # Level 2 dropped the weights: the same folder is read again, and answers the probe as before.
    assert [c for c in llm.calls if c[0] in ("wake_up", "rpc")] == [
        ("wake_up", None), ("rpc", "reload_weights", (), {"weights_path": str(base.resolve())})]
    assert probe(gen) == pytest.approx(before)
    assert any(f"engine awake, weights of {base.resolve()} restored in-place" in line for line in lines)


def test_after_a_sleep_a_new_folder_must_change_the_answers_of_before_it(fake_vllm, models) -> None:
    base, trained = models
    load = VLLMPolicy(log=lambda _m: None)
    load(base)
    load.release()
    assert load(trained).name == f"vllm:{trained.resolve()}" and load.reloads == ["in-place"]
    load.release()
    WeightsLLM.stale = True  # reload_weights accepted, the old weights written back
    with pytest.raises(GeneratorError, match="outputs are unchanged"):
        load(base)


def test_weights_left_unwritten_after_a_sleep_are_an_error(fake_vllm, models, monkeypatch) -> None:
    base, _ = models
    load = VLLMPolicy(log=lambda _m: None)
    gen = load(base)
    load.release()
    monkeypatch.setattr(gen, "reload", lambda path: "in-place")  # says it reloaded, wrote nothing
    with pytest.raises(GeneratorError, match="not restored"):
        load(base)


def test_sleep_0_keeps_the_engine_resident_and_says_so(fake_vllm, models) -> None:
    base, _ = models
    lines: list[str] = []
    load = VLLMPolicy(log=lines.append, options={"sleep": False, "max_model_len": 512})
    gen = load(base)
    llm = WeightsLLM.instances[0]
    assert "enable_sleep_mode" not in llm.kwargs and llm.kwargs["max_model_len"] == 512
    assert gen.name == f"vllm:{base.resolve()}?sleep=0&max_model_len=512"
    load.release()
    assert gen.asleep is None and not [c for c in llm.calls if c[0] == "sleep"]
    assert any(line.startswith("WARNING vLLM: sleep=0") for line in lines)


class FakeCuda:
    """torch.cuda's memory figures, as engine.gpu_memory reads them, on a CPU machine."""

    def __init__(self) -> None:
        self.resets = 0

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1

    def max_memory_allocated(self) -> int:
        return self.resets * 2**30  # a different figure for each phase

    def mem_get_info(self) -> tuple[int, int]:
        return 100 * 2**30, 141 * 2**30

    def empty_cache(self) -> None:
        pass


def test_iterate_with_a_vllm_spec_searches_trains_and_reloads(fake_vllm, models, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.gpu_memory

    cuda = FakeCuda()
    monkeypatch.setattr(engine.gpu_memory, "_cuda", lambda: cuda)
    base, _ = models
    train = {"max_steps": 2, "batch_size": 4, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
             "num_threads": 1}
    config = IterateConfig(
        method="agentq", model=f"vllm:{base}", env="line", iterations=1, tasks_per_iteration=3, include_pending=True,
        eval_split="train", eval_tasks="0:2", output_root=str(tmp_path / "loop"), name="loop-vllm",
        search={"simulations": 6, "k": 3, "depth_limit": 4, "max_tokens": 32}, dpo=train,
        eval={"mode": "sampled", "seeds": [0], "max_steps": 4, "bootstrap": 100},
    )
    from engine.progress import MemoryReporter

    reporter = MemoryReporter()
    with Store(tmp_path / "o.db") as store:
        loop_id = run_loop(store, config, reporter=reporter, make_env=lambda: LineEnv(6))
        store_base, first = store.iterations(loop_id)[:2]
        assert first["pairs"] > 0 and "model" in first and "eval" in first, first
        assert 0 < first["served_bf16_share"] <= 1  # a vllm: policy is served in bf16: the loop records what it sees
        assert store.run(first["run_id"]).model == f"vllm:{base.resolve()}"
    assert len(WeightsLLM.instances) == 1  # one engine for the base evaluation, the search and the new policy
    calls = [c[:2] for c in WeightsLLM.instances[0].calls if c[0] != "reset_prefix_cache"]
    # Searched, asleep while training (no request in between: the double refuses them), woken, the
    # trained folder written in, evaluated.
    at = calls.index(("sleep", 2))
    assert ("generate",) in [c[:1] for c in calls[:at]] and calls[at + 1] == ("wake_up", None)
    assert calls[at + 2] == ("rpc", "reload_weights") and calls[-1][0] == "generate"
    rpc = [c for c in WeightsLLM.instances[0].calls if c[0] == "rpc"]
    assert rpc == [("rpc", "reload_weights", (), {"weights_path": first["model"]})]
    assert any("loaded in-place" in line for line in reporter.lines)
    assert set(first["gpu_memory"]) == {"search", "data", "train", "evaluate"}, first
    # One reading per phase, each from its own start (the fake's peak counts the resets so far).
    assert store_base["gpu_memory"] == {"evaluate": {"peak_gib": 1.0, "device_used_gib": 41.0}}
    assert [first["gpu_memory"][p]["peak_gib"] for p in ("search", "data", "train", "evaluate")] == [2.0, 3.0, 4.0, 5.0]
    assert any(line.startswith("iteration 1: train: peak GPU memory") for line in reporter.lines)
