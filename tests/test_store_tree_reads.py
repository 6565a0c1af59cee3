"""Partial tree reads (the Tree explorer's): the skeleton's numbers, the nodes added since a read,
and full nodes by id, each checked against the whole tree as `Store.load_tree` reads it."""

from __future__ import annotations

from doubles import ScriptedGenerator, SnapshotLineEnv

from engine.actions import CompositeAction
from engine.config import SearchConfig
from engine.search.runner import new_run
from engine.store import Store
from engine.store.runs import NODES_PER_QUERY
from engine.tree_nodes import Simulation


def _searched(path):
    """A real search (scripted model) of four tasks; returns the id of the biggest tree."""
    with Store(path) as store:
        env = SnapshotLineEnv()
        cfg = SearchConfig(simulations=6, k=3, depth_limit=5)
        run_id, _ = new_run(store, "line", env.tasks()[:4], ScriptedGenerator(), cfg, "t", make_env=SnapshotLineEnv)
        return max((len(store.load_tree(t).nodes), t) for t, _ in store.tree_ids(run_id))[1]


def _grow(store: Store, tree_id: int, parent: int, n: int) -> list[int]:
    """What a running search commits: `n` children of `parent`, one simulation through the last."""
    tree = store.load_tree(tree_id)
    first_new = len(tree.nodes)
    for i in range(n):
        tree.add_child(tree.nodes[parent], observation=f"new {first_new + i}",
                       action=CompositeAction(thought="t", command=f"cmd {first_new + i}"), critic_rank=i,
                       Q_critic=0.25, terminal="failure" if i == 0 else None)
    path_ids = tuple(p.id for p in tree.path(tree.nodes[-1]))
    tree.backpropagate(list(path_ids), 1.0)
    tree.simulations.append(Simulation(path_ids, 1.0))
    store.save_simulation(tree_id, tree, tree.simulations[-1], first_new)
    return list(range(first_new, len(tree.nodes)))


def test_skeleton_has_the_full_trees_numbers(tmp_path) -> None:
    tree_id = _searched(tmp_path / "o.db")
    with Store(tmp_path / "o.db", readonly=True) as store:
        tree = store.load_tree(tree_id)
        sk = store.tree_skeleton(tree_id)
    nodes = tree.nodes
    assert len(sk) == len(nodes) > 5
    assert sk.node_id == [n.id for n in nodes]
    assert sk.parent == [n.parent for n in nodes] and sk.depth == [n.depth for n in nodes]
    assert sk.n == [n.N for n in nodes] and sk.value_sum == [n.value_sum for n in nodes]
    assert sk.q_critic == [n.Q_critic for n in nodes] and sk.critic_rank == [n.critic_rank for n in nodes]
    assert sk.terminal == [n.terminal for n in nodes]
    assert (sk.task_id, sk.goal) == (tree.task.id, tree.task.goal)
    assert sk.simulations == len(tree.simulations) and sk.solved == tree.solved()
    assert any(q is None for q in sk.q_critic) and any(q is not None for q in sk.q_critic)


def test_incremental_read_returns_exactly_the_new_nodes(tmp_path) -> None:
    db = tmp_path / "o.db"
    tree_id = _searched(db)
    with Store(db, readonly=True) as reader:
        before = reader.tree_skeleton(tree_id)
        assert len(reader.tree_skeleton(tree_id, after=len(before) - 1)) == 0  # nothing new yet
        with Store(db) as writer:
            new = _grow(writer, tree_id, parent=3, n=4)
        since = reader.tree_skeleton(tree_id, after=len(before) - 1)
        full = reader.tree_skeleton(tree_id)
        visits = reader.tree_visits(tree_id)
    assert new == list(range(len(before), len(before) + 4))
    assert since.node_id == new
    assert since.parent == [3] * 4 and since.critic_rank == [0, 1, 2, 3]
    assert since.terminal == ["failure", None, None, None] and since.q_critic == [0.25] * 4
    assert since.simulations == before.simulations + 1
    cut = len(before)
    for column in ("parent", "depth", "n", "value_sum", "q_critic", "critic_rank", "terminal"):
        assert getattr(since, column) == getattr(full, column)[cut:], column
    # older nodes' visits changed along the simulation's path: tree_visits has them all
    assert visits == (full.n, full.value_sum) and full.n[0] == before.n[0] + 1 and full.n[3] == before.n[3] + 1


