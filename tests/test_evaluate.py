"""Evaluation: metrics, intervals, batching, recovery starts, MCTS at inference, storage."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest
from doubles import LineEnv, ScriptedGenerator, SnapshotLineEnv, action_text

from engine.actions import parse
from engine.config import ConfigError
from engine.evaluate import (
    Episode,
    EvalConfig,
    Start,
    bootstrap_ci,
    evaluate,
    evaluate_and_store,
    paired_bootstrap_diff,
    recovery_starts,
    repeats,
    run_episodes,
    summarize,
)
from engine.llm.base import Completion
from engine.prompts import HistoryStep
from engine.store import Store
from engine.tree_nodes import reroot

TASKS = LineEnv(6).tasks("train")


def test_repeats_count_immediate_repetitions_by_length() -> None:
    assert repeats(["a", "a", "a"], 1) == 2
    assert repeats(["a", "b", "a", "b", "a", "b"], 2) == 2
    assert repeats(["a", "b", "a", "b"], 1) == 0
    assert repeats(["a", "b", "c", "a", "b", "c"], 3) == 1
    assert repeats(["a", "b", "c", "a", "b"], 3) == 0
    assert repeats([], 2) == 0
    eps = [Episode("t1", 0, commands=["x", "y", "x", "y"]), Episode("t2", 0, commands=["x", "y", "z"])]
    m = summarize(eps, EvalConfig(loop_max_len=2, bootstrap=0))
    assert m["loops_by_length"]["2"] == {"episodes": 0.5, "mean_repeats": 0.5}
    assert m["loops_by_length"]["1"]["episodes"] == 0.0
    assert m["loop_rate"]["mean"] == 0.5


def test_bootstrap_intervals_resample_tasks_not_episodes() -> None:
    ten_seeds = {"a": [1.0] * 10, "b": [0.0] * 10}
    ci = bootstrap_ci(ten_seeds, 2000, 0.95)
    assert ci["mean"] == 0.5 and ci["n"] == 2 and ci["low"] == 0.0 and ci["high"] == 1.0
    many = {f"t{i}": [float(i % 2)] for i in range(200)}
    wide, narrow = bootstrap_ci({k: many[k] for k in list(many)[:20]}, 2000, 0.95), bootstrap_ci(many, 2000, 0.95)
    assert wide["low"] <= 0.5 <= wide["high"] and narrow["low"] <= 0.5 <= narrow["high"]
    assert narrow["high"] - narrow["low"] < wide["high"] - wide["low"]
    assert bootstrap_ci(many, 500, 0.9, seed=3) == bootstrap_ci(many, 500, 0.9, seed=3)


def test_paired_difference_of_identical_arms_is_exactly_zero() -> None:
    arm = {f"t{i}": [float(i % 3 == 0), float(i % 2)] for i in range(40)}
    assert paired_bootstrap_diff(arm, dict(arm), 2000, 0.95, seed=1) == {"mean": 0.0, "low": 0.0, "high": 0.0,
                                                                         "n": 40}


def test_paired_difference_recovers_a_known_shift() -> None:
    rng = random.Random(0)
    before = {f"t{i}": [rng.random()] for i in range(200)}
    after = {t: [v[0] + 0.2 + rng.gauss(0, 0.05)] for t, v in before.items()}
    d = paired_bootstrap_diff(before, after, 2000, 0.95, seed=0)
    assert d["n"] == 200 and abs(d["mean"] - 0.2) < 0.01
    assert d["low"] < 0.2 < d["high"] and d["low"] > 0.18 and d["high"] < 0.22
    flipped = paired_bootstrap_diff(after, before, 2000, 0.95, seed=0)  # b - a: the sign follows the order
    assert flipped["mean"] == pytest.approx(-d["mean"]) and flipped["high"] < 0


def test_pairing_narrows_the_interval_on_correlated_arms() -> None:
    """Task difficulty dominates both arms; the unpaired interval (each arm resampled on its own)
    is wide and spans 0, the paired one is narrow and excludes it."""
    rng = random.Random(1)
    difficulty = {f"t{i}": rng.random() for i in range(60)}
    before = {t: [float(rng.random() < p)] for t, p in difficulty.items()}
    after = {t: [1.0 if v[0] else float(rng.random() < 0.15)] for t, v in before.items()}
    paired = paired_bootstrap_diff(before, after, 2000, 0.95, seed=0)
    a, b = list(before.values()), list(after.values())
    unpaired = sorted(statistics.fmean(x[0] for x in rng.choices(b, k=60))
                      - statistics.fmean(x[0] for x in rng.choices(a, k=60)) for _ in range(2000))
    low, high = unpaired[49], unpaired[1950]
    assert paired["mean"] > 0 and paired["low"] > 0
    assert low < 0 < high
    assert paired["high"] - paired["low"] < (high - low) / 2


def test_paired_difference_refuses_arms_on_different_tasks() -> None:
    with pytest.raises(ValueError, match="different tasks"):
        paired_bootstrap_diff({"a": [1.0], "b": [0.0]}, {"a": [1.0], "c": [0.0]})


def test_one_generator_call_per_step_for_all_episodes() -> None:
    gen = ScriptedGenerator(p_right=1.0)
    eps = run_episodes(gen, lambda: LineEnv(6), [Start(t) for t in TASKS], EvalConfig(mode="sampled", seeds=(0, 1),
                                                                                        max_steps=10))
    assert all(e.success and e.steps == int(e.task_id.split("-")[1]) for e in eps)
    # 12 episodes; those of goal g finish after g steps: batch sizes shrink as episodes end
    assert gen.calls == [12, 10, 8, 6, 4, 2]


def test_episode_endings_and_progress() -> None:
    class Fixed(ScriptedGenerator):
        def __init__(self, texts):
            super().__init__()
            self.texts = texts

        def sample(self, requests):
            self.calls.append(len(requests))
            return [[Completion(text=self.texts[min(len(self.calls) - 1, len(self.texts) - 1)])] for _ in requests]

    task = [TASKS[3]]  # goal 4
    cfg = EvalConfig(max_steps=5, bootstrap=0)
    e = run_episodes(Fixed([action_text("right"), "garbage"]), lambda: LineEnv(6), [Start(t) for t in task], cfg)[0]
    assert (e.terminal, e.steps, e.format_errors, e.progress) == ("format_error", 2, 1, 0.25)
    e = run_episodes(Fixed([action_text("right", "FAILURE")]), lambda: LineEnv(6), [Start(t) for t in task], cfg)[0]
    assert (e.terminal, e.steps, e.success) == ("stopped", 1, False)
    e = run_episodes(Fixed([action_text("right"), action_text("left")]), lambda: LineEnv(6),
                     [Start(t) for t in task], cfg)[0]
    assert (e.terminal, e.steps, e.progress) == ("max_steps", 5, 0.25)  # latched: left does not lower it


def test_format_errors_observe_answers_the_error_and_goes_on() -> None:
    """Lever (b): as AgentGym servers answer an unreadable action; the default stays terminal."""
    seen: list[str] = []
    texts = [action_text("right"), "garbage", action_text("right")]

    class Scripted(ScriptedGenerator):
        def sample(self, requests):
            seen.extend(r.prompt[-1]["content"] for r in requests)
            self.calls.append(len(requests))
            return [[Completion(text=texts[min(len(self.calls) - 1, 2)])] for _ in requests]

    start = [Start(TASKS[2])]  # goal 3
    cfg = EvalConfig(max_steps=5, bootstrap=0, format_errors="observe")
    e = run_episodes(Scripted(), lambda: LineEnv(6), start, cfg)[0]
    assert (e.terminal, e.steps, e.format_errors, e.success) == ("success", 4, 1, True)
    assert "OBSERVATION: Invalid action: no ACTION section" in seen[2] and "HISTORY:\nStep 1:" in seen[2]
    e = run_episodes(Scripted(), lambda: LineEnv(6), start, EvalConfig(max_steps=5, bootstrap=0))[0]
    assert (e.terminal, e.steps, e.format_errors) == ("format_error", 2, 1)
    with pytest.raises(ConfigError, match="format_errors"):
        EvalConfig(format_errors="retry")


def test_recovery_starts_replay_the_prefix_and_show_it_in_the_prompt() -> None:
    from engine.datasets.samples import Sample, Task, Turn

    bad = Sample(id="rec1", kind="recovery", task=Task(id="goal-2", goal="reach position 2",
                                                       context="commands: left, right, wait"),
                 turns=(Turn(action_text("left"), "You are at -1.", False),
                        Turn(action_text("left"), "You are at -2.", False)),
                 source={"commands": ["left", "left"]})
    (start,) = recovery_starts([bad])
    assert start.commands == ("left", "left") and start.label == "rec1"
    assert start.history == (HistoryStep(parse(action_text("left")), "You are at -1."),
                             HistoryStep(parse(action_text("left")), "You are at -2."))
    gen = ScriptedGenerator(p_right=1.0)
    seen = []
    original = gen.sample

    def spy(requests):
        seen.extend(r.prompt[-1]["content"] for r in requests)
        return original(requests)

    gen.sample = spy  # type: ignore[method-assign]
    result = evaluate(gen, lambda: LineEnv(6), TASKS[:1], EvalConfig(max_steps=6), recovery=[start])
    rec = result.recovery[0]
    assert rec.success and rec.steps == 4 and rec.prefix_steps == 2  # from -2 to 2
    assert "OBSERVATION: You are at -2." in seen[1] and "Step 3:" in seen[1]
    assert result.metrics["recovery"]["mean"] == 1.0 and result.metrics["recovery_mode"] == "greedy"


def test_reroot_keeps_the_path_and_the_subtree() -> None:
    from engine.config import SearchConfig
    from engine.search.mcts import MCTS, start_tree

    job = start_tree(TASKS[2], lambda: SnapshotLineEnv(6), 12)
    MCTS(ScriptedGenerator(p_right=0.5), SearchConfig(simulations=12, k=3, depth_limit=5)).run([job])
    tree = job.tree
    deep = max((n for n in tree.nodes if n.depth == 2 and n.children), key=lambda n: n.id, default=None)
    assert deep is not None
    new, nid = reroot(tree, deep.id)
    assert new.nodes[nid].observation == deep.observation and new.nodes[nid].N == deep.N
    assert [n.action.command for n in new.path(new.nodes[nid])] == [n.action.command for n in tree.path(deep)]
    assert all(len(new.nodes[a].children) == 1 for a in [0, *[n.id for n in new.path(new.nodes[nid])][:-1]])
    below = sum(1 for n in tree.nodes if deep.id in [m.id for m in tree.path(n)]) - 1
    assert len(new.nodes) == 1 + deep.depth + below
    assert all(c > n.id for n in new.nodes for c in n.children)


def test_mcts_at_inference_beats_the_same_policy_acting_alone() -> None:
    make = lambda: SnapshotLineEnv(6)
    sampled = evaluate(ScriptedGenerator(p_right=0.4), make, TASKS, EvalConfig(mode="sampled", seeds=(0, 1),
                                                                               max_steps=8, bootstrap=200))
    gen = ScriptedGenerator(p_right=0.4)
    mcts = evaluate(gen, make, TASKS, EvalConfig(mode="mcts", seeds=(0, 1), max_steps=8, mcts_simulations=6,
                                                 mcts_k=3, bootstrap=200))
    assert mcts.metrics["success"]["mean"] > sampled.metrics["success"]["mean"] + 0.2
    assert mcts.metrics["mode"] == "mcts" and all(e.steps <= 8 for e in mcts.episodes)
    assert max(gen.calls) >= len(TASKS)  # trees of one seed share each batched call
    with pytest.raises(Exception, match="recovery"):
        run_episodes(gen, make, [Start(TASKS[0], commands=("left",))], EvalConfig(mode="mcts"))


def test_mcts_at_inference_searches_with_the_chosen_backup(monkeypatch) -> None:
    import engine.search.mcts as mcts_module

    seen: list[str] = []
    real = mcts_module.MCTS

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, generator, config):
            seen.append(config.backup)
            super().__init__(generator, config)

    monkeypatch.setattr(mcts_module, "MCTS", Recording)
    config = EvalConfig(mode="mcts", max_steps=3, mcts_simulations=2, mcts_k=2, bootstrap=0, mcts_backup="progress")
    evaluate(ScriptedGenerator(p_right=0.5), lambda: SnapshotLineEnv(6), TASKS[:2], config)
    assert seen and set(seen) == {"progress"}
    with pytest.raises(Exception, match="mcts_backup"):
        EvalConfig(mode="mcts", mcts_backup="value")


def test_evaluate_and_store_records_metrics_and_episodes(tmp_path: Path) -> None:
    with Store(tmp_path / "o.db") as store:
        result = evaluate_and_store(store, ScriptedGenerator(p_right=0.7), "line", "train", TASKS,
                                    EvalConfig(mode="sampled", seeds=(0, 1, 2)), model="models/x",
                                    make_env=lambda: LineEnv(6))
        (row,) = store.evaluations(model="models/x", with_episodes=True)
        assert row["id"] == result.eval_id and row["mode"] == "sampled" and row["split"] == "train"
        assert row["metrics"]["success"] == result.metrics["success"] and len(row["episodes"]) == 18
        assert row["task_ids"] == [t.id for t in TASKS] and row["config"]["seeds"] == [0, 1, 2]
        s = row["metrics"]["success"]
        assert s["low"] <= s["mean"] <= s["high"] and s["n"] == 6


def test_a_nan_progress_ends_the_evaluation_with_a_clear_error() -> None:
    """Evaluation steps go through the same check as the search (engine.envs.base.checked_step)."""
    from engine.envs.base import EnvError, Step

    class NaNProgress(LineEnv):
        def step(self, command: str) -> Step:
            s = super().step(command)
            return Step(s.observation, s.reward, s.done, float("nan")) if self.pos == 2 else s

    with pytest.raises(EnvError, match=r"env line: task 'goal-3', step 2 \('right'\): progress nan is not a finite"):
        run_episodes(ScriptedGenerator(p_right=1.0), lambda: NaNProgress(6), [Start(TASKS[2])],
                     EvalConfig(mode="greedy", max_steps=10))


def test_an_mcts_episode_keeps_every_step_search_in_one_tree_with_the_committed_path() -> None:
    from engine.evaluate import played_tree

    config = EvalConfig(mode="mcts", seeds=(0,), max_steps=8, mcts_simulations=5, mcts_k=3, bootstrap=50)
    episodes = evaluate(ScriptedGenerator(p_right=0.4), lambda: SnapshotLineEnv(6), TASKS, config).episodes
    for e in episodes:
        tree = e.tree
        assert tree is not None and tree.task.id == e.task_id
        assert tree.root.parent is None and tree.root.observation == e.first_observation
        for n in tree.nodes[1:]:
            assert n.parent is not None and n.parent < n.id and n.depth == tree.nodes[n.parent].depth + 1
            assert n.id in tree.nodes[n.parent].children
        [sim] = tree.simulations
        path = [tree.nodes[i] for i in sim.path]
        assert [n.action.command for n in path] == e.commands  # the committed path is what was played
        assert [n.id for n in tree.path(path[-1])] == list(sim.path)
        assert (path[-1].terminal == "success") == e.success and tree.solved() >= e.success
        # More than the path: the children each step passed over keep their subtrees.
        assert len(tree.nodes) > len(path) + 1
        for n in tree.nodes:  # visit counts stay consistent where the steps' copies meet
            assert sum(tree.nodes[c].N for c in n.children) <= n.N
    assert "tree" not in episodes[0].to_dict()
    with pytest.raises(IndexError):
        played_tree([])
