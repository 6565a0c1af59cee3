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
from engine.train.vllm_policy import VLLMPolicy


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


def test_iterate_with_a_vllm_spec_searches_trains_and_reloads(fake_vllm, models, tmp_path: Path) -> None:
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
        first = store.iterations(loop_id)[1]
        assert first["pairs"] > 0 and "model" in first and "eval" in first, first
        assert 0 < first["served_bf16_share"] <= 1  # a vllm: policy is served in bf16: the loop records what it sees
        assert store.run(first["run_id"]).model == f"vllm:{base.resolve()}"
    assert len(WeightsLLM.instances) == 1  # one engine for the base evaluation, the search and the new policy
    rpc = [c for c in WeightsLLM.instances[0].calls if c[0] == "rpc"]
    assert rpc == [("rpc", "reload_weights", (), {"weights_path": first["model"]})]
    assert any("loaded in-place" in line for line in reporter.lines)