def test_load_nodes_reads_the_full_nodes_asked_for(tmp_path) -> None:
    db = tmp_path / "o.db"
    tree_id = _searched(db)
    with Store(db) as store:
        _grow(store, tree_id, parent=0, n=NODES_PER_QUERY + 20)  # more ids than one query binds
        tree = store.load_tree(tree_id)
        every = store.load_nodes(tree_id, range(len(tree.nodes) + 5))  # unknown ids are left out
        some = store.load_nodes(tree_id, [4, 2, 2])
    assert sorted(every) == list(range(len(tree.nodes))) and sorted(some) == [2, 4]
    for n in tree.nodes:
        got = every[n.id]
        assert got.children == []
        assert (got.observation, got.action, got.raw, got.format_error, got.critic_reason) == (
            n.observation, n.action, n.raw, n.format_error, n.critic_reason)
        assert (got.parent, got.depth, got.N, got.value_sum, got.logprob, got.n_tokens) == (
            n.parent, n.depth, n.N, n.value_sum, n.logprob, n.n_tokens)
        assert got.Q_critic == n.Q_critic
    with Store(db, readonly=True) as store:
        store_texts = store.node_texts(tree_id)
    texts = [(n.id, n.action, n.raw) for n in tree.nodes]
    assert store_texts == texts


def test_tree_summaries_count_each_trees_nodes_and_successes(tmp_path) -> None:
    db = tmp_path / "o.db"
    _searched(db)
    with Store(db) as store:
        (run,) = store.runs()
        store.create_run("empty", "line", "none", {}, SnapshotLineEnv().tasks()[:2])  # trees without nodes
        summaries = store.tree_summaries(run.id)
        trees = [store.load_tree(t) for t, _ in store.tree_ids(run.id)]
        empty = store.tree_summaries(store.find_run("empty"))
    assert [s.task_id for s in summaries] == [t.task.id for t in trees] == run.task_ids
    for s, tree in zip(summaries, trees, strict=True):
        assert (s.goal, s.simulations, s.solved) == (tree.task.goal, len(tree.simulations), tree.solved())
        assert s.nodes == len(tree.nodes) and s.max_depth == max(n.depth for n in tree.nodes)
        assert s.successes == sum(n.terminal == "success" for n in tree.nodes)
    assert any(s.successes for s in summaries)
    assert [(s.nodes, s.successes, s.simulations, s.solved) for s in empty] == [(0, 0, 0, False)] * 2


def test_a_stored_tree_that_is_not_as_written_is_a_one_line_store_error_not_a_hang(tmp_path) -> None:
    """Rows edited outside Orchard (a shared PostgreSQL, a copied file): a parent cycle would make every
    walk to the root loop for ever, a malformed action or rollout raised KeyError / IndexError."""
    import pytest

    from engine.store import StoreError

    tree_id = _searched(tmp_path / "o.db")
    with Store(tmp_path / "o.db") as store:
        n = len(store.load_tree(tree_id).nodes)
        cases = [
            (f"UPDATE nodes SET parent_id={n - 1} WHERE tree_id={tree_id} AND node_id=1", "node 1: parent .* not an earlier"),
            (f"UPDATE nodes SET parent_id={n + 5} WHERE tree_id={tree_id} AND node_id=2", "node 2: parent .* not an earlier"),
            (f"UPDATE nodes SET parent_id=0 WHERE tree_id={tree_id} AND node_id=0", "node 0: parent '0'"),
            (f"UPDATE nodes SET action='[1]' WHERE tree_id={tree_id} AND node_id=1", "node 1: unreadable"),
            (f"UPDATE nodes SET action='{{\"thought\": \"x\"}}' WHERE tree_id={tree_id} AND node_id=1", "node 1: unreadable"),
            (f"UPDATE simulations SET rollout='{{\"turns\": [[\"a\"]]}}' WHERE tree_id={tree_id}", "simulation 0: unreadable"),
        ]
        for sql, why in cases:
            store.con.execute("BEGIN")
            store.con.execute(sql)
            try:
                with pytest.raises(StoreError, match=f"tree {tree_id}, {why}"):
                    store.load_tree(tree_id)
                if "parent" in why:
                    with pytest.raises(StoreError, match=f"tree {tree_id}, {why}"):
                        store.tree_skeleton(tree_id)
            finally:
                store.con.execute("ROLLBACK")
        assert len(store.load_tree(tree_id).nodes) == n  # untouched by the rolled-back edits
