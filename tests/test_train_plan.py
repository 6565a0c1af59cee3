"""Training sized to its data (engine.train.presets): a preset's steps follow the rows it trains on
(epochs, not a fixed step count), counted as the HF Trainer counts them, and the plan a launch shows
names the pairs / samples, the rows they make and the steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pairs import add, new_tree

from engine.datasets.distill import best_path_samples
from engine.datasets.samples import TreeRef
from engine.store import Store
from engine.train.dpo import DPOTrainConfig
from engine.train.presets import MIN_ROWS, PRESETS, job_config, planned_steps, train_plan
from engine.train.sft import SFTTrainConfig
from engine.tree_nodes import Simulation


@pytest.mark.parametrize(("rows", "batch", "accum", "epochs", "steps"), [
    (0, 8, 1, 1.0, 0), (1, 8, 1, 1.0, 1), (8, 8, 1, 1.0, 1), (9, 8, 1, 1.0, 2), (100, 8, 1, 3.0, 39),
    (100, 4, 2, 1.0, 13), (10, 4, 1, 0.5, 2), (7, 4, 1, 0.5, 1)])
def test_steps_follow_the_rows(rows: int, batch: int, accum: int, epochs: float, steps: int) -> None:
    assert planned_steps(rows, SFTTrainConfig(batch_size=batch, grad_accum=accum, epochs=epochs)) == steps


def test_each_process_steps_through_its_share_of_the_rows() -> None:
    """ddp / fsdp on G GPUs: each of the G processes sees rows / G (the plan shown before Launch said G times
    the steps)."""
    train = SFTTrainConfig(batch_size=4, grad_accum=1, epochs=1.0)
    assert [planned_steps(100, train, processes=g) for g in (1, 2, 4)] == [25, 13, 7]
    assert planned_steps(3, train, processes=8) == 1


def test_max_steps_when_set_wins() -> None:
    assert planned_steps(1000, DPOTrainConfig(max_steps=12)) == 12


def test_no_preset_fixes_the_step_count() -> None:
    for name, preset in PRESETS.items():
        assert "max_steps" not in preset.train, name
        assert preset.train.get("epochs", 1.0) > 0


def test_a_plan_counts_samples_rows_and_steps(tmp_path: Path) -> None:
    tree = new_tree()
    a = add(tree, 0, "right", N=2, value_sum=2.0)
    b = add(tree, a, "right", N=1, value_sum=1.0, reward=1.0, terminal="success")
    tree.root.N = 2
    tree.simulations = [Simulation((a, b), 1.0)]
    with Store(tmp_path / "o.db") as store:
        run_id = store.create_run("r", "line", "scripted", {}, [tree.task])
        samples = best_path_samples(TreeRef(tree=tree, run_id=run_id, env_description="d"))
        store.save_samples(samples)
        kind, config = job_config("rft", "cpu-quick", "tiny", include_pending=True)
        config["train"]["kinds"] = ["exit"]
        plan = train_plan(store, kind, config)
    assert (plan.items, plan.rows) == (1, 2)  # one trajectory, two trained turns: two step rows
    assert plan.epochs == 0.5 and plan.batch == 4 and plan.steps == 1
    assert plan.too_small and MIN_ROWS > 2
