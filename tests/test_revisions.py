"""Revision trajectories (Agent-R, docs/algorithms.md §4): leaf selection thresholds, first-error detection with
batched judging and every answer spelling, the splice turn by turn with its loss flags, recovery."""

from __future__ import annotations

import re

import pytest
from test_pairs import add, new_tree

from engine.actions import CompositeAction, parse
from engine.config import ConfigError
from engine.datasets.revisions import (
    REVISION_PHRASES,
    RevisionConfig,
    build_revisions,
    detect_first_errors,
    select_pairs,
)
from engine.datasets.samples import TreeRef, to_conversations, to_messages, to_step_rows
from engine.llm.base import Completion, GeneratorError
from engine.prompts import HistoryStep, actor_prompt, judge_prompt

DESC = "Commands: anything."


class Judge:
    """Answers judge prompts from a table keyed by the current action's command (default Good);
    records every batched call."""

    name = "judge-double"

    def __init__(self, answers: dict[str, str] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[list[str]] = []
        self.prompts: list = []

    def sample(self, requests):
        commands = []
        out = []
        for req in requests:
            text = req.prompt[-1]["content"]
            command = re.search(r"CURRENT ACTION:\n.*?^ACTION: ([^\n]*)", text, re.DOTALL | re.MULTILINE).group(1)
            commands.append(command)
            self.prompts.append(req.prompt)
            out.append([Completion(self.answers.get(command, "REASON: fine.\nJudgement: Good"))] * req.n)
        self.calls.append(commands)
        return out

    def logprobs(self, prompts, completions):
        return [None] * len(completions)


def spliced_tree():
    """root -> p1 -> p2 -> g1 -> g2 (success) ; p2 -> b1 -> b2 -> b3 (failure) ; p1 -> x1 (failure)."""
    tree = new_tree()
    n = {}
    n["p1"] = add(tree, 0, "p1")
    n["p2"] = add(tree, n["p1"], "p2")
    n["g1"] = add(tree, n["p2"], "g1")
    n["g2"] = add(tree, n["g1"], "g2", reward=1.0, terminal="success")
    n["b1"] = add(tree, n["p2"], "b1")
    n["b2"] = add(tree, n["b1"], "b2")
    n["b3"] = add(tree, n["b2"], "b3", reward=0.0, terminal="failure")
    n["x1"] = add(tree, n["p1"], "x1", reward=0.0, terminal="depth_limit")
    return tree, n


def revision_of(samples, bad: int):
    (s,) = [s for s in samples if s.kind == "revision" and s.source["bad_path"][-1] == bad]
    return s


def test_splice_is_prefix_bad_through_t_prime_revision_good_suffix():
    tree, n = spliced_tree()
    judge = Judge({"b2": "REASON: this wastes a step.\nJudgement: Bad"})
    built = build_revisions([TreeRef(tree, "run1", 5, DESC)], judge, RevisionConfig())
    s = revision_of(built.revision, n["b3"])
    assert s.source["t_prime"] == 1 and s.source["t_prime_node"] == n["b2"] and s.source["error_found"]
    assert s.source["ancestor"] == n["p2"] and s.source["revision_length"] == 2
    assert s.source["good_path"] == [n["p1"], n["p2"], n["g1"], n["g2"]]
    assert s.source["bad_path"] == [n["p1"], n["p2"], n["b1"], n["b2"], n["b3"]]
    assert [(j["node"], j["verdict"]) for j in s.source["judgements"]] == [(n["b1"], "Good"), (n["b2"], "Bad")]
    assert "wastes a step" in s.source["judgements"][1]["answer"]

    expected = [("p1", True, "prefix"), ("p2", True, "prefix"), ("b1", False, "bad"), ("b2", False, "bad"),
                (None, True, "revision"), ("g1", True, "good"), ("g2", True, "good")]
    assert len(s.turns) == len(expected)
    for turn, (name, loss, segment) in zip(s.turns, expected):
        assert (turn.loss, turn.segment) == (loss, segment)
        if name is not None:
            node = tree.nodes[n[name]]
            assert (turn.node, turn.text) == (node.id, node.raw)
            assert turn.observation == (None if name == "g2" else node.observation)
    rev = s.turns[4]
    action = parse(rev.text)
    assert isinstance(action, CompositeAction) and action.command == "noop" and action.thought in REVISION_PHRASES
    assert rev.observation == tree.nodes[n["p2"]].observation  # the state the good suffix starts from

    flags = [m["train"] for m in to_messages(s) if m["role"] == "assistant"]
    assert flags == [True, True, False, False, True, True, True]
    assert [c["loss"] for c in to_conversations(s) if c["from"] == "gpt"] == flags
    assert all(c["loss"] is None for c in to_conversations(s) if c["from"] == "human")

    rows = to_step_rows(s)  # trained turns only, each with the prompt the policy would see
    assert [r["step"] for r in rows] == [0, 1, 4, 5, 6]
    history = [HistoryStep(parse(t.text), t.observation or "") for t in s.turns[:4]]
    assert rows[2]["prompt"] == actor_prompt(DESC, tree.task.goal, tree.task.context, history,
                                             tree.nodes[n["b2"]].observation)
    history.append(HistoryStep(action, rev.observation))
    assert rows[3]["prompt"] == actor_prompt(DESC, tree.task.goal, tree.task.context, history,
                                             tree.nodes[n["p2"]].observation)
    assert rows[3]["completion"] == [{"role": "assistant", "content": tree.nodes[n["g1"]].raw}]


def test_x1_pairs_with_ancestor_p1_and_nothing_bad_means_last_step():
    tree, n = spliced_tree()
    built = build_revisions([TreeRef(tree, "run1", 5, DESC)], Judge(), RevisionConfig())
    s = revision_of(built.revision, n["x1"])
    assert s.source["ancestor"] == n["p1"] and s.source["t_prime"] == 0 and not s.source["error_found"]
    assert [t.segment for t in s.turns] == ["prefix", "bad", "revision", "good", "good", "good"]
    s = revision_of(built.revision, n["b3"])
    assert s.source["t_prime"] == 2 and not s.source["error_found"]  # nothing judged Bad: the last step
    assert [t.node for t in s.turns if t.segment == "bad"] == [n["b1"], n["b2"], n["b3"]]


@pytest.mark.parametrize("answer,verdict", [
    ("REASON: no.\nJudgement: Bad", "Bad"),
    ("REASON: no.\nJudgment: Bad", "Bad"),
    ("**Judgement**: bad", "Bad"),
    ("judgment = BAD.", "Bad"),
    ("Judgement: Good", "Good"),
    ("REASON: hard to say.\nJudgement: Uncertain", "Uncertain"),
    ("I think this step is terrible.", "garbled"),
    ("", "garbled"),
    ("Judgement: Bad? No wait. Judgement: Good", "Good"),  # the last verdict counts
])
def test_every_answer_spelling(answer, verdict):
    tree, n = spliced_tree()
    judge = Judge({"b1": answer})
    built = build_revisions([TreeRef(tree, "r", None, DESC)], judge, RevisionConfig())
    s = revision_of(built.revision, n["b3"])
    first = s.source["judgements"][0]
    assert (first["node"], first["verdict"], first["answer"]) == (n["b1"], verdict, answer)
    if verdict == "Bad":
        assert s.source["t_prime"] == 0 and len(s.source["judgements"]) == 1
    else:  # Good, Uncertain and garbled all go on to the next step
        assert s.source["t_prime"] == 2 and len(s.source["judgements"]) == 3
    assert built.garbled == (1 if verdict == "garbled" else 0)


def test_judging_is_batched_per_step_across_trees_and_shared_steps_are_asked_once():
    refs, bad_lengths = [], [3, 1, 2]
    for i, length in enumerate(bad_lengths):
        tree = new_tree(f"task-{i}")
        good = add(tree, 0, f"t{i}-good", reward=1.0, terminal="success")
        parent = 0
        for j in range(length):
            last = j == length - 1
            parent = add(tree, parent, f"t{i}-bad{j}", reward=0.0 if last else None, terminal="failure" if last else None)
        if i == 0:  # a second bad leaf sharing the first bad step
            add(tree, tree.nodes[parent].parent, f"t{i}-other", reward=0.0, terminal="failure")
        refs.append(TreeRef(tree, "run", i, DESC))
        assert good
    judge = Judge()
    built = build_revisions(refs, judge, RevisionConfig())
    assert built.pairs == 4 and len(built.revision) == 4
    # one call per step index, all pairs together; t0-bad0 (shared by two bad paths) is asked once
    assert [sorted(c) for c in judge.calls] == [
        ["t0-bad0", "t1-bad0", "t2-bad0"],
        ["t0-bad1", "t2-bad1"],  # t0-bad1 is on both of tree 0's bad paths
        ["t0-bad2", "t0-other"],
    ]
    assert built.judge_calls == 3 and built.judge_requests == 7
    # each judge prompt shows the task, the log so far WITH observations, the action and its observation
    tree = refs[2].tree
    b0, b1 = tree.nodes[2], tree.nodes[3]
    expected = judge_prompt(tree.task.goal, tree.task.context, [HistoryStep(b0.action, b0.observation)], b1.action,
                            b1.observation)
    assert expected in judge.prompts


def test_a_bad_step_stops_judging_that_path_only():
    tree, _ = spliced_tree()
    judge = Judge({"b1": "Judgement: Bad", "x1": "Judgement: Good"})
    build_revisions([TreeRef(tree, "r", None, DESC)], judge, RevisionConfig())
    assert judge.calls == [["x1", "b1"]] or judge.calls == [["b1", "x1"]]


def test_format_error_steps_are_bad_without_asking():
    tree = new_tree()
    add(tree, 0, "good", reward=1.0, terminal="success")
    err = add(tree, 0, None)
    judge = Judge()
    built = build_revisions([TreeRef(tree, "r", None, DESC)], judge, RevisionConfig())
    (s,) = built.revision
    assert judge.calls == [] and s.source["error_found"] and s.source["judgements"][0]["verdict"] == "Bad"
    assert s.turns[0].text == "gibberish" and s.turns[0].loss is False and s.turns[0].node == err
    rows = to_step_rows(s)  # the unparseable turn is untrained and left out of later histories
    assert [r["step"] for r in rows] == [1, 2] and "gibberish" not in rows[0]["prompt"][1]["content"]


def test_leaf_selection_thresholds_are_strict():
    tree = new_tree()
    half = add(tree, 0, "half", reward=0.5, terminal="stopped")
    zero = add(tree, 0, "zero", reward=0.0, terminal="failure")
    ref = TreeRef(tree, "r", None, DESC)
    assert select_pairs(ref, 0, RevisionConfig(beta_gap=0.2)) == []  # 0.5 is not above alpha_good 0.5
    assert [(p.good, p.bad) for p in select_pairs(ref, 0, RevisionConfig(alpha_good=0.49, beta_gap=0.2))] == [
        (half, zero)]

    tree = new_tree()
    best = add(tree, 0, "best", reward=1.0, terminal="success")
    add(tree, 0, "gap-equal", reward=0.5, terminal="stopped")  # 1.0 - 0.5 is not above beta_gap 0.5
    low = add(tree, 0, "low", reward=0.4, terminal="stopped")
    add(tree, 0, "close", reward=0.6, terminal="stopped")  # a good leaf, and 1.0 - 0.6 is no gap either
    ref = TreeRef(tree, "r", None, DESC)
    assert [(p.good, p.bad) for p in select_pairs(ref, 0, RevisionConfig())] == [(best, low)]
    pairs = select_pairs(ref, 0, RevisionConfig(alpha_good=0.45, beta_gap=0.05))
    assert len(pairs) == 3 and {p.good for p in pairs} == {best}  # each bad leaf once, with the best good
    with pytest.raises(ConfigError, match="beta_gap"):
        RevisionConfig(beta_gap=-0.1)
    with pytest.raises(ConfigError, match="noop_command"):
        RevisionConfig(noop_command="two\nlines")


def test_each_bad_leaf_pairs_with_the_good_leaf_of_deepest_common_ancestor():
    tree = new_tree()
    a = add(tree, 0, "a")
    far_good = add(tree, 0, "far", reward=1.0, terminal="success")
    near_good = add(tree, add(tree, a, "a-b"), "a-b-c", reward=0.8, terminal="success")
    bad = add(tree, add(tree, a, "a-x"), "a-x-y", reward=0.0, terminal="failure")
    (pair,) = select_pairs(TreeRef(tree, "r"), 0, RevisionConfig())
    assert (pair.good, pair.bad, pair.ancestor, pair.split) == (near_good, bad, a, 1)
    assert far_good
    # the cap keeps the deepest pairs
    pairs = select_pairs(TreeRef(tree, "r"), 0, RevisionConfig(max_per_task=1))
    assert [p.bad for p in pairs] == [bad]


def test_recovery_set_and_good_trajectories():
    tree, n = spliced_tree()
    built = build_revisions([TreeRef(tree, "run1", 5, DESC)], Judge({"b2": "Judgement: Bad"}), RevisionConfig())
    recs = {s.source["node"]: s for s in built.recovery}
    assert set(recs) == {n["b2"], n["x1"]}
    r = recs[n["b2"]]
    assert [t.node for t in r.turns] == [n["p1"], n["p2"], n["b1"], n["b2"]]
    assert all(t.loss is False for t in r.turns)
    assert r.source["commands"] == ["p1", "p2", "b1", "b2"]  # replay these from reset, then finish the task
    assert r.turns[-1].observation == tree.nodes[n["b2"]].observation
    (good,) = built.good
    assert [t.node for t in good.turns] == [n["p1"], n["p2"], n["g1"], n["g2"]] and all(t.loss for t in good.turns)


def test_ids_are_stable_and_depend_on_the_judge():
    tree, _ = spliced_tree()
    ref = TreeRef(tree, "run1", 5, DESC)
    a = build_revisions([ref], Judge(), RevisionConfig())
    b = build_revisions([ref], Judge(), RevisionConfig())
    assert [s.id for s in a.samples] == [s.id for s in b.samples]
    assert [s.turns for s in a.revision] == [s.turns for s in b.revision]  # same phrasing too
    other = Judge()
    other.name = "another-judge"
    c = build_revisions([ref], other, RevisionConfig())
    assert not {s.id for s in c.revision} & {s.id for s in a.revision}
    assert {s.id for s in c.good} == {s.id for s in a.good}


def test_at_least_ten_distinct_phrasings_all_valid_actions():
    assert len(set(REVISION_PHRASES)) >= 10
    ids = [f"{i:040x}" for i in range(200)]
    from engine.datasets.revisions import revision_turn

    texts = {revision_turn(i, "obs", RevisionConfig()).text for i in ids}
    assert len(texts) == len(REVISION_PHRASES)
    assert all(isinstance(parse(t), CompositeAction) for t in texts)


def test_a_judge_returning_the_wrong_number_of_answers_is_an_error():
    tree, _ = spliced_tree()

    class Short(Judge):
        def sample(self, requests):
            return super().sample(requests)[:-1]

    with pytest.raises(GeneratorError, match="results for"):
        build_revisions([TreeRef(tree, "r")], Short(), RevisionConfig())
    assert detect_first_errors([], [], Judge(), RevisionConfig()) == []


def test_successes_found_in_rollouts_join_the_good_set() -> None:
    from engine.tree_nodes import Simulation

    tree = new_tree()
    a = add(tree, 0, "right")
    tree.simulations.append(Simulation((a,), 1.0, ("right",), (("ACTION: right", "You reached the goal."),)))
    build = build_revisions([TreeRef(tree=tree, run_id="r", tree_id=1)], None, RevisionConfig())  # type: ignore[arg-type]
    (good,) = build.good
    assert good.kind == "good" and good.source["simulation"] == 0 and build.revision == []
    assert [t.text for t in good.turns][-1] == "ACTION: right" and good.turns[-1].observation is None


def test_why_little_names_the_first_missing_ingredient_with_its_counts() -> None:
    from engine.datasets.revisions import why_little

    config = RevisionConfig()
    base = {"trees": 4, "leaves": 9, "success_leaves": 0, "trees_with_success": 0, "leaf_pairs": 0, "judgements": 0,
            "garbled": 0, "judged_errors": 0, "revision": 0, "good": 0, "recovery": 0}
    assert "none of the 4 trees has a success leaf" in str(why_little(base, config))
    some = {**base, "success_leaves": 2, "trees_with_success": 1, "good": 2}
    assert "no failure leaf below them" in str(why_little(some, config)) and "7 other terminal leaves" in str(
        why_little(some, config))
    judged = {**some, "leaf_pairs": 3, "judgements": 6, "garbled": 1, "revision": 3}
    assert "no judged first error" in str(why_little(judged, config)) and "6 judgements, 1 unreadable" in str(
        why_little(judged, config))
    assert why_little({**judged, "judged_errors": 1}, config) is None
