"""bench/common.py: the loop benches' table compares arms on the same tasks with paired intervals."""

from __future__ import annotations

from pathlib import Path

import pytest
from doubles import LineEnv, ScriptedGenerator

from bench.common import Table, by_task, ordering, stored_episodes
from engine.evaluate import EvalConfig, evaluate_and_store
from engine.store import Store

TASKS = LineEnv(8).tasks("train")


def test_table_gives_the_paired_gain_of_a_better_policy_on_the_same_tasks(capsys) -> None:
    config = EvalConfig(mode="sampled", seeds=(0, 1, 2), max_steps=8)
    table = Table("line", {"tasks": len(TASKS)}, bootstrap=500)
    table.evaluate("weak", ScriptedGenerator(p_right=0.3), LineEnv, TASKS, config)
    table.evaluate("strong", ScriptedGenerator(p_right=1.0), LineEnv, TASKS, config)
    same = table.diff("weak", "weak", "success")
    assert (same["low"], same["high"]) == (0.0, 0.0)
    diffs = table.print_diffs([("weak", "strong")])
    gain = diffs[("weak", "strong")]["success"]
    strong, weak = (table.arms[n].metrics["success"]["mean"] for n in ("strong", "weak"))
    assert gain["mean"] == pytest.approx(strong - weak) and gain["low"] > 0 and gain["n"] == len(TASKS)
    assert "strong - weak: success +" in capsys.readouterr().out
    assert ordering(table, ["weak", "strong"]) == "strong > weak"
    table.annotate("strong", "(+ 3 s training on 2 rows)")  # known only after the arm was printed
    assert table.arms["strong"].note == "(+ 3 s training on 2 rows)"
    assert "  strong                 (+ 3 s training on 2 rows)" in capsys.readouterr().out
    half = {t.id for t in TASKS[:4]}  # a subset of the tasks (`--select-fit`'s val alone): paired over those only
    part = table.print_diffs([("weak", "strong")], only=half, label="half")[("weak", "strong")]["success"]
    assert part["n"] == 4 and "paired differences on half" in capsys.readouterr().out
    kept = [e for e in table.arms["strong"].episodes if e.task_id in half]
    assert part["mean"] == pytest.approx(sum(e.success for e in kept) / len(kept) - sum(
        e.success for e in table.arms["weak"].episodes if e.task_id in half) / len(kept))


def test_stored_episodes_score_like_the_live_ones(tmp_path: Path) -> None:
    config = EvalConfig(mode="greedy", max_steps=6)
    with Store(tmp_path / "o.db") as store:
        result = evaluate_and_store(store, ScriptedGenerator(p_right=0.6), "line", "train", TASKS, config,
                                    make_env=LineEnv)
        rows = stored_episodes(store, result.eval_id)
    for metric in ("success", "progress", "loop_rate"):
        assert by_task(rows, metric) == by_task(result.episodes, metric)
    with pytest.raises(KeyError), Store(tmp_path / "o.db") as store:
        stored_episodes(store, "nope")


def test_tiny_policy_counts_successes_by_the_goals_recipe_depth() -> None:
    from bench.tiny_policy import by_depth
    from engine.envs.textcraft import TextCraftEnv
    from engine.evaluate import Episode

    tasks = TextCraftEnv().tasks("val")
    shallow = [t for t in tasks if t.meta["depth"] == 1][:2]
    deep = [t for t in tasks if t.meta["depth"] == 2][:1]
    episodes = [Episode(task_id=shallow[0].id, seed=0, success=True), Episode(task_id=shallow[1].id, seed=0),
                Episode(task_id=deep[0].id, seed=0)]
    assert by_depth(episodes, tasks) == "1: 1/2, 2: 0/1"


def test_the_undrawn_fit_tasks_are_the_fit_tasks_a_bench_did_not_search() -> None:
    import random

    from bench.common import undrawn_fit
    from engine.envs.textcraft import TextCraftEnv

    env = TextCraftEnv()
    fit, val, test = env.tasks("fit"), env.tasks("val"), env.tasks("test")
    drawn = random.Random(0).sample(fit, 48)
    undrawn = undrawn_fit(drawn)
    ids = {t.id for t in undrawn}
    assert len(undrawn) == len(fit) - 48 and not ids & {t.id for t in drawn}
    assert not ids & {t.id for t in val + test}  # a selection set never holds a held-out task


def test_the_unseen_pool_is_the_fit_tasks_a_held_out_build_never_trained_on() -> None:
    from dataclasses import replace

    from bench.common import fit_pool, undrawn_fit
    from engine.envs.textcraft import TextCraftEnv
    from engine.llm.tiny_config import TinyConfig
    from engine.llm.tiny_data import fit_tasks

    env = TextCraftEnv()
    assert fit_pool(0) == env.tasks("fit")
    unseen = fit_pool(2)
    trained = {t.id for t in fit_tasks(replace(TinyConfig(), val_every=2))}  # the rows of a val_every=2 build
    ids = {t.id for t in unseen}
    assert ids and not ids & trained and not ids & {t.id for t in env.tasks("val") + env.tasks("test")}
    assert len(trained) + len(unseen) + len(env.tasks("val")) == len(env.tasks("train"))  # every train task is one
    assert {t.id for t in undrawn_fit(unseen[:10], 2)} == ids - {t.id for t in unseen[:10]}
