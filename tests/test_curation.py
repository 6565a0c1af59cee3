"""Curation in the store: migration 2, optimistic concurrency, validated edits, one-transaction bulk
changes, rebuilds that keep curated rows, sample loss toggles, and the dataset CLI end to end."""

from __future__ import annotations

import argparse
import json
import sqlite3
from dataclasses import replace

import pytest
from doubles import ScriptedGenerator, SnapshotLineEnv
from test_pairs import _two_outcome_tree, add
from test_revisions import Judge, spliced_tree

from engine.cli import data as cli_commands
from engine.config import SearchConfig
from engine.datasets.formats import ImportFormatError
from engine.datasets.pairs import PairsConfig, build_pairs
from engine.datasets.revisions import RevisionConfig, build_revisions
from engine.datasets.samples import TreeRef
from engine.envs.base import TaskSpec
from engine.search.runner import new_run
from engine.store import ConflictError, EditError, Store, StoreError
from engine.store import schema as store_module  # the migrations live in engine.store.schema

VALID = "THOUGHT: go on.\nACTION: right\nEXPLANATION: closer.\nSTATUS: CONTINUE"


@pytest.fixture
def db(new_db):
    """An open store on each backend (SQLite, PostgreSQL: tests/pg_fixture.py)."""
    store = Store(new_db())
    yield store
    store.close()


def _run(store: Store, task_ids=("goal-3",)) -> tuple[str, dict[str, int]]:
    tasks = [TaskSpec(id=t, goal="reach position 3") for t in task_ids]
    run_id = store.create_run("r", "line", "scripted", {"alpha": 0.5}, tasks)
    return run_id, {task: tid for tid, task in store.tree_ids(run_id)}


def _pairs(run_id: str, tree_ids: dict[str, int]):
    tree, ids = _two_outcome_tree()
    tree.nodes[ids["r1"]].Q_critic = 1.0
    add(tree, 0, "left", N=2, value_sum=0.0, q_critic=0.0)
    add(tree, ids["r1"], "wait", N=1, value_sum=0.0, q_critic=0.0)
    built = build_pairs([TreeRef(tree, run_id, tree_ids["goal-3"], "desc")], PairsConfig())
    return built.step + built.trajectory


def test_tree_order_follows_the_pairs_content_not_their_run_salted_ids(db):
    """Two runs with the same trees train on their pairs in the same order (ids hash the run id)."""
    orders = []
    for _ in range(2):
        run_id, trees = _run(db)
        db.save_pairs(run_id, _pairs(run_id, trees))
        got = db.pairs(run_id=run_id, order="tree")
        assert len({p.node_id for p in got}) < len(got)  # some node holds several pairs: ties to break
        orders.append([(p.kind, p.node_id, p.chosen_node, p.rejected_node) for p in got])
    assert orders[0] == orders[1]
    assert orders[0] == sorted(orders[0], key=lambda o: (o[1], o[2], o[3]))


def test_migration_2_upgrades_a_version_1_database_in_place(new_db, monkeypatch):
    path = new_db()
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:1])
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 1)
    with Store(path) as old:
        run_id, _ = _run(old)
        assert old.schema_version == 1
    monkeypatch.undo()
    with Store(path) as new:
        assert new.schema_version == store_module.SCHEMA_VERSION and new.find_run(run_id) == run_id
        tables = new.table_names()
        assert {"pairs", "pair_history", "samples", "sample_history"} <= tables


