"""Two trees of one task side by side (engine/search/compare_trees.py): alignment by command path,
per-depth visits and successes, the best paths together and the first depth where they part."""

from __future__ import annotations

import pytest
from test_pairs import add, new_tree

from engine.search.compare_trees import align, command_paths, compare_trees
from engine.tree_nodes import SearchTree, Simulation


def simulate(tree: SearchTree, leaf: int, reward: float) -> None:
    """One simulation through `leaf`, backed up as the search does (so the invariants hold)."""
    path = [n.id for n in tree.path(tree.nodes[leaf])]
    tree.backpropagate(path, reward)
    tree.simulations.append(Simulation(tuple(path), reward))


def tree_a() -> SearchTree:
    t = new_tree()
    right, left = add(t, 0, "right", N=0), add(t, 0, "left", N=0)
    rr, rw = add(t, right, "right", N=0), add(t, right, "wait", N=0)
    for leaf, reward in ((rr, 1.0), (rr, 1.0), (rw, 0.0), (left, 0.0)):
        simulate(t, leaf, reward)
    return t


def tree_b() -> SearchTree:
    t = new_tree()
    right, wait = add(t, 0, "right", N=0), add(t, 0, "wait", N=0)
    rw, rr = add(t, right, "wait", N=0), add(t, right, "right", N=0)
    garbage = add(t, wait, None, N=0)
    for leaf, reward in ((rw, 1.0), (rr, 0.0), (wait, 0.0), (garbage, 0.0)):
        simulate(t, leaf, reward)
    return t


def test_nodes_match_by_their_command_paths_not_their_ids() -> None:
    a, b = tree_a(), tree_b()
    assert not a.check_invariants() and not b.check_invariants()
    assert align(a, b) == [(0, 0), (1, 1), (3, 4), (4, 3)]  # right/right is node 3 in A, node 4 in B
    assert command_paths(b)[5] == ("wait", None)  # a format error steps with no command


def test_per_depth_visits_successes_and_shared_paths() -> None:
    c = compare_trees(tree_a(), tree_b())
    figures = [(r.depth, r.a_visits, r.a_successes, r.b_visits, r.b_successes, r.shared) for r in c.rows]
    assert figures == [(0, 4, 2, 4, 1, 1), (1, 4, 2, 4, 1, 1), (2, 3, 2, 3, 1, 2)]
    assert c.matched == 4
    assert c.rows[1].rate(c.rows[1].a_successes, c.rows[1].a_visits) == 0.5


def test_best_paths_side_by_side_and_where_they_first_part() -> None:
    a, b = tree_a(), tree_b()
    c = compare_trees(a, b)
    assert c.a_best == a.best_path() == [1, 3] and c.b_best == b.best_path() == [1, 3]
    assert [(r.a_best, r.b_best) for r in c.rows] == [("", ""), ("right", "right"), ("right", "wait")]
    assert c.first_parting == 2 and [r.parted for r in c.rows] == [False, False, True]


def test_a_tree_against_itself_never_parts_and_a_shorter_best_path_parts_where_it_ends() -> None:
    a = tree_a()
    same = compare_trees(a, tree_a())
    assert same.first_parting is None and not any(r.parted for r in same.rows)
    assert same.matched == len(a.nodes) == 5
    short = new_tree()
    simulate(short, add(short, 0, "right", N=0), 0.0)
    c = compare_trees(a, short)
    assert [(r.a_best, r.b_best) for r in c.rows] == [("", ""), ("right", "right"), ("right", "")]
    assert c.first_parting == 2 and c.rows[2].b_visits == 0


def test_trees_of_two_tasks_are_refused() -> None:
    with pytest.raises(ValueError, match="different tasks"):
        compare_trees(tree_a(), new_tree("goal-4"))
