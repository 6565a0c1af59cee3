"""Pairs with provenance and hygiene (issue 28 item 4; docs/decisions.md "Pairs carry their sources"):
each pair's source equals the tree's node values, same-command pairs are refused and counted,
duplicates (same prompt, same two commands) are one pair that keeps every source — within a build and
across runs in the store — and exports carry the provenance columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv
from test_pairs import DESC, add, new_tree

from engine.actions import parse
from engine.cli import main
from engine.config import SearchConfig
from engine.datasets.formats import dpo_rows, write_rows
from engine.datasets.pairs import SOURCE_FIELDS, PairsConfig, build_pairs, command_key
from engine.datasets.samples import TreeRef, tree_refs
from engine.search.runner import new_run
from engine.store import Store
from engine.train.dpo import DPOTrainConfig, select_pairs
from engine.tree_nodes import SearchTree


def human_tree() -> tuple[SearchTree, dict[str, int]]:
    """Root with four explored children: a person's `right` (best), the policy's `RIGHT` (the same
    command, spelled otherwise), `left` (worst) and `wait`; critic scores on three of them."""
    tree = new_tree()
    ids = {
        "human": add(tree, 0, "right", N=3, value_sum=3.0, q_critic=1.0),
        "policy_right": add(tree, 0, "right", N=2, value_sum=0.5, q_critic=0.5),
        "left": add(tree, 0, "left", N=4, value_sum=0.0, q_critic=0.0),
        "wait": add(tree, 0, "wait", N=1, value_sum=0.5),
    }
    tree.nodes[ids["human"]].author = "human"
    node = tree.nodes[ids["policy_right"]]
    node.action = parse(node.raw.replace("ACTION: right", "ACTION:   RIGHT"))
    node.raw = None  # its text is the canonical rendering of the respelled action
    return tree, ids


def test_same_command_pairs_are_refused_and_counted() -> None:
    tree, ids = human_tree()
    assert command_key(tree, ids["human"]) == command_key(tree, ids["policy_right"]) == "command:right"
    built = build_pairs([TreeRef(tree, "run1", 1, DESC, model="m", seed=3)], PairsConfig(alpha=0.5, theta=0.1))
    sides = {(p.chosen_node, p.rejected_node) for p in built.step}
    assert (ids["human"], ids["policy_right"]) not in sides and (ids["policy_right"], ids["human"]) not in sides
    assert [(r.chosen_node, r.rejected_node, r.command) for r in built.refused] == [
        (ids["human"], ids["policy_right"], "command:right")]
    assert built.counts()["refused_same_command"] == 1
    for p in built.step:  # what was built differs in the command the env would get
        assert parse(p.chosen).command.lower().split() != parse(p.rejected).command.lower().split()


def test_provenance_equals_the_trees_node_values() -> None:
    tree, ids = human_tree()
    alpha = 0.3
    built = build_pairs([TreeRef(tree, "run1", 1, DESC, model="policy-7b", seed=11)], PairsConfig(alpha=alpha))
    assert built.step
    for p in built.step:
        assert p.provenance["pair_id"] == p.id and p.provenance["chosen_node"] == p.chosen_node
        for src in p.sources:
            assert set(src) == set(SOURCE_FIELDS)
            assert (src["run_id"], src["tree_id"], src["task_id"], src["node_id"]) == ("run1", 1, tree.task.id, p.node_id)
            assert src["alpha"] == alpha
            assert src["margin"] == pytest.approx(src["q_chosen"] - src["q_rejected"])
            for side in ("chosen", "rejected"):
                nid = src[f"{side}_node"]
                node = tree.nodes[nid]
                assert src[f"q_{side}"] == node.value(alpha)
                assert src[f"q_mcts_{side}"] == node.Q_mcts and src[f"q_critic_{side}"] == node.Q_critic
                assert src[f"visits_{side}"] == node.N
                human = node.author == "human"
                assert src[f"author_{side}"] == ("human" if human else "policy")
                assert (src[f"model_{side}"], src[f"seed_{side}"]) == ((None, None) if human else ("policy-7b", 11))
    assert any(p.sources[0]["author_chosen"] == "human" for p in built.step)
    # The person's `right` and the policy's `RIGHT` against `left`: one pair (the same prompt and commands), two sources.
    (merged,) = [p for p in built.step if len(p.sources) > 1]
    assert [(s["chosen_node"], s["rejected_node"]) for s in merged.sources] == [(ids["human"], ids["left"]),
                                                                                (ids["policy_right"], ids["left"])]
    assert built.merged == 1


def test_trajectory_pairs_carry_provenance_and_a_human_step_marks_its_side() -> None:
    tree = new_tree()
    r1 = add(tree, 0, "right")
    win = add(tree, r1, "right", reward=1.0, terminal="success")
    lose = add(tree, 0, "left", reward=0.0, terminal="failure")
    tree.nodes[r1].author = "human"
    (p,) = build_pairs([TreeRef(tree, "r", 1, DESC, model="m", seed=1)], PairsConfig()).trajectory
    src = p.provenance
    assert (src["chosen_node"], src["rejected_node"], src["margin"]) == (win, lose, 1.0)
    assert (src["author_chosen"], src["model_chosen"], src["author_rejected"], src["model_rejected"]) == (
        "human", None, "policy", "m")


def test_duplicates_within_a_build_are_one_pair_with_every_source() -> None:
    """The same tree in two runs (same prompts, same commands): one pair per duplicate, both runs' sources."""
    tree, _ = human_tree()
    once = build_pairs([TreeRef(tree, "a", 1, DESC)], PairsConfig())
    twice = build_pairs([TreeRef(tree, "a", 1, DESC), TreeRef(tree, "b", 2, DESC)], PairsConfig())
    assert [p.id for p in twice.step] == [p.id for p in once.step]
    assert twice.merged == 2 * once.merged + once.pairs and twice.counts()["merged_duplicates"] == twice.merged
    for p, alone in zip(twice.step, once.step, strict=True):
        k = len(alone.sources)
        assert [(s["run_id"], s["tree_id"]) for s in p.sources] == [("a", 1)] * k + [("b", 2)] * k
        assert p.sources[0]["pair_id"] == p.id and len({s["pair_id"] for s in p.sources}) == 2 * k


