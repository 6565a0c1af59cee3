"""The iteration loops end to end: search -> data -> training -> evaluation, every step recorded.

Search and evaluation use the scripted generator on the line env (fast, and it solves tasks so
there is data); training uses a real tiny model folder, so the DPO/SFT steps are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doubles import LineEnv, ScriptedGenerator, SnapshotLineEnv
from tiny_model_fixture import build_tiny_model

from engine.config import ConfigError
from engine.loop import IterateConfig, run_loop
from engine.store import Store
from engine.train.common import read_train_meta

TRAIN = {"max_steps": 2, "batch_size": 4, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
         "num_threads": 1}


def _config(tmp_path: Path, method: str, model: Path) -> IterateConfig:
    return IterateConfig(
        method=method, model=str(model), env="line", iterations=2, tasks_per_iteration=3, eval_split="train",
        eval_tasks="0:3", output_root=str(tmp_path / "loop"), name=f"loop-{method}", include_pending=True, gate_split="",
        search={"simulations": 6, "k": 3, "depth_limit": 4, "max_tokens": 32},
        dpo=TRAIN, sft=TRAIN, eval={"mode": "sampled", "seeds": [0, 1], "max_steps": 4, "bootstrap": 100},
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-loop"))


@pytest.mark.parametrize("method", ["agentq", "agentr", "exit", "exit-mcts", "exit-sampled", "visits"])
@pytest.mark.slow
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
        assert first["parent"] == str(model) and second["searched_with"] == first["policy"] == first["model"]
        if method in ("exit", "exit-mcts", "exit-sampled", "visits"):  # accumulation: every candidate from the base, on every iteration's rows
            assert second["parent"] == str(model) and second["samples"] >= first["samples"]
        else:
            assert second["parent"] == first["model"]  # pi_ref <- current policy
        assert first["model"] == str((tmp_path / "loop" / "iter-1").resolve())
        for r in (first, second):
            assert store.run(r["run_id"]).model == "scripted" and len(r["tasks"]) == 3
            if method in ("exit-mcts", "exit-sampled"):  # the run holds the tasks greedy failed, each played
                play = r["play"]
                assert play["tasks"] == 3 and play["played"] == len(store.tree_ids(r["run_id"])) == 3 - play["greedy_solved"]
                assert r["solved_in_search"] >= play["solved"]
            if method == "exit-sampled":  # 8 sampled episodes of each: one Monte Carlo tree per task
                assert r["play"]["simulations"] == 8 * r["play"]["played"]
                assert all(store.load_tree(t).root.N == 8 for t, _ in store.tree_ids(r["run_id"]))
            assert r["eval"]["eval_id"] in {e["id"] for e in store.evaluations(model=r["model"])}
            meta = read_train_meta(r["model"])
            assert meta is not None and meta["base_model"] == r["parent"]
            record = store.model_record(r["model"])
            assert record.kind == method and record.data_ids == meta["data_ids"]
        if method == "agentq":
            assert first["pairs"] > 0 and len(read_train_meta(first["model"])["data_ids"]) == first["pairs"]
            # the scripted generator's log-probs (and token counts) are not the model's: all re-scored
            assert first["train"]["ref_stored"] == 0 and first["train"]["ref_computed"] == first["pairs"]
        elif method == "agentr":
            assert first["revision_share"] == 0.25 and second["revision_share"] == 0.5
            assert first["revisions"] > 0 and first["samples"] >= first["revisions"]
        else:  # expert iteration / visit counts: the search's own rows, each trained on
            samples = store.samples(run_id=first["run_id"], kind=["exit" if method.startswith("exit") else method])
            assert samples and first["samples"] == len(samples) == len(read_train_meta(first["model"])["data_ids"])
            if method == "exit-mcts":  # one row per episode MCTS solved
                assert len(samples) == first["play"]["solved"] > 0
            if method in ("exit", "exit-sampled"):
                assert first["solved_trees"] >= len(samples) > 0  # one shortest success per solved tree
        # what each iteration trained on, by curation state (nobody curated: all uncurated, included)
        assert first["curation"] == {"final": 0, "uncurated_used": first.get("pairs", first.get("samples")),
                                     "uncurated_left_out": 0} or method == "agentr"
        # the searches and evaluations ran with the policy of their iteration
        assert loaded[0] == model and Path(first["model"]) in loaded and Path(second["model"]) in loaded


def test_the_loop_trains_only_on_curated_rows_unless_told_otherwise(tmp_path: Path, model: Path) -> None:
    """The curation gate: without include_pending an iteration whose rows nobody curated trains nothing
    and says why, with the counts; rows a curator approved are trained on; with include_pending the
    uncurated ones join them, and the record says how many of each."""
    from dataclasses import replace

    def load(path: Path) -> ScriptedGenerator:
        return ScriptedGenerator(p_right=0.6)

    with Store(tmp_path / "o.db") as store:
        config = replace(_config(tmp_path, "exit", model), iterations=1, include_pending=False, evaluate_base=False)
        loop_id = run_loop(store, config, make_env=lambda: LineEnv(6), load=load)
        [record] = store.iterations(loop_id)
        uncurated = record["curation"]["uncurated_left_out"]
        assert uncurated > 0 and record["curation"]["final"] == 0 and record["samples"] == 0
        assert "no curated search rows" in record["skipped"] and f"{uncurated} uncurated" in record["skipped"]
        assert record["model"] == str(model)  # the policy is unchanged
        # A curator approves one row of that run: a second loop over the same run's data would use it.
        from engine.loop import curated
        from engine.train.sft import labelled_samples

        row = store.samples(run_id=record["run_id"], kind=["exit"])[0]
        store.set_sample_status(row.id, "approved", "ann", row.version)
        train = config.sft_config()
        rows, gate = curated(store, train, [record["run_id"]], labelled_samples)
        assert [r.id for r in rows] == [row.id] and gate == {"final": 1, "uncurated_used": 0,
                                                             "uncurated_left_out": uncurated - 1}
        rows, gate = curated(store, replace(train, include_pending=True), [record["run_id"]], labelled_samples)
        assert len(rows) == uncurated and gate == {"final": 1, "uncurated_used": uncurated - 1, "uncurated_left_out": 0}


def _one_sampled_iteration(store: Store, tmp_path: Path, model: Path, env: type, **changes: int) -> dict:
    """One exit-sampled iteration on 6 line tasks (scripted policy, real training), its record returned."""
    from dataclasses import replace

    config = replace(_config(tmp_path, "exit-sampled", model), iterations=1, evaluate_base=False,
                     tasks_per_iteration=6, **changes)
    loop_id = run_loop(store, config, make_env=lambda: env(6), load=lambda path: ScriptedGenerator(p_right=0.6))
    [record] = store.iterations(loop_id)
    return record


@pytest.mark.slow
def test_corrections_join_the_rows_of_a_play_method(tmp_path: Path, model: Path) -> None:
    """exit-sampled with corrections: the greedy failures' failing steps, labelled with the played wins,
    are stored as correction rows of the iteration's run and trained on with its exit rows."""
    with Store(tmp_path / "o.db") as store:
        record = _one_sampled_iteration(store, tmp_path, model, SnapshotLineEnv, corrections=2)
        fixes = store.samples(run_id=record["run_id"], kind=["correction"])
        wins = store.samples(run_id=record["run_id"], kind=["exit"])
        assert record["corrections"] == len(fixes) > 0 and wins
        assert len({s.source["task_id"] for s in fixes}) * 2 >= len(fixes)  # at most 2 per greedy failure
        for s in fixes:  # the policy's own steps as context, the win's step trained
            assert not any(t.trains for t in s.turns[:-1]) and s.turns[-1].trains
            assert s.source["label_command"] == "right" and s.source["failed_command"] != "right"
        trained = set(read_train_meta(record["model"])["data_ids"])
        assert record["samples"] == len(trained) == len(fixes) + len(wins) and {s.id for s in fixes} <= trained


