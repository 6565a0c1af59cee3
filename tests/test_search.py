"""MCTS per docs/algorithms.md §2: UCB1, backprop, eq. 10, critic mapping, batching, replay == snapshot."""

import json
import math
import re
from dataclasses import replace

import pytest
from doubles import LineEnv, ScriptedGenerator, SnapshotLineEnv
from fuzz_data import env_rewards

from engine.actions import CompositeAction
from engine.config import ConfigError, SearchConfig
from engine.envs.base import EnvError, Step, TaskSpec
from engine.search.critic import rank_to_score
from engine.search.mcts import MCTS, select_child, start_tree, ucb_score
from engine.search.runner import new_run, resume_run
from engine.store import Store, StoreError
from engine.tree_nodes import SearchTree


def _tree_with_children(stats):
    """Root with children whose (N, value_sum, Q_critic) are given."""
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    for n, vs, qc in stats:
        child = tree.add_child(tree.root, observation="o", action=CompositeAction("t", "wait"), Q_critic=qc)
        child.N, child.value_sum = n, vs
    tree.root.N = sum(n for n, _, _ in stats)
    return tree


def test_ucb1_hand_worked_example():
    # N(h) = 3 + 1 = 4; ln 4 = 1.386294
    # child 1: Q~ = 2/3 = .666667, explore = sqrt(1.386294 / 4) = .588705 -> 1.255372
    # child 2: Q~ = 0,            explore = sqrt(1.386294 / 2) = .832555 -> 0.832555
    tree = _tree_with_children([(3, 2.0, 0.0), (1, 0.0, 1.0)])
    c1, c2 = (tree.nodes[i] for i in tree.root.children)
    assert ucb_score(c1, 4, 1.0, c1.Q_mcts) == pytest.approx(2 / 3 + math.sqrt(math.log(4) / 4))
    assert ucb_score(c2, 4, 1.0, c2.Q_mcts) == pytest.approx(math.sqrt(math.log(4) / 2))
    assert select_child(tree, tree.root, SearchConfig(c_exp=1.0)).id == c1.id
    # a larger exploration constant flips it: c=3 gives 0.667 + 1.766 = 2.433 vs 2.498 -> child 2
    assert select_child(tree, tree.root, SearchConfig(c_exp=3.0)).id == c2.id
    # with eq. 10 values in selection (alpha .5): child1 = .5*.667 + .5*0 = .333 + .589 = .922;
    # child2 = .5*0 + .5*1 = .5 + .833 = 1.333 -> child 2
    assert select_child(tree, tree.root, SearchConfig(selection_value="combined")).id == c2.id


def test_unvisited_children_first_ties_by_critic():
    tree = _tree_with_children([(5, 5.0, 1.0), (0, 0.0, 0.3), (0, 0.0, 0.9), (0, 0.0, 0.9)])
    ids = tree.root.children
    assert select_child(tree, tree.root, SearchConfig()).id == ids[2]  # first of the 0.9 ties


def test_backprop_is_running_mean_eq8():
    tree = _tree_with_children([(0, 0.0, None)])
    child = tree.nodes[1]
    grand = tree.add_child(child, observation="o2", action=CompositeAction("t", "wait"))
    q = 0.0
    for i, r in enumerate([1.0, 0.0, 0.0, 1.0]):
        tree.backpropagate([child.id, grand.id], r)
        q = (q * i + r) / (i + 1)  # eq. 8
        assert child.Q_mcts == pytest.approx(q)
        assert grand.N == i + 1
    assert child.Q_mcts == pytest.approx(0.5) and tree.root.N == 4