def test_save_query_filter_and_count(db):
    run_id, trees = _run(db)
    pairs = _pairs(run_id, trees)
    report = db.save_pairs(run_id, pairs)
    assert report.created == len(pairs) and str(report) == f"{len(pairs)} created"
    assert db.pair_counts(run_id=run_id) == {"pending": len(pairs), "approved": 0, "rejected": 0, "edited": 0,
                                             "total": len(pairs)}
    step = [p for p in pairs if p.kind == "step"]
    assert {p.id for p in db.pairs(run_id=run_id, kind="step")} == {p.id for p in step}
    assert {p.id for p in db.pairs(depth_min=1, depth_max=1)} == {p.id for p in step if p.depth == 1}
    assert {p.id for p in db.pairs(min_gap=0.6)} == {p.id for p in pairs if p.gap >= 0.6}
    assert len(db.pairs(task_id="goal-3", limit=2)) == 2 and len(db.pairs(limit=2, offset=len(pairs) - 1)) == 1
    assert db.pairs(task_id="nope") == []
    gaps = [p.gap for p in db.pairs(order="gap")]
    assert gaps == sorted(gaps, reverse=True) and len(gaps) == len(pairs)
    stored = db.pair(step[0].id)
    assert (stored.status, stored.version, stored.prompt, stored.chosen) == ("pending", 1, step[0].prompt,
                                                                               step[0].chosen)
    with pytest.raises(StoreError, match="unknown pair filter"):
        db.pairs(colour="red")
    with pytest.raises(StoreError, match="unknown pair order"):
        db.pairs(order="colour")
    with pytest.raises(StoreError, match="no pair"):
        db.pair("nope")


def test_stale_versions_are_refused_never_overwritten(new_db):
    path = new_db()
    with Store(path) as alice, Store(path) as bob:
        run_id, trees = _run(alice)
        pid = _pairs(run_id, trees)[0].id
        alice.save_pairs(run_id, _pairs(run_id, trees))
        seen_by_alice = alice.pair(pid).version
        bob.set_pair_status(pid, "approved", "bob", bob.pair(pid).version)
        with pytest.raises(ConflictError, match=rf"pair {pid} was changed by bob at \d{{4}}-.*; reload"):
            alice.set_pair_status(pid, "rejected", "alice", seen_by_alice)
        with pytest.raises(ConflictError):
            alice.edit_pair(pid, VALID, "x", "alice", seen_by_alice)
        with pytest.raises(ConflictError):
            alice.swap_pair(pid, "alice", seen_by_alice)
        now = alice.pair(pid)
        assert (now.status, now.updated_by, now.version) == ("approved", "bob", 2)
        assert [h.action for h in alice.pair_history(pid)] == ["create", "approve"]


def test_edits_are_validated_as_composite_actions(db):
    run_id, trees = _run(db)
    pairs = _pairs(run_id, trees)
    db.save_pairs(run_id, pairs)
    step = next(p for p in pairs if p.kind == "step")
    with pytest.raises(EditError, match="edited chosen is not a composite action: no ACTION section"):
        db.edit_pair(step.id, "I would go right.", step.rejected, "ann", 1)
    with pytest.raises(EditError, match="same text"):
        db.edit_pair(step.id, VALID, VALID, "ann", 1)
    assert db.pair(step.id).version == 1  # refused edits change nothing
    edited = db.edit_pair(step.id, VALID, step.rejected, "ann", 1)
    assert (edited.chosen, edited.rejected, edited.status, edited.version) == (VALID, step.rejected, "edited", 2)
    (_, entry) = db.pair_history(step.id)
    assert entry.action == "edit" and entry.before["chosen"] == step.chosen and entry.after["chosen"] == VALID
    traj = next(p for p in pairs if p.kind == "trajectory")
    with pytest.raises(EditError, match="only step pairs"):
        db.edit_pair(traj.id, VALID, traj.rejected, "ann", 1)
    with pytest.raises(EditError, match="cannot be set directly"):
        db.set_pair_status(step.id, "edited", "ann", 2)


def test_swap_exchanges_everything_about_the_two_sides(db):
    run_id, trees = _run(db)
    pairs = _pairs(run_id, trees)
    db.save_pairs(run_id, pairs)
    p = pairs[0]
    s = db.swap_pair(p.id, "ann", 1)
    assert (s.chosen, s.rejected, s.chosen_node, s.rejected_node) == (p.rejected, p.chosen, p.rejected_node,
                                                                      p.chosen_node)
    assert (s.q_chosen, s.logprob_chosen, s.status) == (p.q_rejected, p.logprob_rejected, "edited")
    assert db.pair_history(p.id)[-1].action == "swap"


