"""Preference pairs (docs/algorithms.md §3): brute-force agreement on random trees, the strict threshold, eq. 10
mixing, prompts that are exactly what search sent the model, stable ids, trajectory pairs, RFT rows."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv, action_text
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.actions import CompositeAction, parse, render
from engine.config import ConfigError, SearchConfig
from engine.datasets.pairs import PairsConfig, build_pairs, rft_samples, step_pairs, trajectory_pairs
from engine.datasets.samples import TreeRef, to_messages
from engine.envs.base import TaskSpec
from engine.prompts import actor_prompt
from engine.search.runner import new_run
from engine.store import Store
from engine.tree_nodes import SearchTree

DESC = "Commands: left, right, wait."


def add(tree: SearchTree, parent: int, command: str | None, *, N: int = 1, value_sum: float = 0.0,
        q_critic: float | None = None, reward: float | None = None, terminal: str | None = None,
        logprob: float | None = -1.0, observation: str | None = None) -> int:
    """Add a child of `parent` doing `command` (None: a format error) and return its id."""
    node = tree.nodes[parent]
    obs = observation if observation is not None else f"after {command} at depth {node.depth + 1}"
    if command is None:
        child = tree.add_child(node, observation="Format error: no ACTION section.", raw="gibberish",
                               format_error="no ACTION section", terminal="format_error", reward=0.0, N=N,
                               value_sum=value_sum, Q_critic=q_critic, logprob=logprob)
    else:
        action = parse(action_text(command, "CONTINUE" if terminal is None else "SUCCESS"))
        child = tree.add_child(node, observation=obs, action=action, raw=render(action), N=N, value_sum=value_sum,
                               Q_critic=q_critic, logprob=logprob, reward=reward, terminal=terminal)
    return child.id


def new_tree(task_id: str = "goal-3") -> SearchTree:
    return SearchTree.new(TaskSpec(id=task_id, goal="reach position 3", context="commands: left, right, wait"),
                          "You are at 0. The goal is 3.")


def keys(pairs) -> set[tuple[int, int, int]]:
    return {(p.node_id, p.chosen_node, p.rejected_node) for p in pairs}


# --- brute force on random trees ---------------------------------------------------------------

ALPHAS = [Fraction(0), Fraction(1, 4), Fraction(1, 2), Fraction(3, 4), Fraction(1)]
THETAS = [Fraction(0), Fraction(1, 10), Fraction(1, 4), Fraction(1, 3), Fraction(1, 2)]


@st.composite
def random_trees(draw):
    """A tree whose values are exact rationals: rewards in {0, 1/2, 1}, critic scores from ranks
    (linear 1 - r/(K-1) or reciprocal 1/(r+1)). Returns (tree, exact value inputs per node)."""
    tree = new_tree()
    exact: dict[int, tuple[Fraction, Fraction | None]] = {}
    n = draw(st.integers(1, 40))
    for _ in range(n):
        parent = draw(st.integers(0, len(tree.nodes) - 1))
        if tree.nodes[parent].terminal is not None:
            parent = 0
        visits = draw(st.integers(0, 6))
        halves = draw(st.integers(0, 2 * visits))
        critic = draw(st.one_of(st.none(), st.tuples(st.integers(2, 5), st.integers(0, 4), st.booleans())))
        q_exact = None
        if critic is not None:
            k, r, linear = critic
            r = min(r, k - 1)
            q_exact = Fraction(k - 1 - r, k - 1) if linear else Fraction(1, r + 1)
        fmt_error = draw(st.integers(0, 9)) == 0
        nid = add(tree, parent, None if fmt_error else draw(st.sampled_from(["left", "right", "wait"])), N=visits,
                  value_sum=halves / 2, q_critic=None if q_exact is None else float(q_exact))
        exact[nid] = (Fraction(halves, 2 * visits) if visits else Fraction(0), q_exact)
    return tree, exact


def brute_force(tree: SearchTree, exact, alpha: Fraction, theta: Fraction,
                refused: set | None = None, min_visits: int = 1) -> set[tuple[int, int, int]]:
    """Every ordered (node, a, b) of explored siblings with exact Q(a) - Q(b) > theta whose commands
    differ (both format errors with the same text count as the same); the others go to `refused`."""

    def q(nid: int) -> Fraction:
        q_mcts, q_critic = exact[nid]
        return q_mcts if q_critic is None else alpha * q_mcts + (1 - alpha) * q_critic

    def same(a: int, b: int) -> bool:
        x, y = tree.nodes[a], tree.nodes[b]
        if x.action is None or y.action is None:
            return x.action is None and y.action is None and x.raw == y.raw
        return x.action.command == y.action.command

    out = set()
    for node in tree.nodes:
        for a in node.children:
            for b in node.children:
                if a != b and min(tree.nodes[a].N, tree.nodes[b].N) >= min_visits and q(a) - q(b) > theta:
                    if not same(a, b):
                        out.add((node.id, a, b))
                    elif refused is not None:
                        refused.add((node.id, a, b))
    return out


@settings(max_examples=300, deadline=None)
@given(random_trees(), st.sampled_from(ALPHAS), st.sampled_from(THETAS), st.sampled_from((1, 1, 2, 3)))
@pytest.mark.slow
def test_step_pairs_match_brute_force(data, alpha, theta, min_visits):
    tree, exact = data
    refusals: list = []
    config = PairsConfig(alpha=float(alpha), theta=float(theta), min_visits=min_visits)
    pairs = step_pairs(TreeRef(tree, "run1", 7, DESC), config, refusals)
    refused: set = set()
    assert keys(pairs) == brute_force(tree, exact, alpha, theta, refused, min_visits)
    assert {(r.node_id, r.chosen_node, r.rejected_node) for r in refusals} == refused
    assert len(pairs) == len(keys(pairs))  # no duplicates
    for p in pairs:
        assert p.q_chosen - p.q_rejected > float(theta)
        assert p.q_chosen == pytest.approx(tree.nodes[p.chosen_node].value(float(alpha)))


def test_threshold_is_strict_at_the_boundary_in_exact_arithmetic():
    # 0.6 - 0.5 and 0.4 - 0.3 are both exactly 0.1, though floats make the second 0.10000000000000003
    for high, low in [(0.6, 0.5), (0.4, 0.3), (0.7, 0.6), (0.35, 0.25)]:
        tree = new_tree()
        a = add(tree, 0, "right", q_critic=high)
        b = add(tree, 0, "left", q_critic=low)
        config = PairsConfig(alpha=0.0, theta=0.1)
        assert step_pairs(TreeRef(tree, "r"), config) == [], (high, low)
        config = PairsConfig(alpha=0.0, theta=0.09)
        assert keys(step_pairs(TreeRef(tree, "r"), config)) == {(0, a, b)}


def test_decisive_nodes_only_compare_children_with_enough_rollouts():
    """Hand-worked: at the root, `right` won 3 of 4 rollouts (Q~ 0.75), `left` 0 of 3 (0.0), `wait` its
    one rollout (1.0). With min_visits 3 and alpha 1 (the rollouts alone) only right > left is decisive;
    `wait`'s single lucky rollout decides nothing. With the default (1) wait beats both."""
    tree = new_tree()
    right = add(tree, 0, "right", N=4, value_sum=3.0, q_critic=0.0)
    left = add(tree, 0, "left", N=3, value_sum=0.0, q_critic=1.0)
    wait = add(tree, 0, "wait", N=1, value_sum=1.0, q_critic=0.0)
    decisive = PairsConfig(alpha=1.0, theta=0.5, min_visits=3)
    assert keys(step_pairs(TreeRef(tree, "r"), decisive)) == {(0, right, left)}
    assert keys(step_pairs(TreeRef(tree, "r"), PairsConfig(alpha=1.0, theta=0.5))) == {
        (0, right, left), (0, wait, left)}
    assert keys(step_pairs(TreeRef(tree, "r"), PairsConfig(alpha=1.0, theta=0.2))) == {
        (0, right, left), (0, wait, left), (0, wait, right)}
    with pytest.raises(ConfigError, match="min_visits"):
        PairsConfig(min_visits=0)


