"""Search distilled into SFT rows (engine/datasets/distill.py), on hand-worked trees: expert iteration's
shortest successful trajectories, and visit-count targets
whose drawn rows follow the MCTS visit distribution."""

from __future__ import annotations

from collections import Counter

import pytest
from test_pairs import add, new_tree

from engine.config import ConfigError
from engine.datasets.distill import DistillConfig, best_path_samples, distill, visit_samples, visit_targets
from engine.datasets.samples import TreeRef, to_step_rows
from engine.tree_nodes import Simulation

DESC = "Commands: left, right, wait."


def solved_tree():
    """Root -> a (right) -> b (right) -> c (right, success at depth 3); root -> d (left) -> e (right, wait,
    right, right by rollout: success, 5 steps in all); root -> f (wait): a failure leaf."""
    tree = new_tree()
    a = add(tree, 0, "right", N=6, value_sum=4.0)
    b = add(tree, a, "right", N=4, value_sum=3.0)
    c = add(tree, b, "right", N=2, value_sum=2.0, reward=1.0, terminal="success")
    d = add(tree, 0, "left", N=3, value_sum=1.0)
    add(tree, 0, "wait", N=1, value_sum=0.0, reward=0.0, terminal="failure")
    tree.root.N = 10
    tree.simulations = [Simulation((a, b, c), 1.0),
                        Simulation((d,), 1.0, ("right", "right", "right", "right"),
                                   tuple((f"THOUGHT: go\nACTION: {cmd}\nEXPLANATION: e\nSTATUS: CONTINUE", f"obs {i}")
                                         for i, cmd in enumerate(["right", "right", "right", "right"])))]
    return tree, (a, b, c, d)


def ref(tree) -> TreeRef:
    return TreeRef(tree=tree, run_id="run-1", tree_id=7, env_description=DESC)


def test_expert_iteration_keeps_the_shortest_successful_trajectory():
    tree, (a, b, c, _) = solved_tree()
    [sample] = best_path_samples(ref(tree))
    assert sample.kind == "exit"
    assert [t.node for t in sample.turns] == [a, b, c]  # 3 steps beats the rollout's 5
    assert sample.source["path"] == [a, b, c] and sample.source["steps"] == 3
    assert sample.turns[-1].observation is None  # the chat ends on the assistant
    # The rows the policy trains on are the search's own completions, in the prompts search sent.
    rows = to_step_rows(sample)
    assert [r["completion"][0]["content"] for r in rows] == [tree.nodes[n].raw for n in (a, b, c)]


def test_more_trajectories_per_tree_come_in_length_order():
    tree, _ = solved_tree()
    samples = best_path_samples(ref(tree), DistillConfig(per_tree=5))
    assert [s.source["steps"] for s in samples] == [3, 5]
    assert all(t.trains for s in samples for t in s.turns)  # every turn of a success is a target
    assert samples[1].source["path"] == [4] and len(to_step_rows(samples[1])) == 5


def test_an_unsolved_tree_gives_no_expert_iteration_rows():
    tree = new_tree()
    add(tree, 0, "left", N=2, value_sum=0.0, reward=0.0, terminal="failure")
    tree.root.N = 2
    assert best_path_samples(ref(tree)) == []
    assert distill([ref(tree)], "exit") == []


def test_visit_targets_are_the_visit_shares_of_well_visited_nodes():
    tree, (a, b, _, d) = solved_tree()
    targets = dict(visit_targets(ref(tree), DistillConfig(min_visits=4)))
    # root (N=10): children a 6, d 3, the failure leaf 1; a (N=6): b alone; d (N=3) is under min_visits
    assert targets[0] == pytest.approx({a: 0.6, d: 0.3, 5: 0.1})
    assert targets[a] == {b: 1.0}
    assert d not in targets and b in targets  # b has N=4; its child c (N=2) is its only visited one


def test_visit_rows_follow_the_visit_distribution():
    tree, (a, _, _, d) = solved_tree()
    rows = visit_samples(ref(tree), DistillConfig(min_visits=10, rows_per_node=3000, seed=1))
    drawn = Counter(s.source["child"] for s in rows)
    assert sum(drawn.values()) == 3000
    assert drawn[a] / 3000 == pytest.approx(0.6, abs=0.03)
    assert drawn[d] / 3000 == pytest.approx(0.3, abs=0.03)
    # Each row trains the child's action only, in the context of the path to its node (root: none).
    assert all([t.trains for t in s.turns] == [True] for s in rows)


def test_visit_rows_put_the_path_as_untrained_context():
    tree, (a, b, _, _) = solved_tree()
    rows = [s for s in visit_samples(ref(tree), DistillConfig(min_visits=6, rows_per_node=2)) if s.source["node"] == a]
    assert len(rows) == 2
    assert [(t.node, t.trains) for t in rows[0].turns] == [(a, False), (b, True)]
    assert len(to_step_rows(rows[0])) == 1


def test_distill_config_and_target_are_checked():
    with pytest.raises(ConfigError, match="per_tree"):
        DistillConfig(per_tree=0)
    with pytest.raises(ConfigError, match="unknown distillation target"):
        distill([], "nope")


def test_episodes_of_mcts_at_inference_become_one_row_per_success_in_the_prompts_played() -> None:
    from doubles import LineEnv, ScriptedGenerator, SnapshotLineEnv

    from engine.datasets.distill import episode_samples
    from engine.evaluate import EvalConfig, evaluate

    tasks = LineEnv(4).tasks("train")
    played = evaluate(ScriptedGenerator(p_right=0.4), lambda: SnapshotLineEnv(4), tasks,
                      EvalConfig(mode="mcts", seeds=(0, 1), max_steps=8, mcts_simulations=6, mcts_k=3,
                                 bootstrap=50)).episodes
    wins = [e for e in played if e.success]
    assert wins
    rows = episode_samples(played, tasks, DESC)
    distinct = {(e.task_id, tuple(text for text, _ in e.turns)) for e in wins}
    assert len(rows) == len(distinct)  # one per distinct successful episode; failures give none
    for row in rows:
        episode = next(e for e in wins if e.task_id == row.source["task_id"] and e.seed == row.source["seed"])
        assert [t.text for t in row.turns] == [text for text, _ in episode.turns]  # the committed completions
        assert [t.observation for t in row.turns[:-1]] == [obs for _, obs in episode.turns[:-1]]
        assert row.turns[-1].observation is None and all(t.trains for t in row.turns)
        assert row.task.first_observation == episode.first_observation != ""
        assert len(to_step_rows(row)) == episode.steps
    stored = played[0].to_dict()
    assert "turns" not in stored and "first_observation" not in stored  # the evaluation row stays small


def test_an_episode_started_after_a_prefix_is_not_distilled() -> None:
    from doubles import LineEnv

    from engine.datasets.distill import episode_samples
    from engine.evaluate import Episode

    tasks = LineEnv(1).tasks("train")
    done = Episode(task_id=tasks[0].id, seed=0, success=True, steps=1, prefix_steps=2,
                   turns=[("ACTION: right", "at 1")], first_observation="at 0")
    assert episode_samples([done], tasks, DESC) == []
