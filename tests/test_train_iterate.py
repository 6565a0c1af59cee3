"""The iteration loops end to end: search -> data -> training -> evaluation, every step recorded.

Search and evaluation use the scripted generator on the line env (fast, and it solves tasks so
there is data); training uses a real tiny model folder, so the DPO/SFT steps are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doubles import LineEnv, ScriptedGenerator
from tiny_model_fixture import build_tiny_model

from engine.config import ConfigError
from engine.store import Store
from engine.train.common import read_train_meta
from engine.train.iterate import IterateConfig, run_loop

TRAIN = {"max_steps": 2, "batch_size": 4, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
         "num_threads": 1}


def _config(tmp_path: Path, method: str, model: Path) -> IterateConfig:
    return IterateConfig(
        method=method, model=str(model), env="line", iterations=2, tasks_per_iteration=3, eval_split="train",
        eval_tasks="0:3", output_root=str(tmp_path / "loop"), name=f"loop-{method}",
        search={"simulations": 6, "k": 3, "depth_limit": 4, "max_tokens": 32},
        dpo=TRAIN, sft=TRAIN, eval={"mode": "sampled", "seeds": [0, 1], "max_steps": 4, "bootstrap": 100},
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-loop"))


@pytest.mark.parametrize("method", ["agentq", "agentr"])
def test_a_loop_records_runs_models_and_scores(tmp_path: Path, model: Path, method: str) -> None:
    loaded: list[Path] = []

    def load(path: Path) -> ScriptedGenerator:
        loaded.append(Path(path))
        return ScriptedGenerator(p_right=0.6)

    with Store(tmp_path / "o.db") as store:
        loop_id = run_loop(store, _config(tmp_path, method, model), make_env=lambda: LineEnv(6), load=load)
        rows = store.iterations(loop_id)
        assert [r["idx"] for r in rows] == [0, 1, 2]
        assert rows[0]["model"] == str(model) and rows[0]["eval"]["success"]["n"] == 3
        first, second = rows[1], rows[2]
        assert first["parent"] == str(model) and second["parent"] == first["model"]  # pi_ref <- current policy
        assert first["model"] == str((tmp_path / "loop" / "iter-1").resolve())
        for r in (first, second):
            assert store.run(r["run_id"]).model == "scripted" and len(r["tasks"]) == 3
            assert r["eval"]["eval_id"] in {e["id"] for e in store.evaluations(model=r["model"])}
            meta = read_train_meta(r["model"])
            assert meta is not None and meta["base_model"] == r["parent"]
            record = store.model_record(r["model"])
            assert record.kind == method and record.data_ids == meta["data_ids"]
        if method == "agentq":
            assert first["pairs"] > 0 and len(read_train_meta(first["model"])["data_ids"]) == first["pairs"]
            # the scripted generator's log-probs (and token counts) are not the model's: all re-scored
            assert first["train"]["ref_stored"] == 0 and first["train"]["ref_computed"] == first["pairs"]
        else:
            assert first["revision_share"] == 0.25 and second["revision_share"] == 0.5
            assert first["revisions"] > 0 and first["samples"] >= first["revisions"]
        # the searches and evaluations ran with the policy of their iteration
        assert loaded[0] == model and Path(first["model"]) in loaded and Path(second["model"]) in loaded


def test_loop_config_is_checked_before_running(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="method"):
        IterateConfig(method="nope")
    with pytest.raises(ConfigError, match="unknown field"):
        IterateConfig.from_dict({"iterations": 1, "bogus": 2})
    with pytest.raises(ConfigError, match="lerning_rate"):
        IterateConfig(dpo={"lerning_rate": 1.0})
    with pytest.raises(ConfigError, match="simulations"):
        IterateConfig(search={"simulations": 0})


def test_next_iteration_continues_a_loop_under_its_id_from_its_newest_model(tmp_path: Path, model: Path) -> None:
    """The dashboard's "Next iteration": one more iteration of the same loop, numbered after its last, with
    the loop's own settings and its newest model as the policy; the base is not evaluated again."""
    from dataclasses import replace

    from engine.submit import next_iteration_config

    def load(path: Path) -> ScriptedGenerator:
        return ScriptedGenerator(p_right=0.6)

    with Store(tmp_path / "o.db") as store:
        loop_id = run_loop(store, replace(_config(tmp_path, "agentq", model), iterations=1),
                           make_env=lambda: LineEnv(6), load=load)
        first = store.iterations(loop_id)[-1]
        cfg = next_iteration_config(store, loop_id)
        assert cfg["model"] == first["model"] and cfg["first_iteration"] == 2 and cfg["evaluate_base"] is False
        again = run_loop(store, IterateConfig.from_dict(cfg), make_env=lambda: LineEnv(6), load=load)
        assert again == loop_id
        rows = store.iterations(loop_id)
        assert [r["idx"] for r in rows] == [0, 1, 2]
        assert rows[2]["parent"] == first["model"] and rows[2]["model"] == str((tmp_path / "loop" / "iter-2").resolve())
        assert rows[2]["tasks"] != first["tasks"] or len(rows[2]["tasks"]) == 6  # a new batch of train tasks