def test_eq10_mixing_decides_the_direction():
    tree = new_tree()
    # MCTS says "left" (3/4 vs 1/4), the critic says "right" (1 vs 0)
    right = add(tree, 0, "right", N=4, value_sum=1.0, q_critic=1.0)
    left = add(tree, 0, "left", N=4, value_sum=3.0, q_critic=0.0)
    ref = TreeRef(tree, "r")
    assert keys(step_pairs(ref, PairsConfig(alpha=1.0))) == {(0, left, right)}
    assert keys(step_pairs(ref, PairsConfig(alpha=0.0))) == {(0, right, left)}
    # alpha = 0.5: 0.5*0.25 + 0.5*1 = 0.625 vs 0.5*0.75 + 0 = 0.375
    (pair,) = step_pairs(ref, PairsConfig(alpha=0.5))
    assert (pair.chosen_node, pair.q_chosen, pair.q_rejected) == (right, 0.625, 0.375)
    # a child without a critic score is valued by Q~ alone
    tree.nodes[left].Q_critic = None
    (pair,) = step_pairs(ref, PairsConfig(alpha=0.5))
    assert (pair.chosen_node, pair.q_chosen, pair.q_rejected) == (left, 0.75, 0.625)


def test_unexplored_children_and_every_node_are_covered():
    tree = new_tree()
    a = add(tree, 0, "right", N=2, value_sum=2.0)
    b = add(tree, 0, "left", N=1, value_sum=0.0)
    add(tree, 0, "wait", N=0)  # never visited: no pairs
    deep_a = add(tree, a, "right", N=1, value_sum=1.0)
    deep_b = add(tree, a, "wait", N=1, value_sum=0.0)
    err = add(tree, a, None, N=1, value_sum=0.0, logprob=-9.5)  # a format error is a natural rejected
    pairs = step_pairs(TreeRef(tree, "r", 3, DESC), PairsConfig(alpha=1.0))
    assert keys(pairs) == {(0, a, b), (a, deep_a, deep_b), (a, deep_a, err)}
    by_key = {(p.node_id, p.chosen_node, p.rejected_node): p for p in pairs}
    p = by_key[(a, deep_a, err)]
    assert p.rejected == "gibberish" and p.logprob_rejected == -9.5 and p.chosen == tree.nodes[deep_a].raw
    assert p.depth == 1 and p.tree_id == 3 and p.task_id == "goal-3"
    assert p.prompt == actor_prompt(DESC, tree.task.goal, tree.task.context, tree.history(tree.nodes[a]),
                                    tree.nodes[a].observation)
    assert p.messages("chosen") == [{"role": "assistant", "content": tree.nodes[deep_a].raw}]