def _search(store: Store, name: str, seed: int = 0) -> str:
    env = SnapshotLineEnv()
    run_id, _ = new_run(store, "line", env.tasks()[:2], ScriptedGenerator(p_right=0.5, p_garbage=0.1),
                        SearchConfig(simulations=8, k=3, depth_limit=4, seed=seed), name, make_env=SnapshotLineEnv)
    return run_id


def test_duplicates_across_runs_are_merged_in_the_store_keeping_every_source(tmp_path: Path) -> None:
    """Two runs that searched alike build the same pairs: the store keeps one pair, a source per run, and
    the second run's filter, counts and DPO selection see it once; each run's rebuild keeps the other's."""
    desc = SnapshotLineEnv().describe()
    config = PairsConfig(alpha=0.5, theta=0.1)
    with Store(tmp_path / "o.db") as store:
        a, b = _search(store, "first"), _search(store, "second")
        built_a = build_pairs(tree_refs(store, a, desc), config)
        built_b = build_pairs(tree_refs(store, b, desc), config)
        assert built_a.step and len(built_a.step) == len(built_b.step)
        assert built_a.step[0].provenance["model_chosen"] == store.run(a).model  # from the run's settings
        assert built_a.step[0].provenance["seed_chosen"] == store.run(a).config["seed"] == 0
        first = built_a.save(store, a)[0]
        report = built_b.save(store, b)[0]
        assert first.created == built_a.pairs
        assert (report.created, report.merged) == (0, built_b.pairs)
        stored = store.pairs(kind=["step", "trajectory"])
        assert len(stored) == built_a.pairs
        for p in stored:
            assert p.run_id == a and [s["run_id"] for s in p.sources] == [a, b]
            assert p.sources[0]["pair_id"] == p.id
        assert {p.id for p in store.pairs(run_id=b, kind=["step", "trajectory"])} == {p.id for p in stored}
        assert store.pair_counts(run_id=b, kind=["step", "trajectory"])["total"] == len(stored)
        picked = select_pairs(store, DPOTrainConfig(include_pending=True, kinds=("step", "trajectory")), [a, b])
        assert sorted(p.id for p in picked) == sorted(p.id for p in stored)  # trained once, not once per run

        again = build_pairs(tree_refs(store, b, desc), config).save(store, b)[0]
        assert (again.created, again.merged, again.pruned) == (0, built_b.pairs, 0)
        assert all(len(p.sources) == 2 for p in store.pairs(kind=["step", "trajectory"]))
        # Run a's build no longer makes them: the pairs stay, because run b still does.
        gone = store.save_pairs(a, [])
        assert (gone.pruned, gone.kept_for_other_runs) == (0, len(stored))
        assert all([s["run_id"] for s in p.sources] == [b] for p in store.pairs(kind=["step", "trajectory"]))
        assert store.save_pairs(b, []).pruned == len(stored) and not store.pairs()