def test_eq10_value_and_critic_mapping():
    tree = _tree_with_children([(4, 3.0, 0.25)])
    child = tree.nodes[1]
    assert child.value(0.5) == pytest.approx(0.5 * 0.75 + 0.5 * 0.25)
    assert child.value(1.0) == pytest.approx(0.75)
    assert child.value(0.0) == pytest.approx(0.25)
    assert [rank_to_score(r, 4) for r in range(4)] == pytest.approx([1, 2 / 3, 1 / 3, 0])
    assert rank_to_score(0, 1) == 1.0
    assert [rank_to_score(r, 3, "reciprocal") for r in range(3)] == pytest.approx([1, 1 / 2, 1 / 3])
    with pytest.raises(ValueError):
        rank_to_score(4, 4)


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="alpha"):
        SearchConfig(alpha=1.5)
    with pytest.raises(ConfigError, match="critic_mapping"):
        SearchConfig(critic_mapping="cubic")


def _search(env_cls, gen, cfg, n_tasks=6):
    env = env_cls()
    jobs = [start_tree(t, env_cls, cfg.simulations) for t in env.tasks()[:n_tasks]]
    stats = MCTS(gen, cfg).run(jobs)
    return jobs, stats


def _shape(tree):
    return [(n.parent, n.action.command if n.action else None, n.N, round(n.value_sum, 9), n.Q_critic,
             n.terminal, n.observation) for n in tree.nodes]


def test_search_invariants_and_success():
    cfg = SearchConfig(simulations=12, k=3, depth_limit=6)
    jobs, stats = _search(SnapshotLineEnv, ScriptedGenerator(), cfg)
    assert stats.simulations == 12 * 6
    for job in jobs:
        tree = job.tree
        assert tree.check_invariants() == []
        assert len(tree.simulations) == 12
        for n in tree.nodes:
            assert n.depth <= cfg.depth_limit
            kids = [tree.nodes[c].action.command for c in n.children if tree.nodes[c].action]
            assert len(kids) == len(set(kids)), "identical commands must be deduplicated"
            if n.children and len(kids) > 1:
                ranks = sorted(tree.nodes[c].critic_rank for c in n.children)
                assert ranks == list(range(len(ranks)))
    assert sum(j.tree.solved() for j in jobs) >= 3  # goals 1..3 are easy for a right-biased walk


def test_replay_gives_the_same_trees_as_snapshots():
    cfg = SearchConfig(simulations=10, k=3, depth_limit=6, seed=7)
    snap_jobs, snap_stats = _search(SnapshotLineEnv, ScriptedGenerator(), cfg)
    replay_jobs, replay_stats = _search(LineEnv, ScriptedGenerator(), cfg)
    assert snap_stats.replays == 0 and snap_stats.restores > 0
    assert replay_stats.replays > 0
    for a, b in zip(snap_jobs, replay_jobs):
        assert _shape(a.tree) == _shape(b.tree)


def test_all_trees_requests_share_one_batch_per_round():
    gen = ScriptedGenerator()
    cfg = SearchConfig(simulations=4, k=4, depth_limit=5, trees_in_flight=16)
    _, stats = _search(SnapshotLineEnv, gen, cfg, n_tasks=8)
    assert len(gen.calls) == stats.rounds
    assert gen.calls[0] == 8  # the first round: every tree's expansion in one call
    assert max(gen.calls) == 8 and sum(gen.calls) == stats.requests
    # trees_in_flight bounds the batch
    gen2 = ScriptedGenerator()
    _search(SnapshotLineEnv, gen2, SearchConfig(simulations=4, k=4, depth_limit=5, trees_in_flight=3), n_tasks=8)
    assert max(gen2.calls) == 3


def test_bad_model_output_becomes_format_error_nodes():
    gen = ScriptedGenerator(p_garbage=0.5)
    cfg = SearchConfig(simulations=8, k=4, depth_limit=5)
    jobs, _ = _search(SnapshotLineEnv, gen, cfg, n_tasks=3)
    errors = [n for j in jobs for n in j.tree.nodes if n.format_error]
    assert errors, "garbage completions must show up as format-error nodes"
    for n in errors:
        assert n.terminal == "format_error" and n.reward == 0.0 and n.Q_critic == 0.0
        assert n.observation.startswith("Format error")
    for j in jobs:
        assert j.tree.check_invariants() == []