def test_corrections_are_offered_to_the_play_methods_only() -> None:
    assert IterateConfig(method="exit-sampled", corrections=3).sft_config().kinds == ("exit", "correction")
    assert IterateConfig(method="exit-sampled").sft_config().kinds == ("exit",)
    for bad in ({"method": "exit", "corrections": 3}, {"method": "exit-mcts", "corrections": -1}):
        with pytest.raises(ConfigError, match="corrections"):
            IterateConfig(**bad)


class RenamingLineEnv(SnapshotLineEnv):
    """The line env whose one entity name, "position", a renamer swaps for another word (SupportsRenaming)."""

    def renamer(self, rng):
        word = rng.choice(["spot", "place", "mark"])
        return lambda text: text.replace("position", word)


@pytest.mark.slow
def test_renamed_copies_join_the_trained_rows_and_not_the_stored_ones(tmp_path: Path, model: Path) -> None:
    with Store(tmp_path / "o.db") as store:
        record = _one_sampled_iteration(store, tmp_path, model, RenamingLineEnv, renamed=2)
        stored = store.samples(run_id=record["run_id"])
        trained = read_train_meta(record["model"])["data_ids"]
        assert record["samples"] == len(stored) > 0 and record["renamed"] == 2 * len(stored)
        assert len(trained) == len(set(trained)) == 3 * len(stored) and {s.id for s in stored} <= set(trained)
        assert all("position" in s.task.goal for s in stored)  # the store keeps the originals only


def test_renamed_copies_need_a_distilling_method_and_an_env_that_renames(tmp_path: Path) -> None:
    assert IterateConfig(method="exit-sampled", renamed=3).renamed == 3
    for bad in ({"method": "agentq", "renamed": 1}, {"method": "exit", "renamed": -1}):
        with pytest.raises(ConfigError, match="renamed"):
            IterateConfig(**bad)
    with Store(tmp_path / "o.db") as store, pytest.raises(ConfigError, match="cannot rename"):
        run_loop(store, IterateConfig(method="exit", env="line", renamed=1), make_env=lambda: LineEnv(3))


def test_the_default_method_is_expert_iteration() -> None:
    assert IterateConfig().method == "exit" and IterateConfig().include_pending is False
    assert IterateConfig().sft_config().kinds == ("exit",)


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

    from engine.jobs.submit import next_iteration_config

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