def test_a_swapped_pair_is_not_the_merge_target_of_the_original_direction(tmp_path: Path) -> None:
    desc = SnapshotLineEnv().describe()
    with Store(tmp_path / "o.db") as store:
        a, b = _search(store, "first"), _search(store, "second")
        built_a = build_pairs(tree_refs(store, a, desc), PairsConfig())
        built_a.save(store, a)
        target = store.pairs(kind="step")[0]
        store.swap_pair(target.id, "ann", target.version)
        report = build_pairs(tree_refs(store, b, desc), PairsConfig()).save(store, b)[0]
        assert (report.created, report.merged) == (1, built_a.pairs - 1)
        assert len(store.pair(target.id).sources) == 1  # still the build it came from, no more


def test_duplicates_in_one_save_are_merged_there_and_stay_merged_on_a_rebuild(tmp_path: Path) -> None:
    """A caller that saves unmerged pairs (step_pairs directly): the store merges them, and again the same way."""
    from engine.datasets.pairs import step_pairs
    from engine.envs.base import TaskSpec

    tree, _ = human_tree()
    with Store(tmp_path / "o.db") as store:
        run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id=tree.task.id, goal=tree.task.goal)])
        ((tree_id, _),) = store.tree_ids(run_id)
        pairs = step_pairs(TreeRef(tree, run_id, tree_id, DESC), PairsConfig())
        first = store.save_pairs(run_id, pairs)
        assert (first.created, first.merged) == (len(pairs) - 1, 1)  # the person's and the policy's right vs left
        again = store.save_pairs(run_id, pairs)
        assert (again.created, again.unchanged, again.merged, again.pruned) == (0, len(pairs) - 1, 1, 0)
        stored = store.pairs(run_id=run_id)
        assert len(stored) == len(pairs) - 1 and max(len(p.sources) for p in stored) == 2
        assert sum(len(p.sources) for p in stored) == len(pairs)  # every source kept


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_exports_carry_the_provenance_columns_and_every_source(tmp_path: Path, suffix: str) -> None:
    import datasets

    tree, _ = human_tree()
    built = build_pairs([TreeRef(tree, "a", 1, DESC, model="m", seed=5), TreeRef(tree, "b", 2, DESC, model="m", seed=6)],
                        PairsConfig())
    rows = dpo_rows(built.step)
    path = write_rows(rows, tmp_path / f"dpo{suffix}")
    ds = datasets.load_dataset("parquet" if suffix == ".parquet" else "json", data_files=str(path), split="train")
    assert {"prompt", "chosen", "rejected"} <= set(ds.column_names)  # what TRL's DPOTrainer reads
    extra = {"margin", "alpha", "q_mcts_chosen", "q_critic_rejected", "visits_chosen", "model_rejected",
             "seed_chosen", "author_chosen", "author_rejected", "n_sources", "sources"}
    assert extra <= set(ds.column_names)
    for row, p in zip(ds, built.step, strict=True):
        src = p.provenance
        assert (row["margin"], row["visits_chosen"], row["author_chosen"], row["seed_rejected"]) == (
            pytest.approx(src["margin"]), src["visits_chosen"], src["author_chosen"], src["seed_rejected"])
        runs = [s["run_id"] for s in p.sources]
        assert row["n_sources"] == len(runs) and [s["run_id"] for s in row["sources"]] == runs
        assert runs.count("a") == runs.count("b") >= 1  # each run's own source, kept
        seeds = [None if s["author_chosen"] == "human" else {"a": 5, "b": 6}[s["run_id"]] for s in p.sources]
        assert [s["seed_chosen"] for s in row["sources"]] == seeds


def test_the_cli_export_carries_the_provenance_columns(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    desc = SnapshotLineEnv().describe()
    with Store(db) as store:
        a = _search(store, "first")
        build_pairs(tree_refs(store, a, desc), PairsConfig()).save(store, a)
        want = {p.id: p for p in store.pairs(kind="step")}
    out = tmp_path / "pairs.jsonl"
    assert main(["export", "pairs", a, "--status", "pending", "--out", str(out), "--db", str(db)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and len(rows) == len(want)
    for row in rows:
        src = want[row["id"]].provenance
        assert row["n_sources"] == 1 and row["sources"][0]["pair_id"] == row["id"]
        assert (row["q_mcts_chosen"], row["visits_rejected"], row["model_chosen"]) == (
            src["q_mcts_chosen"], src["visits_rejected"], src["model_chosen"])