def test_critic_off_leaves_no_scores():
    cfg = SearchConfig(simulations=4, k=3, depth_limit=4, critic=False)
    jobs, _ = _search(SnapshotLineEnv, ScriptedGenerator(), cfg, n_tasks=2)
    assert all(n.Q_critic is None for j in jobs for n in j.tree.nodes)


def test_tree_json_roundtrip_and_networkx():
    cfg = SearchConfig(simulations=6, k=3, depth_limit=5)
    (job,), _ = _search(SnapshotLineEnv, ScriptedGenerator(), cfg, n_tasks=1)
    doc = job.tree.to_json({"id": "r", "env": "line", "model": "scripted", "config": {}})
    again = SearchTree.from_json(doc)
    assert _shape(again) == _shape(job.tree)
    assert again.check_invariants() == []
    g = job.tree.to_networkx()
    assert g.number_of_nodes() == len(job.tree.nodes) and g.number_of_edges() == len(job.tree.nodes) - 1


def test_progress_backup_backs_up_the_latched_progress_of_each_episode():
    """backup="progress": a failed episode backs up how far it got (LineEnv: furthest position / goal);
    "reward" (the default) backs up 0 for it. Successes back up 1 either way."""
    cfg = SearchConfig(simulations=10, k=3, depth_limit=3, seed=4)
    shaped_jobs, _ = _search(SnapshotLineEnv, ScriptedGenerator(p_right=0.5), replace(cfg, backup="progress"), 3)
    plain_jobs, _ = _search(SnapshotLineEnv, ScriptedGenerator(p_right=0.5), cfg, 3)
    partial = 0
    for shaped, plain in zip(shaped_jobs, plain_jobs, strict=True):
        assert shaped.tree.check_invariants() == [] and plain.tree.check_invariants() == []
        for sim in plain.tree.simulations:
            assert sim.reward in (0.0, 1.0)
        for sim in shaped.tree.simulations:
            assert 0.0 <= sim.reward <= 1.0
            env = SnapshotLineEnv()  # replay the episode: its latched progress is the value backed up
            env.reset(shaped.tree.task.id)
            nodes = [shaped.tree.nodes[i] for i in sim.path]
            commands = [n.action.command for n in nodes if n.action is not None] + [
                c for c in sim.rollout if not c.startswith("<format error")]
            steps = [env.step(c) for c in commands]
            expected = max([s.reward for s in steps[-1:]] + [s.progress or 0.0 for s in steps] + [0.0])
            assert sim.reward == pytest.approx(expected)
            partial += 0.0 < sim.reward < 1.0
    assert partial > 0  # some episodes failed part-way and now carry their progress


def test_backup_must_be_known():
    with pytest.raises(ConfigError, match="backup"):
        SearchConfig(backup="vibes")


class _HostileRewardEnv(SnapshotLineEnv):
    """The line env, except that the step onto position 1 reports the given reward and progress."""

    values: tuple = (0.0, None)

    def step(self, command):
        s = super().step(command)
        if self.pos == 1 and command == "right":
            return Step(s.observation, reward=self.values[0], done=s.done, progress=self.values[1])
        return s