def test_bulk_status_is_one_transaction(db):
    run_id, trees = _run(db)
    pairs = _pairs(run_id, trees)
    db.save_pairs(run_id, pairs)
    if db.dialect == "sqlite":
        db.con.execute(
            "CREATE TEMP TRIGGER boom BEFORE INSERT ON pair_history WHEN NEW.action = 'approve' AND "
            "(SELECT COUNT(*) FROM pair_history WHERE action = 'approve') >= 2 BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )
    else:
        db.con.execute(
            "CREATE FUNCTION boom() RETURNS trigger AS $$ BEGIN IF NEW.action = 'approve' AND (SELECT COUNT(*) "
            "FROM pair_history WHERE action = 'approve') >= 2 THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END "
            "$$ LANGUAGE plpgsql")
        db.con.execute("CREATE TRIGGER boom BEFORE INSERT ON pair_history FOR EACH ROW EXECUTE FUNCTION boom()")
    with pytest.raises((sqlite3.IntegrityError, StoreError), match="boom"):
        db.bulk_set_pair_status("approved", "ann", run_id=run_id)
    assert db.pair_counts(run_id=run_id)["approved"] == 0  # all or nothing
    db.con.execute("DROP TRIGGER boom" + ("" if db.dialect == "sqlite" else " ON pair_history"))
    step = [p for p in pairs if p.kind == "step"]
    assert db.bulk_set_pair_status("approved", "ann", run_id=run_id, kind="step") == len(step)
    assert db.bulk_set_pair_status("approved", "ann", run_id=run_id, kind="step") == 0  # already so
    assert db.pair_counts(run_id=run_id, status="approved")["total"] == len(step)
    assert db.pair(step[0].id).version == 2 and db.pair_history(step[0].id)[-1].who == "ann"


def test_rebuild_keeps_curated_rows_refreshes_untouched_ones_and_prunes_leftovers(db):
    run_id, trees = _run(db)
    pairs = _pairs(run_id, trees)
    assert len(pairs) >= 4
    db.save_pairs(run_id, pairs)
    a, b, c, d = pairs[:4]
    db.set_pair_status(a.id, "approved", "ann", 1)
    db.swap_pair(b.id, "ann", 1)
    db.set_pair_status(c.id, "rejected", "ann", 1)
    db.set_pair_status(c.id, "pending", "ann", 2)  # touched, then reset: still a person's decision

    report = db.save_pairs(run_id, pairs)
    assert (report.created, report.kept, report.unchanged, report.updated) == (0, 3, len(pairs) - 3, 0)
    assert db.pair(a.id).status == "approved" and db.pair(b.id).chosen == b.rejected

    grown = [replace(p, q_chosen=p.q_chosen + 0.01) for p in pairs]  # the tree grew: values moved
    report = db.save_pairs(run_id, grown)
    assert (report.kept, report.updated) == (3, len(pairs) - 3)
    assert db.pair(d.id).q_chosen == d.q_chosen + 0.01 and db.pair(d.id).version == 2
    assert db.pair(a.id).q_chosen == a.q_chosen  # curated rows are left exactly as they were
    assert db.pair_history(d.id)[-1].action == "rebuild"

    report = db.save_pairs(run_id, grown[:1] + grown[4:])  # a stricter theta: b, c, d are gone
    assert (report.pruned, report.stale_curated) == (1, 2)
    with pytest.raises(StoreError, match="no pair"):
        db.pair(d.id)
    assert db.pair(b.id).status == "edited" and db.pair(c.id).status == "pending"


def test_samples_loss_toggles_status_and_rebuild(db):
    run_id, _ = _run(db)
    tree, _ = spliced_tree()
    built = build_revisions([TreeRef(tree, run_id, None, "desc")], Judge({"b2": "Judgement: Bad"}),
                            RevisionConfig())
    report = db.save_samples(built.samples, prune_run=run_id, prune_kinds=("revision", "good", "recovery"))
    assert report.created == len(built.samples)
    assert db.sample_counts(kind="revision")["total"] == len(built.revision)
    rev = db.samples(kind="revision", run_id=run_id)[0]
    assert rev.turns == next(s for s in built.revision if s.id == rev.id).turns and rev.version == 1
    assert rev.source["judgements"]

    bad = next(i for i, t in enumerate(rev.turns) if t.loss is False)
    flipped = db.set_turn_loss(rev.id, bad, True, "ann", 1)
    assert flipped.turns[bad].loss is True and flipped.status == "edited" and flipped.version == 2
    with pytest.raises(ConflictError, match=f"sample {rev.id} was changed by ann"):
        db.set_turn_loss(rev.id, bad, None, "bob", 1)
    with pytest.raises(EditError, match="no turn 99"):
        db.set_turn_loss(rev.id, 99, True, "ann", 2)
    assert db.set_sample_status(rev.id, "approved", "ann", 2).status == "approved"
    assert [h.action for h in db.sample_history(rev.id)] == ["create", "edit", "approve"]

    report = db.save_samples(built.samples, prune_run=run_id, prune_kinds=("revision", "good", "recovery"))
    assert report.kept == 1 and db.sample(rev.id).turns[bad].loss is True
    report = db.save_samples([], prune_run=run_id, prune_kinds=("recovery",))
    assert report.pruned == len(built.recovery) and db.sample_counts(kind="recovery")["total"] == 0


# --- CLI ---------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    """The dataset commands as engine.cli wires them (add_parsers + add_export_parsers)."""
    p = argparse.ArgumentParser(prog="orchard")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export")
    esub = e.add_subparsers(dest="what", required=True)
    cli_commands.add_export_parsers(esub, common)
    cli_commands.add_parsers(sub, common)
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_build_curate_rebuild_export_import(tmp_path, new_db, monkeypatch, capsys):
    from engine.envs import registry
    from engine.llm import registry as llm_registry

    monkeypatch.setitem(registry.BUILTIN, "line", "doubles:SnapshotLineEnv")
    monkeypatch.setattr(llm_registry, "load_generator", lambda spec, log=print: Judge())
    db = new_db()
    with Store(db) as store:
        env = SnapshotLineEnv()
        run_id, _ = new_run(store, "line", env.tasks()[:3], ScriptedGenerator(p_garbage=0.1),
                            SearchConfig(simulations=12, k=3, depth_limit=5), "cli-run", make_env=SnapshotLineEnv)

    assert _cli(["pairs", "build", "cli-run", "--db", db]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id}: 3 trees ->" in out and "created" in out and db in out
    with Store(db) as store:
        pairs = store.pairs(run_id=run_id, kind="step")
        assert pairs
        store.set_pair_status(pairs[0].id, "approved", "ann", 1)
        store.set_pair_status(pairs[1].id, "rejected", "ann", 1)
    assert _cli(["pairs", "build", run_id, "--db", db]) == 0
    assert "2 kept" in capsys.readouterr().out

    out_file = tmp_path / "approved.jsonl"
    assert _cli(["export", "pairs", run_id, "--status", "approved", "--out", str(out_file), "--db", db]) == 0
    assert "exported 1 DPO rows from 1 pairs" in capsys.readouterr().out
    (row,) = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert row["id"] == pairs[0].id and row["status"] == "approved"
    assert _cli(["export", "pairs", "--out", str(tmp_path / "all.parquet"), "--db", db]) == 0
    assert f"exported {len(pairs) - 1} DPO rows" in capsys.readouterr().out  # rejected ones stay out

    assert _cli(["revisions", "build", run_id, "--model", "judge", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "revision trajectories" in out and "batched calls" in out
    for what, extra in (("sft", []), ("sft", ["--per-step"]), ("agentgym", [])):
        target = tmp_path / f"{what}{len(extra)}.jsonl"
        assert _cli(["export", what, "--kind", "revision,good,rft", "--out", str(target), "--db", db, *extra]) == 0
        assert str(target) in capsys.readouterr().out and target.stat().st_size > 0

    with Store(db) as store:
        before = store.sample_counts()["total"]
    assert _cli(["import", str(tmp_path / "agentgym0.jsonl"), "--db", db]) == 0
    assert "as kind imported" in capsys.readouterr().out
    with Store(db) as store:
        imported = store.sample_counts(kind="imported")["total"]
        assert imported > 0 and store.sample_counts()["total"] == before + imported

    bad = tmp_path / "bad.jsonl"
    lines = (tmp_path / "agentgym0.jsonl").read_text().splitlines()
    bad.write_text("\n".join([*lines[:2], '{"conversations": [{"from": "robot", "value": "x"}]}', *lines[2:]]))
    with pytest.raises(ImportFormatError, match=r"bad.jsonl:3: conversations\[0\].from: unknown role 'robot'"):
        _cli(["import", str(bad), "--kind", "refine", "--db", db])
    with Store(db) as store:
        assert store.sample_counts(kind="refine")["total"] == 0  # nothing partially imported
    assert _cli(["import", str(bad.with_name("agentgym0.jsonl")), "--dry-run", "--db", db]) == 0
    assert "nothing written" in capsys.readouterr().out


def test_pairs_build_saves_pairs_and_rft_rows_in_one_transaction(new_db, monkeypatch):
    """A kill between the two saves once left the pairs committed without their RFT rows."""
    from engine.envs import registry

    monkeypatch.setitem(registry.BUILTIN, "line", "doubles:SnapshotLineEnv")
    db = new_db()
    with Store(db) as store:
        new_run(store, "line", SnapshotLineEnv().tasks()[:2], ScriptedGenerator(),
                SearchConfig(simulations=12, k=3, depth_limit=5), "r", make_env=SnapshotLineEnv)

    def killed(self, *a, **kw):
        raise KeyboardInterrupt  # stands for the process dying after the pairs were saved

    monkeypatch.setattr(Store, "save_samples", killed)
    with pytest.raises(KeyboardInterrupt):
        _cli(["pairs", "build", "r", "--db", db])
    with Store(db) as store:
        assert store.pair_counts()["total"] == 0 and store.sample_counts()["total"] == 0
    monkeypatch.undo()
    monkeypatch.setitem(registry.BUILTIN, "line", "doubles:SnapshotLineEnv")
    assert _cli(["pairs", "build", "r", "--db", db]) == 0
    with Store(db) as store:
        assert store.pair_counts()["total"] > 0 and store.sample_counts(kind="rft")["total"] > 0


def test_a_nested_transaction_is_a_savepoint_of_the_outer_one(new_db):
    with Store(new_db()) as store:
        with store.transaction() as con:
            con.execute("INSERT INTO meta VALUES ('a', '1')")
            with pytest.raises(RuntimeError), store.transaction() as inner:
                inner.execute("INSERT INTO meta VALUES ('b', '2')")
                raise RuntimeError("inner fails")
            with store.transaction() as inner:
                inner.execute("INSERT INTO meta VALUES ('c', '3')")
        keys = {k for (k,) in store.con.execute("SELECT key FROM meta")}
        assert {"a", "c"} <= keys and "b" not in keys and not store.con.in_transaction


def test_a_save_returns_the_version_it_wrote_not_a_later_one(new_db, monkeypatch):
    """The load test (bench/curation_load.py) found saves reporting another curator's version: the
    row was re-read after the commit, so a save that landed in between came back as if it were
    this one's (and the next write based on it would pass over a change never seen)."""
    from engine.store import curation

    path = new_db()
    with Store(path) as alice, Store(path) as bob:
        run_id, trees = _run(alice)
        alice.save_pairs(run_id, _pairs(run_id, trees))
        pid = alice.pairs()[0].id
        real = curation.CurationStore.pair

        def pair_then_bob(self, pair_id):
            if self is alice and not self.con.in_transaction:  # between alice's commit and her re-read
                bob.set_pair_status(pair_id, "rejected", "bob", real(bob, pair_id).version)
            return real(self, pair_id)

        monkeypatch.setattr(curation.CurationStore, "pair", pair_then_bob)
        saved = alice.set_pair_status(pid, "approved", "alice", 1)
        assert (saved.version, saved.updated_by, saved.status) == (2, "alice", "approved")
