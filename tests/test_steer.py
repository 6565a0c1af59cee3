"""Steering a stored tree (engine/search/steer.py, issue 28): a human branch gives the child the policy
would have given with that action (env restored by snapshot and by replay alike), bad input stores
nothing, and "search here" / "more candidates" keep the search's invariants on the grown tree."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

import pytest
from doubles import LineEnv, ScriptedGenerator, SnapshotLineEnv, action_text

from engine.actions import render
from engine.config import ConfigError, SearchConfig
from engine.envs.base import EnvError, Step
from engine.errors import UsageError
from engine.jobs.kinds import load_job
from engine.llm.base import Completion, SampleRequest
from engine.progress import MemoryReporter
from engine.search.export import tree_json
from engine.search.runner import new_run
from engine.search.steer import HumanBranch, MoreCandidates, SearchHere, human_action, probe_action, run_steer
from engine.store import Store, schema
from engine.tree_nodes import SearchTree

TASK = "goal-3"


class OneCommand:
    """A policy that always proposes `command` (critic questions: the first candidate)."""

    name = "one-command"

    def __init__(self, command: str) -> None:
        self.command = command

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        out = []
        for r in requests:
            critic = "CANDIDATES:" in r.prompt[-1]["content"]
            text = "REASON: first.\nBEST: 1" if critic else action_text(self.command)
            out.append([Completion(text=text, logprob=-1.0, n_tokens=5) for _ in range(r.n)])
        return out


class BoomEnv(SnapshotLineEnv):
    """Refuses the command 'boom' with an EnvError (an env's own refusal)."""

    def step(self, command: str) -> Step:
        if command == "boom":
            raise EnvError("boom is not allowed here")
        return super().step(command)


def _run(store: Store, generator, make_env=SnapshotLineEnv, simulations: int = 2, k: int = 1, name: str = "r") -> str:
    env = LineEnv()
    run_id, _ = new_run(store, "line", [env.task(TASK)], generator,
                        SearchConfig(simulations=simulations, k=k, depth_limit=6), name, make_env=make_env)
    return run_id


def _tree(store: Store, run_id: str) -> SearchTree:
    tree = store.load_tree(store.tree_id(run_id, TASK))
    assert tree is not None
    return tree


def _same_step(a, b) -> None:
    assert (a.depth, a.observation, a.reward, a.progress, a.terminal, a.action.command) == (
        b.depth, b.observation, b.reward, b.progress, b.terminal, b.action.command)


@pytest.mark.parametrize("make_env", [SnapshotLineEnv, LineEnv], ids=["snapshot", "replay"])
def test_a_human_action_gives_the_child_the_policy_gives_with_that_action(tmp_path, make_env):
    with Store(tmp_path / "o.db") as store:
        policy = _tree(store, _run(store, OneCommand("right"), make_env, simulations=2, name="policy"))
        run_id = _run(store, OneCommand("wait"), make_env, simulations=1, name="human")
        before = _tree(store, run_id)
        reporter = MemoryReporter()
        # the policy run's first step ("right") typed as a whole composite action at the root
        run_steer(store, HumanBranch(run=run_id, task=TASK, at=0, action=render(policy.nodes[1].action)), reporter,
                  generator=OneCommand("wait"), make_env=make_env)
        tree = _tree(store, run_id)
        human = tree.nodes[len(before.nodes)]
        assert human.author == "human" and human.parent == 0 and human.raw == render(policy.nodes[1].action)
        _same_step(human, policy.nodes[1])
        # a bare command at the human node itself: the env is restored through a human step
        run_steer(store, HumanBranch(run=run_id, task=TASK, at=human.id, action="right"), reporter,
                  generator=OneCommand("wait"), make_env=make_env)
        tree = _tree(store, run_id)
        second = tree.nodes[-1]
        assert second.author == "human" and second.parent == human.id
        _same_step(second, policy.nodes[2])
        assert [n.author for n in tree.nodes[:len(before.nodes)]] == ["policy"] * len(before.nodes)
        assert tree.check_invariants() == []
        assert len(tree.simulations) == len(before.simulations) + 2  # each branch backed up by one rollout
        assert tree.nodes[human.id].N == 2 and tree.root.N == len(tree.simulations)
        assert reporter.progress_rows[-1]["step"] == 1 and reporter.progress_rows[-1]["run_id"] == run_id
        assert probe_action(store, HumanBranch(run=run_id, task=TASK, at=0, action="left"),
                            make_env=make_env) == "You are at -1."
        assert len(_tree(store, run_id).nodes) == len(tree.nodes)  # a probe stores nothing
        doc = json.loads(tree_json(tree, store.run(run_id)))
        assert [n["author"] for n in doc["nodes"]].count("human") == 2
        assert SearchTree.from_json(doc).nodes[human.id].author == "human"


def _snapshot(store: Store, run_id: str):
    tree = _tree(store, run_id)
    return len(tree.nodes), len(tree.simulations), [(n.N, n.value_sum) for n in tree.nodes], store.run(run_id).status


BAD = [
    (HumanBranch(run="r", task=TASK, at=0, action="THOUGHT: no command here"), UsageError, "no ACTION section"),
    (HumanBranch(run="r", task=TASK, at=0, action="right\nleft"), UsageError, "one line"),
    (HumanBranch(run="r", task=TASK, at=0, action="ACTION: right\nSTATUS: MAYBE"), UsageError, "unknown STATUS"),
    (HumanBranch(run="r", task=TASK, at=99, action="right"), UsageError, "node 99: no such node"),
    (HumanBranch(run="r", task="goal-9", at=0, action="right"), Exception, "no task 'goal-9'"),
    (HumanBranch(run="nosuch", task=TASK, at=0, action="right"), Exception, "no run 'nosuch'"),
    (HumanBranch(run="r", task=TASK, at=0, action="boom"), EnvError, "node 0: the env refused 'boom'"),
    (HumanBranch(run="r", task=TASK, at=0, action="right"), UsageError, "already has the child"),
    (SearchHere(run="r", task=TASK, at=99, simulations=2), UsageError, "no such node"),
]


@pytest.mark.parametrize(("spec", "error", "words"), BAD, ids=[b[2] for b in BAD])
def test_bad_input_is_one_line_naming_it_and_stores_nothing(tmp_path, spec, error, words):
    with Store(tmp_path / "o.db") as store:
        run_id = _run(store, OneCommand("right"), BoomEnv, simulations=1)
        before = _snapshot(store, run_id)
        with pytest.raises(error) as e:
            run_steer(store, spec, MemoryReporter(), generator=OneCommand("wait"), make_env=BoomEnv)
        message = str(e.value)
        assert words in message and "\n" not in message
        assert _snapshot(store, run_id) == before


def test_a_terminal_node_and_a_running_run_are_refused(tmp_path):
    with Store(tmp_path / "o.db") as store:
        run_id = _run(store, OneCommand("right"), simulations=4)
        tree = _tree(store, run_id)
        done = next(n for n in tree.nodes if n.terminal == "success")
        with pytest.raises(UsageError, match="terminal \\(success\\)"):
            run_steer(store, SearchHere(run=run_id, task=TASK, at=done.id), MemoryReporter(),
                      generator=OneCommand("wait"), make_env=SnapshotLineEnv)
        store.set_run_status(run_id, "running")
        with pytest.raises(UsageError, match="being searched"):
            run_steer(store, SearchHere(run=run_id, task=TASK, at=0), MemoryReporter(),
                      generator=OneCommand("wait"), make_env=SnapshotLineEnv)


def test_a_second_steer_while_the_first_loads_its_model_is_refused_and_the_status_comes_back(tmp_path, monkeypatch):
    """The run is claimed before the model loads (which can take minutes): a second job on the run is refused
    then, not after both loaded, when its commit would collide with the first's nodes."""
    import threading

    from engine.search import steer

    loading, go_on = threading.Event(), threading.Event()

    def slow_load(target, spec, reporter):  # the first job's model load, held until the second has tried
        loading.set()
        assert go_on.wait(30)
        return OneCommand("right")

    with Store(tmp_path / "o.db") as store:
        run_id = _run(store, OneCommand("right"), simulations=2)
        store.set_run_status(run_id, "interrupted")
    monkeypatch.setattr(steer, "generator_for", slow_load)
    out: list[object] = []

    def first() -> None:
        with Store(tmp_path / "o.db") as store:
            out.append(run_steer(store, SearchHere(run=run_id, task=TASK, at=0, simulations=2), MemoryReporter(),
                                 make_env=SnapshotLineEnv))

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert loading.wait(30)
        with Store(tmp_path / "o.db") as store:
            assert store.run(run_id).status == "running"
            with pytest.raises(UsageError, match="being searched"):
                run_steer(store, SearchHere(run=run_id, task=TASK, at=0, simulations=2), MemoryReporter(),
                          generator=OneCommand("right"), make_env=SnapshotLineEnv)
    finally:
        go_on.set()
        thread.join(30)
    assert len(out) == 1 and "2 simulations at node 0" in out[0].lines[0]  # type: ignore[attr-defined]
    with Store(tmp_path / "o.db") as store:
        assert store.run(run_id).status == "interrupted"  # what it was before the steer
        assert len(_tree(store, run_id).simulations) == 4


def _ends_at(tree: SearchTree) -> list[int]:
    """Simulations that ended at each node (its own terminal visits; the root: those with an empty path)."""
    out = [0] * len(tree.nodes)
    for s in tree.simulations:
        out[s.path[-1] if s.path else 0] += 1
    return out


def _descendants(tree: SearchTree, node: int) -> set[int]:
    out, todo = set(), [node]
    while todo:
        n = todo.pop()
        out.add(n)
        todo += tree.nodes[n].children
    return out


def test_search_here_grows_the_subtree_and_keeps_every_invariant(tmp_path):
    with Store(tmp_path / "o.db") as store:
        run_id = _run(store, ScriptedGenerator(p_right=0.5), simulations=4, k=3)
        before = _tree(store, run_id)
        at = next(n for n in before.nodes if n.depth == 1 and n.terminal is None)
        ancestors = [0, *[n.id for n in before.path(at)]]
        reporter = MemoryReporter()
        run_steer(store, SearchHere(run=run_id, task=TASK, at=at.id, simulations=6), reporter,
                  generator=ScriptedGenerator(p_right=0.5), make_env=SnapshotLineEnv)
        tree = _tree(store, run_id)
        assert tree.check_invariants() == []
        ends = _ends_at(tree)
        for n in tree.nodes:  # a node's N = its children's N + the simulations that ended at it
            assert n.N == sum(tree.nodes[c].N for c in n.children) + ends[n.id], n.id
        for nid in ancestors:  # every ancestor and the node itself counted the 6 simulations (eq. 8)
            assert tree.nodes[nid].N == before.nodes[nid].N + 6
        new = set(range(len(before.nodes), len(tree.nodes)))
        assert new and new <= _descendants(tree, at.id)
        assert all(tree.nodes[i].author == "policy" for i in new)
        steps = [p["step"] for p in reporter.progress_rows if p.get("phase", "").startswith("search at node")]
        assert steps[-1] == 6 and steps == sorted(steps)
        assert store.run(run_id).status == "finished"  # back to what it was


def test_more_candidates_ranks_old_and_new_together(tmp_path):
    with Store(tmp_path / "o.db") as store:
        run_id = _run(store, ScriptedGenerator(p_right=0.5), simulations=3, k=1)
        before = _tree(store, run_id)
        old = list(before.root.children)
        gen = ScriptedGenerator(p_right=0.2)
        run_steer(store, MoreCandidates(run=run_id, task=TASK, at=0, k=6), MemoryReporter(), generator=gen,
                  make_env=SnapshotLineEnv)
        tree = _tree(store, run_id)
        kids = [tree.nodes[c] for c in tree.root.children]
        assert len(kids) > len(old)
        commands = [n.action.command for n in kids if n.action]
        assert len(commands) == len(set(commands))  # a repeat of an existing child is dropped
        assert sorted(n.critic_rank for n in kids) == list(range(len(kids)))  # old and new ranked together
        assert tree.check_invariants() == []
        assert len(tree.simulations) == len(before.simulations) + 1


def test_job_specs_load_and_refuse_bad_fields():
    spec = load_job("search_here", {"run": "r", "task": "t", "at": 3, "simulations": 5})
    assert spec == SearchHere(run="r", task="t", at=3, simulations=5)
    assert load_job("add_action", {"run": "r", "task": "t", "at": 0, "action": "go"}).action == "go"
    assert load_job("more_candidates", {"run": "r", "task": "t", "at": 1}).k is None
    for kind, config, words in [
        ("search_here", {"run": "r", "task": "t", "at": -1}, "'at'"),
        ("search_here", {"run": "r", "task": "t", "at": 0, "simulations": 0}, "'simulations'"),
        ("add_action", {"run": "r", "task": "t", "at": 0, "action": "  "}, "'action'"),
        ("more_candidates", {"run": "r", "task": "t", "at": 0, "k": 0}, "'k'"),
    ]:
        with pytest.raises(ConfigError, match=words):
            load_job(kind, config)


def test_human_action_reads_commands_and_composites_with_the_policys_parser():
    assert human_action("  craft stick  ", "here").command == "craft stick"
    composite = human_action("THOUGHT: need sticks\nACTION: craft 4 stick\nSTATUS: CONTINUE", "here")
    assert (composite.thought, composite.command) == ("need sticks", "craft 4 stick")
    with pytest.raises(UsageError, match="^here: the action is empty"):
        human_action(" ", "here")


def test_schema_8_adds_the_author_column_and_old_nodes_are_the_policys(tmp_path):
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    for version, sql in schema.MIGRATIONS:
        if version <= 7:
            con.executescript(sql)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.executemany("INSERT INTO meta VALUES (?, ?)", [("app", "orchard"), ("schema_version", "7")])
    con.execute("INSERT INTO runs VALUES ('r1','old','line','m','{}','[\"goal-1\"]','finished',0,0,NULL)")
    con.execute("INSERT INTO trees (run_id, position, task_id, goal, context, split) "
                "VALUES ('r1',0,'goal-1','g','','train')")
    con.execute("INSERT INTO observations VALUES ('h','start')")
    con.execute("INSERT INTO nodes VALUES (1,0,NULL,0,NULL,NULL,NULL,'h',0,0,NULL,NULL,NULL,NULL,NULL,NULL,NULL,0,0,0)")
    con.commit()
    con.close()
    with Store(path) as store:
        assert store.schema_version == schema.SCHEMA_VERSION >= 8
        tree = store.load_tree(1)
        assert tree is not None and tree.root.author == "policy"


def test_a_seeded_human_branch_is_reproducible(tmp_path):
    trees = []
    for name in ("a", "b"):
        with Store(tmp_path / f"{name}.db") as store:
            run_id = _run(store, ScriptedGenerator(), simulations=2, k=2)
            tree = _tree(store, run_id)
            taken = {tree.nodes[c].action.command for c in tree.root.children}
            free = next(c for c in ("left", "right", "wait") if c not in taken)
            run_steer(store, HumanBranch(run=run_id, task=TASK, at=0, action=free), MemoryReporter(),
                      generator=ScriptedGenerator(), make_env=SnapshotLineEnv)
            trees.append([(n.observation, n.N, n.value_sum) for n in _tree(store, run_id).nodes])
    assert trees[0] == trees[1]  # same seeds, same tree


def test_a_human_branch_beside_format_errors_keeps_the_critic_ranks_consistent(tmp_path):
    with Store(tmp_path / "o.db") as store:
        run_id = _run(store, ScriptedGenerator(p_garbage=0.5), simulations=3, k=4)
        tree = _tree(store, run_id)
        at = next(n for n in tree.nodes if n.terminal is None and any(tree.nodes[c].format_error for c in n.children))
        taken = {tree.nodes[c].action.command for c in at.children if tree.nodes[c].action}
        free = next(c for c in ("left", "right", "wait") if c not in taken)
        run_steer(store, HumanBranch(run=run_id, task=TASK, at=at.id, action=free), MemoryReporter(),
                  generator=ScriptedGenerator(), make_env=SnapshotLineEnv)
        grown = _tree(store, run_id)
        assert grown.nodes[-1].author == "human" and grown.nodes[-1].critic_rank is None
        assert grown.check_invariants() == []
        run_steer(store, MoreCandidates(run=run_id, task=TASK, at=at.id, k=2), MemoryReporter(),
                  generator=ScriptedGenerator(p_garbage=0.5), make_env=SnapshotLineEnv)
        again = _tree(store, run_id)
        assert again.check_invariants() == []
        assert again.nodes[grown.nodes[-1].id].critic_rank is not None  # ranked with the rest now