@pytest.mark.parametrize(("reward", "progress", "expect"), env_rewards())
def test_hostile_env_rewards_fail_clearly_or_are_clamped(tmp_path, reward, progress, expect):
    """tests/data/fuzz/env_rewards.json: a non-finite reward or progress is one EnvError naming env,
    task and step, the run is left interrupted with the reason and resumes once the env is fixed;
    finite values outside [0, 1] are clamped (docs/decisions.md)."""
    env_cls = type("Hostile", (_HostileRewardEnv,), {"values": (reward, progress)})
    cfg = SearchConfig(simulations=6, k=3, depth_limit=4)
    tasks = SnapshotLineEnv().tasks()[1:3]  # goal-2 and goal-3: position 1 is not the goal
    with Store(tmp_path / "o.db") as store:
        if expect == "error":
            with pytest.raises(EnvError) as err:
                new_run(store, "line", tasks, ScriptedGenerator(p_right=1.0), cfg, "t", make_env=env_cls)
            msg = str(err.value)
            (info,) = store.runs()
            assert re.fullmatch(r"env line: task 'goal-\d', step 1 \('right'\): (reward|progress) .+ is not a "
                                r"finite number \(the env or its server is broken\); run \w+ is left interrupted: "
                                rf"fix the env, then `orchard search --resume {info.id}`", msg), msg
            assert info.status == "interrupted" and msg.startswith(info.stats["error"])
            resume_run(store, info.id, ScriptedGenerator(), make_env=SnapshotLineEnv)  # the env fixed
            (info,) = store.runs()
            assert info.status == "finished" and info.simulations == 12
            return
        run_id, _ = new_run(store, "line", tasks, ScriptedGenerator(p_right=1.0), cfg, "t", make_env=env_cls)
        for tree_id, _ in store.tree_ids(run_id):
            tree = store.load_tree(tree_id)
            assert tree.check_invariants() == []
            (first,) = [n for n in tree.nodes if n.depth == 1 and n.action and n.action.command == "right"]
            assert [first.reward, first.progress] == expect
            assert all(0.0 <= n.reward <= 1.0 and (n.progress is None or 0.0 <= n.progress <= 1.0)
                       for n in tree.nodes if n.reward is not None)


@pytest.mark.parametrize("mapping", ["linear", "reciprocal"])
def test_exported_q_critic_is_the_mapping_of_the_rank_format_errors_tied_last(tmp_path, mapping):
    """Issue: a format-error candidate got rank len(valid) but Q^ 0.0, so an exported tree where rank 1
    of 4 carried 0.0 contradicted the rank -> score mapping. Now format errors tie last (rank K-1 of the
    expansion's K candidates) and every exported node's Q^ is mapping(rank, K), via the store and CLI."""
    from engine.cli import main

    db = tmp_path / "o.db"
    cfg = SearchConfig(simulations=8, k=4, depth_limit=4, critic_mapping=mapping)
    with Store(db) as store:
        tasks = SnapshotLineEnv().tasks()[:3]
        run_id, _ = new_run(store, "line", tasks, ScriptedGenerator(p_garbage=0.4), cfg, "ranks",
                            make_env=SnapshotLineEnv)
        assert all(store.load_tree(tid).check_invariants() == [] for tid, _ in store.tree_ids(run_id))
    mixed = 0
    for task in tasks:
        out = tmp_path / f"{task.id}.json"
        assert main(["export", "tree", run_id, "--task", task.id, "--format", "json", "-o", str(out), "--db", str(db)]) == 0
        doc = json.loads(out.read_text())
        assert doc["run"]["config"]["critic_mapping"] == mapping
        nodes = doc["nodes"]
        k_of = {p: sum(1 for n in nodes if n["parent"] == p) for p in {n["parent"] for n in nodes}}
        for n in nodes:
            if n["critic_rank"] is None:
                continue
            k = k_of[n["parent"]]
            assert n["Q_critic"] == pytest.approx(rank_to_score(n["critic_rank"], k, mapping)), n
            if n["format_error"]:
                assert n["critic_rank"] == k - 1
                mixed += any(m["parent"] == n["parent"] and not m["format_error"] for m in nodes)
    assert mixed, "the search must produce format errors beside readable candidates"


def test_invariants_catch_a_format_error_not_tied_last():
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    for rank in (0, 1):
        tree.add_child(tree.root, observation="o", action=CompositeAction("t", f"c{rank}"), critic_rank=rank)
    errors = [tree.add_child(tree.root, observation="Format error", format_error="no ACTION", critic_rank=3)
              for _ in range(2)]
    assert tree.check_invariants() == []  # K = 4 candidates: both errors tie at rank 3
    for e in errors:
        e.critic_rank = 2  # the old rule: len(valid)
    assert tree.check_invariants() == [f"node {e.id}: format error with critic rank 2, not 3 (tied last)"
                                       for e in errors]