def test_stable_ids_survive_rebuild_and_json_roundtrip_but_not_another_run():
    tree = new_tree()
    a = add(tree, 0, "right", N=2, value_sum=2.0, q_critic=1.0)
    add(tree, 0, "left", N=2, value_sum=0.0, q_critic=0.0)
    add(tree, a, "right", N=1, value_sum=1.0, q_critic=1.0)
    add(tree, a, "left", N=1, value_sum=0.0, q_critic=0.0)
    config = PairsConfig()
    first = [p.id for p in step_pairs(TreeRef(tree, "run-a"), config)]
    again = SearchTree.from_json(json.loads(json.dumps(tree.to_json({"id": "run-a"}))))
    assert [p.id for p in step_pairs(TreeRef(again, "run-a"), config)] == first
    assert [p.id for p in step_pairs(TreeRef(tree, "run-a"), PairsConfig(theta=0.2))] == first  # same comparisons
    assert not set(first) & {p.id for p in step_pairs(TreeRef(tree, "run-b"), config)}
    assert len(set(first)) == len(first) == 2


def test_config_is_validated():
    for bad in ({"alpha": 1.5}, {"theta": -0.1}, {"trajectory_pairs": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            PairsConfig(**bad)


def _two_outcome_tree() -> tuple[SearchTree, dict[str, int]]:
    tree = new_tree()
    ids = {}
    ids["r1"] = add(tree, 0, "right", N=3, value_sum=2.0, logprob=-1.0)
    ids["r2"] = add(tree, ids["r1"], "right", N=2, value_sum=2.0, logprob=-2.0)
    ids["win"] = add(tree, ids["r2"], "right", N=2, value_sum=2.0, reward=1.0, terminal="success", logprob=-3.0)
    ids["lose"] = add(tree, ids["r1"], "left", N=1, value_sum=0.0, reward=0.0, terminal="depth_limit",
                      logprob=None)
    ids["err"] = add(tree, 0, None, N=1, value_sum=0.0)
    return tree, ids


def test_trajectory_pairs_and_rft_rows():
    tree, ids = _two_outcome_tree()
    ref = TreeRef(tree, "r", 1, DESC)
    pairs = trajectory_pairs(ref, PairsConfig(trajectory_pairs=4))
    # failures lowest reward first, then by id; each against the (only) success
    assert [(p.chosen_node, p.rejected_node) for p in pairs] == [(ids["win"], ids["lose"]), (ids["win"], ids["err"])]
    p = pairs[0]
    assert p.kind == "trajectory" and p.q_chosen == 1.0 and p.q_rejected == 0.0
    assert p.logprob_chosen == -6.0 and p.logprob_rejected is None  # one step had no log-prob
    assert [m["role"] for m in p.prompt] == ["system", "user"]
    chosen = p.messages("chosen")
    assert [m["role"] for m in chosen] == ["assistant", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in chosen[::2]] == [tree.nodes[i].raw for i in (ids["r1"], ids["r2"], ids["win"])]
    assert p.messages("rejected")[-1]["content"] == tree.nodes[ids["lose"]].raw
    assert len(trajectory_pairs(ref, PairsConfig(trajectory_pairs=1))) == 1
    assert trajectory_pairs(ref, PairsConfig(trajectory_pairs=0)) == []

    (rft,) = rft_samples(ref)
    assert rft.kind == "rft" and [t.node for t in rft.turns] == [ids["r1"], ids["r2"], ids["win"]]
    assert all(t.loss is True for t in rft.turns) and rft.turns[-1].observation is None
    msgs = to_messages(rft)
    assert msgs[1]["content"].startswith("TASK: reach position 3") and msgs[-1]["role"] == "assistant"

    no_win = new_tree()
    add(no_win, 0, "left", reward=0.0, terminal="failure")
    assert trajectory_pairs(TreeRef(no_win, "r"), PairsConfig()) == [] and rft_samples(TreeRef(no_win, "r")) == []


class RecordingGenerator(ScriptedGenerator):
    """Remembers every actor prompt and what it answered."""

    def __init__(self) -> None:
        super().__init__(p_right=0.5, p_garbage=0.1)
        self.answers: dict[str, set[tuple[str, float]]] = {}

    def sample(self, requests):
        out = super().sample(requests)
        for req, comps in zip(requests, out):
            key = json.dumps(req.prompt)
            self.answers.setdefault(key, set()).update((c.text, c.logprob) for c in comps)
        return out


def test_pairs_from_a_real_search_are_what_the_model_saw_and_said(tmp_path):
    gen = RecordingGenerator()
    env = SnapshotLineEnv()
    with Store(tmp_path / "o.db") as store:
        run_id, _ = new_run(store, "line", env.tasks()[:3], gen, SearchConfig(simulations=12, k=3, depth_limit=5),
                            "t", make_env=SnapshotLineEnv)
        refs = [TreeRef(store.load_tree(tid), run_id, tid, env.describe()) for tid, _ in store.tree_ids(run_id)]
    built = build_pairs(refs, PairsConfig(alpha=0.5, theta=0.1))
    assert len(built.step) > 5
    for p in built.step:
        said = gen.answers[json.dumps(p.prompt)]  # the exact prompt search sent at that node
        assert (p.chosen, p.logprob_chosen) in said and (p.rejected, p.logprob_rejected) in said
    assert all(p.q_chosen - p.q_rejected > 0.1 for p in built.step)
    assert {p.task_id for p in built.step} <= {t.id for t in env.tasks()[:3]}
    assert all(isinstance(parse(t.text), CompositeAction) for s in built.rft for t in s.turns)


def test_the_cli_explains_empty_trajectory_data_for_rollout_successes_stored_without_steps() -> None:
    from engine.datasets.builds import rollout_only_hint
    from engine.datasets.samples import TreeRef
    from engine.envs.base import TaskSpec
    from engine.tree_nodes import SearchTree, Simulation

    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    child = tree.add_child(tree.root, observation="o")
    tree.simulations.append(Simulation((child.id,), 1.0, ("a", "b")))
    ref = TreeRef(tree=tree, run_id="r")
    hint = rollout_only_hint([ref], 1.0)
    assert hint is not None and "1 simulations succeeded in rollouts stored without their steps" in hint
    tree.simulations[0] = Simulation((child.id,), 1.0, ("a", "b"), (("Action: a", "o1"), ("Action: b", "won")))
    assert rollout_only_hint([ref], 1.0) is None  # the steps were kept: RFT rows exist
    child.terminal, child.reward = "success", 1.0  # a success leaf in the tree: nothing to explain
    assert rollout_only_hint([ref], 1.0) is None
    tree.simulations[0] = Simulation((child.id,), 0.0, ("a",))
    child.terminal, child.reward = None, None
    assert rollout_only_hint([ref], 1.0) is None  # no success anywhere: nothing to explain either


def test_successful_rollouts_become_rft_rows_and_survive_the_store(tmp_path) -> None:
    """A success found in a ROLLOUT (whose steps are not tree nodes) is a whole trajectory: tree
    path + the rollout's own texts and observations, stored with the simulation; replaying its
    commands in the env gives exactly the recorded observations."""
    with Store(tmp_path / "o.db") as store:
        run_id, _ = new_run(store, "line", [SnapshotLineEnv(8).task("goal-5")], ScriptedGenerator(p_right=0.8),
                            SearchConfig(simulations=4, k=2, depth_limit=12), "r", make_env=SnapshotLineEnv)
        ((tree_id, _),) = store.tree_ids(run_id)
        tree = store.load_tree(tree_id)
    wins = [s for s in tree.simulations if s.turns]
    assert wins and all(s.reward == 1.0 and len(s.turns) == len(s.rollout) for s in wins)
    assert not any(n.terminal == "success" for n in tree.nodes)  # the successes are in rollouts only
    assert all(not s.turns for s in tree.simulations if s.reward < 1.0)
    ref = TreeRef(tree=tree, run_id=run_id, tree_id=tree_id)
    rows = rft_samples(ref)
    assert rows and len({r.id for r in rows}) == len(rows)
    for row in rows:
        sim = tree.simulations[row.source["simulation"]]
        env = SnapshotLineEnv(8)
        env.reset("goal-5")
        commands = [tree.nodes[n].action.command for n in sim.path] + list(sim.rollout)
        observations = [env.step(c).observation for c in commands]
        assert [parse(t.text).command for t in row.turns] == commands
        assert [t.observation for t in row.turns] == [*observations[:-1], None]
        assert all(t.trains for t in row.turns) and observations[-1] == sim.turns[-1][1]
    assert SearchTree.from_json(json.loads(json.dumps(tree.to_json(0.5)))).simulations == tree.simulations