def _counting_saves(store):
    """Wrap `store.save_simulations` to record each transaction's size."""
    batches: list[int] = []
    save = store.save_simulations

    def counting(batch):
        batches.append(len(batch))
        save(batch)

    store.save_simulations = counting  # type: ignore[method-assign]
    return batches


def test_the_simulations_one_round_finishes_commit_together_and_load_back_whole(tmp_path):
    """engine/search/runner.py: one transaction per batch of replies, not per simulation; the stored trees
    are the searched ones (rows were taken when each simulation ended, not when the batch committed)."""
    cfg = SearchConfig(simulations=6, k=3, depth_limit=4)
    tasks = SnapshotLineEnv().tasks()[:4]
    with Store(tmp_path / "o.db") as store:
        batches = _counting_saves(store)
        run_id, _ = new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "t", make_env=SnapshotLineEnv)
        assert sum(batches) == 6 * len(tasks)
        assert max(batches) > 1 and len(batches) < sum(batches)  # trees ending in the same round share a commit
        for tree_id, _ in store.tree_ids(run_id):
            tree = store.load_tree(tree_id)
            assert tree.check_invariants() == []
            assert tree.nodes[0].N == 6 and len(tree.simulations) == 6
            assert sum(n.N for n in tree.nodes if n.parent == 0) == 6


def test_the_commit_clock_holds_simulations_until_it_ticks_and_the_end_commits_the_rest(tmp_path):
    """runner.COMMIT_EVERY_S: with a clock longer than the run, no transaction until the run ends, then one
    with every simulation; with 0, a transaction after every batch of replies (more than one)."""
    cfg = SearchConfig(simulations=4, k=3, depth_limit=4)
    tasks = SnapshotLineEnv().tasks()[:3]
    with Store(tmp_path / "o.db") as store:
        batches = _counting_saves(store)
        seen: list[int] = []

        def progress(job, sim):  # what a reader of the store sees while the run goes on
            seen.append(len(batches))

        run_id, _ = new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "t",
                            make_env=SnapshotLineEnv, progress=progress, commit_every=3600.0)
        assert set(seen) == {0} and batches == [4 * len(tasks)]
        assert all(store.load_tree(t).nodes[0].N == 4 for t, _ in store.tree_ids(run_id))
        batches.clear()
        new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "t2", make_env=SnapshotLineEnv,
                commit_every=0.0)
        assert sum(batches) == 4 * len(tasks) and len(batches) > 1


def _stored(store, run_id):
    """Each tree's nodes (parent, command, N, value sum) and simulations, by task: what two runs compare on."""
    out = {}
    for tree_id, task_id in store.tree_ids(run_id):
        tree = store.load_tree(tree_id)
        nodes = [(n.parent, n.action.command if n.action else None, n.N, round(n.value_sum, 9)) for n in tree.nodes]
        out[task_id] = (nodes, [list(s.path) for s in tree.simulations])
    return out


def test_the_commit_thread_stores_the_trees_the_inline_commits_store(tmp_path):
    """runner writer="thread": the same trees as committing on the search's thread, every simulation stored
    before the run is finished, and the commits' time counted on the commit thread, not the search's."""
    cfg = SearchConfig(simulations=5, k=3, depth_limit=4, seed=3)
    tasks = SnapshotLineEnv().tasks()[:4]
    with Store(tmp_path / "o.db") as store:
        inline, _ = new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "a", make_env=SnapshotLineEnv)
        threaded, stats = new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "b",
                                  make_env=SnapshotLineEnv, writer="thread")
        assert store.run(threaded).status == "finished" and store.run(threaded).simulations == 5 * len(tasks)
        assert _stored(store, threaded) == _stored(store, inline)
        assert stats.writer_s > 0 and stats.to_dict()["writer_s"] == stats.writer_s
    with pytest.raises(ValueError, match="writer must be one of inline, thread"), Store(tmp_path / "o.db") as store:
        new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "c", make_env=SnapshotLineEnv,
                    writer="threads")


def test_a_commit_thread_that_fails_stops_the_run_with_one_line(tmp_path, monkeypatch):
    """A write refused on the commit thread (disk full, a lost server) is raised on the search's thread as a
    StoreError naming it, not lost in the thread; the run is left interrupted, and resume completes it."""
    cfg = SearchConfig(simulations=4, k=3, depth_limit=4)
    tasks = SnapshotLineEnv().tasks()[:3]
    save = Store.save_simulations
    calls: list[int] = []

    def failing(self, batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise StoreError("database or disk is full")
        save(self, batch)

    monkeypatch.setattr(Store, "save_simulations", failing)
    with Store(tmp_path / "o.db") as store:
        with pytest.raises(StoreError, match="^committing the search's simulations: database or disk is full$"):
            new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "t", make_env=SnapshotLineEnv,
                    writer="thread")
        (run,) = store.runs()
        assert store.run(run.id).status == "interrupted"
        monkeypatch.setattr(Store, "save_simulations", save)
        resume_run(store, run.id, ScriptedGenerator(p_right=0.5), make_env=SnapshotLineEnv)
        assert all(store.load_tree(t).nodes[0].N == 4 for t, _ in store.tree_ids(run.id))


@pytest.mark.parametrize("writer", ["inline", "thread"])
def test_a_failure_commits_every_finished_simulation_however_long_the_clock(tmp_path, writer):
    """A cancel raised from progress (as a job's cancel is) stops the run; what finished is stored, not lost
    to the clock, and resume completes the trees from there."""
    cfg = SearchConfig(simulations=4, k=3, depth_limit=4)
    tasks = SnapshotLineEnv().tasks()[:3]
    with Store(tmp_path / "o.db") as store:
        done: list[int] = []

        def progress(job, sim):
            done.append(1)
            if len(done) == 5:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "t", make_env=SnapshotLineEnv,
                    progress=progress, commit_every=3600.0, writer=writer)
        (run,) = store.runs()
        run_id = run.id
        assert store.run(run_id).status == "interrupted"
        trees = [store.load_tree(t) for t, _ in store.tree_ids(run_id)]
        assert sum(tree.nodes[0].N for tree in trees if tree is not None) == 5
        resume_run(store, run_id, ScriptedGenerator(p_right=0.5), make_env=SnapshotLineEnv)
        assert all(store.load_tree(t).nodes[0].N == 4 for t, _ in store.tree_ids(run_id))


def test_a_cancel_while_the_commit_thread_fails_leaves_the_run_interrupted_and_says_so(tmp_path, monkeypatch):
    """A cancel (raised from progress) whose final commit fails on the commit thread: the cancel is what
    propagates, and the run is still recorded interrupted (a run left "running" cannot be claimed or
    steered), its error naming what was not stored."""
    cfg = SearchConfig(simulations=4, k=3, depth_limit=4)
    tasks = SnapshotLineEnv().tasks()[:3]

    def failing(self, batch):
        raise StoreError("database or disk is full")

    def progress(job, sim):
        raise KeyboardInterrupt

    monkeypatch.setattr(Store, "save_simulations", failing)
    with Store(tmp_path / "o.db") as store:
        with pytest.raises(KeyboardInterrupt):
            new_run(store, "line", tasks, ScriptedGenerator(p_right=0.5), cfg, "t", make_env=SnapshotLineEnv,
                    progress=progress, commit_every=3600.0, writer="thread")
        (run,) = store.runs()
        info = store.run(run.id)
        assert info.status == "interrupted"
        assert "not stored: committing the search's simulations: database or disk is full" in info.stats["error"]
