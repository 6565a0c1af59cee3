"""Team curation in the store: users and sessions, leases (never handed to two curators, even when
two connections race), expiry, reviews counted against the required number, the final-label rule,
settlement, agreement (kappa against textbook examples) and the decisions a training job used."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from engine import auth
from engine.datasets.agreement import agreement_report, cohen_kappa, fleiss_kappa, raw_agreement
from engine.datasets.pairs import Pair
from engine.envs.base import TaskSpec
from engine.store import ConflictError, LeaseError, Store, StoreError
from engine.store.review import DEFAULT_LEASE_S

STEP = "THOUGHT: t{i}.\nACTION: {a}\nEXPLANATION: e.\nSTATUS: CONTINUE"


def make_store(path, n_pairs: int = 12) -> tuple[Store, str]:
    store = Store(path)
    run_id = store.create_run("r", "line", "scripted", {}, [TaskSpec(id="goal-3", goal="reach 3")])
    tree_id = store.tree_ids(run_id)[0][0]
    pairs = [Pair(id=f"p{i:02d}", kind="step", run_id=run_id, tree_id=tree_id, task_id="goal-3", node_id=i,
                  chosen_node=100 + i, rejected_node=200 + i, prompt=[{"role": "user", "content": "go"}],
                  chosen=STEP.format(i=i, a="right"), rejected=STEP.format(i=i, a="left"), q_chosen=0.9,
                  q_rejected=0.1, logprob_chosen=None, logprob_rejected=None, depth=1) for i in range(n_pairs)]
    store.save_pairs(run_id, pairs)
    return store, run_id


@pytest.fixture
def team(new_db):
    """A store with a run and its pairs, on each backend (SQLite, PostgreSQL: tests/pg_fixture.py)."""
    store, run_id = make_store(new_db())
    yield store, run_id
    store.close()


def review(store: Store, item: str, who: str, label: str, now: float | None = None):
    return store.review("pair", item, who, label, store.pair(item).version, now=now)


# --- agreement: textbook examples ---------------------------------------------------------------------


def test_cohen_kappa_matches_the_textbook_example():
    # Wikipedia "Cohen's kappa": 50 proposals, yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> p_o 0.7, kappa 0.4.
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert raw_agreement(a, b) == pytest.approx(0.7)
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(["x", "x"], ["x", "x"]) is None  # chance agreement 1: undefined


def test_fleiss_kappa_matches_the_textbook_example():
    # Wikipedia "Fleiss' kappa": 10 subjects, 14 raters, 5 categories -> P 0.378, P_e 0.213, kappa 0.210.
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    counts = [{str(j): v for j, v in enumerate(row) if v} for row in table]
    assert fleiss_kappa(counts) == pytest.approx(0.2099, abs=5e-4)


def test_fleiss_with_two_raters_per_item_agrees_with_cohen_under_shared_marginals():
    # Two raters with identical label shares: Fleiss' and Cohen's kappa coincide (Scott's pi = Cohen).
    a = ["y", "y", "n", "n", "y", "n"]
    b = ["y", "n", "y", "n", "y", "n"]
    report = agreement_report({str(i): {"ann": x, "bob": y} for i, (x, y) in enumerate(zip(a, b, strict=True))})
    assert report["pairs"][0]["cohen_kappa"] == pytest.approx(cohen_kappa(a, b))
    assert report["fleiss_kappa"] == pytest.approx(cohen_kappa(a, b))
    assert report["raw"] == pytest.approx(4 / 6) and report["items"] == 6


# --- users and sessions -------------------------------------------------------------------------------


def test_login_session_expiry_and_logout(team):
    store, _ = team
    auth.add_user(store, "ann", "curator", "correct horse")
    stored = store.password_hash("ann")
    assert stored.startswith("$argon2") and "correct horse" not in stored
    with pytest.raises(auth.AuthError, match="wrong user name or password"):
        auth.login(store, "ann", "wrong password")
    with pytest.raises(auth.AuthError, match="wrong user name or password"):
        auth.login(store, "nobody", "correct horse")
    token = auth.login(store, "ann", "correct horse", ttl_s=60)
    assert store.session_user(token).role == "curator"
    assert store.session_user(token, now=store.session_user(token).created_at + 10**9) is None  # expired
    store.end_session(token)
    assert store.session_user(token) is None  # logged out
    token = auth.login(store, "ann", "correct horse")
    store.remove_user("ann")
    assert store.session_user(token) is None and not store.has_users()


def test_bad_user_input_is_one_line(team):
    store, _ = team
    with pytest.raises(auth.AuthError, match="role 'boss'"):
        auth.add_user(store, "ann", "boss", "correct horse")
    with pytest.raises(auth.AuthError, match="at least 8"):
        auth.add_user(store, "ann", "viewer", "short")
    with pytest.raises(auth.AuthError, match="user name"):
        auth.add_user(store, "<b>x</b>", "viewer", "correct horse")
    auth.add_user(store, "ann", "viewer", "correct horse")
    with pytest.raises(StoreError, match="exists already"):
        auth.add_user(store, "ann", "viewer", "correct horse")


# --- leases --------------------------------------------------------------------------------------------


def test_each_curator_gets_items_nobody_else_holds(team):
    store, run_id = team
    a = store.claim("pair", "ann", n=5, run_id=run_id)
    b = store.claim("pair", "bob", n=5, run_id=run_id)
    assert len(a) == len(b) == 5 and not set(a) & set(b)
    assert store.claim("pair", "ann", n=5) == a  # asking again renews the same items
    holders = store.lease_holders("pair")
    assert {holders[i] for i in a} == {"ann"} and {holders[i] for i in b} == {"bob"}


def test_two_connections_racing_never_get_the_same_item(new_db):
    location = new_db()
    store, _ = make_store(location, n_pairs=40)
    store.close()
    got: dict[str, list[str]] = {}
    barrier = threading.Barrier(4)

    def curator(name: str) -> None:
        with Store(location) as own:  # its own connection
            barrier.wait()
            mine = []
            for _ in range(5):
                mine += own.claim("pair", name, n=len(mine) + 2)[len(mine):]
            got[name] = mine

    threads = [threading.Thread(target=curator, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handed = Counter(i for items in got.values() for i in items)
    assert sum(handed.values()) == 40 and max(handed.values()) == 1


def test_an_expired_lease_is_refused_and_says_why(team):
    store, _ = team
    t0 = 1_000_000.0
    item = store.claim("pair", "ann", n=1, now=t0)[0]
    with pytest.raises(LeaseError, match=r"your lease on pair p00 expired at .* \(10 min after"):
        review(store, item, "ann", "approved", now=t0 + DEFAULT_LEASE_S + 1)
    assert store.decisions("pair") == []
    # The expired item goes to the next curator; the first one's late save still cannot land.
    assert item in store.claim("pair", "bob", n=1, now=t0 + DEFAULT_LEASE_S + 2)
    with pytest.raises(LeaseError, match="held by bob"):
        review(store, item, "ann", "approved", now=t0 + DEFAULT_LEASE_S + 3)
    with pytest.raises(LeaseError, match="not handed to you"):
        review(store, "p05", "ann", "approved")


def test_a_stale_review_is_refused(team):
    store, _ = team
    item = store.claim("pair", "ann", n=1)[0]
    seen = store.pair(item).version
    store.set_pair_status(item, "rejected", "maint", seen)
    with pytest.raises(ConflictError, match="was changed by maint"):
        store.review("pair", item, "ann", "approved", seen)


# --- reviews, the final label, settlement ----------------------------------------------------------------


def test_reviews_are_counted_and_unanimity_labels_the_item(team):
    store, run_id = team
    store.set_required_reviews(2)
    item = store.claim("pair", "ann", n=1)[0]
    review(store, item, "ann", "approved")
    assert store.pair(item).status == "pending"  # 1 of 2 reviews
    assert item not in store.claim("pair", "ann", n=20)  # ann does not review it twice
    store.release("pair", "ann")
    assert item in store.claim("pair", "bob", n=1)
    review(store, item, "bob", "approved")
    assert store.pair(item).status == "approved"
    assert item not in store.claim("pair", "cyd", n=20)  # it has its reviews
    final = store.final_labels("pair", [item])[item]
    assert final.label == "approved" and len(final.decision_ids) == 2 and final.reason == "unanimous (2 reviews)"
    progress = store.review_progress("pair", run_id)
    assert progress["curators"]["ann"]["reviews"] == 1 and progress["complete"] == 1


def test_a_disagreement_is_listed_until_a_maintainer_settles_it(team):
    store, run_id = team
    store.set_required_reviews(2)
    item = store.claim("pair", "ann", n=1)[0]
    review(store, item, "ann", "approved")
    store.claim("pair", "bob", n=1)
    review(store, item, "bob", "rejected")
    assert store.final_labels("pair", [item])[item].label is None
    assert store.final_labels("pair", [item], rule="majority")[item].label is None  # 1 vs 1: no majority
    assert store.disagreements("pair", run_id) == [(item, {"ann": "approved", "bob": "rejected"})]
    settled = store.settle("pair", item, "mia", "rejected")
    assert store.disagreements("pair", run_id) == []
    final = store.final_labels("pair", [item])[item]
    assert (final.label, final.decision_ids, final.reason) == ("rejected", (settled.id,), "settled by mia")
    assert store.pair(item).status == "rejected" and store.pair_history(item)[-1].who == "mia"
    report = store.agreement("pair", run_id)
    assert report["pairs"][0]["raw"] == 0.0 and report["items"] == 1


def test_majority_rule_and_unreviewed_items(team):
    store, _ = team
    store.set_required_reviews(3)
    item = "p00"
    for who, label in (("ann", "approved"), ("bob", "approved"), ("cyd", "rejected")):
        assert item in store.claim("pair", who, n=1)
        review(store, item, who, label)
    assert store.final_labels("pair", [item])[item].label is None
    majority = store.final_labels("pair", [item], rule="majority")[item]
    assert majority.label == "approved" and len(majority.decision_ids) == 2
    # An item nobody reviewed keeps a single curator's status (step 3), named by its history entry,
    # only while one review is all an item needs.
    store.set_pair_status("p07", "approved", "solo", store.pair("p07").version)
    assert store.final_labels("pair", ["p07"])["p07"].label is None
    store.set_required_reviews(1)
    final = store.final_labels("pair", ["p07", "p08"])
    assert final["p07"].label == "approved" and final["p07"].decision_ids == ("pair:p07@v2",)
    assert final["p08"].label is None
    with pytest.raises(StoreError, match="required reviews"):
        store.set_required_reviews(0)


# --- training reads settled labels and records the decisions it used ----------------------------------


def test_a_training_job_uses_only_settled_labels_and_records_their_decisions(team, monkeypatch):
    from pathlib import Path

    from engine.cli.common import PrintReporter
    from engine.jobs.kinds import load_job
    from engine.train import dpo
    from engine.train.common import TrainResult
    from engine.train.training import run_training

    store, _ = team
    store.set_required_reviews(2)
    ids = {}
    for item, labels in (("p00", ("approved", "approved")), ("p01", ("approved", "rejected")),
                         ("p02", ("approved", "rejected")), ("p04", ("rejected", "rejected"))):
        for who, label in zip(("ann", "bob"), labels, strict=True):
            assert item in store.claim("pair", who, n=12)
            ids.setdefault(item, []).append(review(store, item, who, label).id)
            store.release("pair", who)
    settled = store.settle("pair", "p01", "mia", "approved")
    store.set_pair_status("p03", "approved", "solo", store.pair("p03").version)
    trained = {}

    def fake_train(base, pairs, train, output, reporter, **kw):
        trained["ids"] = [p.id for p in pairs]
        return TrainResult(output=None, data_ids=[p.id for p in pairs], metrics={}, history=[], stopped=True)

    monkeypatch.setattr(dpo, "train_dpo", fake_train)
    monkeypatch.setattr("engine.train.common.resolve_model_path", lambda spec, log=print: Path(spec))
    job = store.job(store.create_job("dpo", {"model": "m", "train": {"device": "cpu"}}, "cpu").id)
    run_training(store, load_job("dpo", job.config), PrintReporter(), job=job)
    # p02 unsettled, p04 rejected, p03 has one curator's status where 2 reviews are needed, the rest none.
    assert trained["ids"] == ["p00", "p01"]
    recorded = store.job_decisions(job.id)
    assert {(item, did) for _, item, did, _ in recorded} == {*(("p00", d) for d in ids["p00"]), ("p01", settled.id)}

    # By choice, majority labels: with 2 reviews a 1-1 split has none, so the same pairs; with three
    # reviews on p02 the majority counts.
    store.set_required_reviews(3)
    store.claim("pair", "cyd", n=12)
    review(store, "p02", "cyd", "approved")
    job2 = store.job(store.create_job("dpo", {"model": "m", "train": {"device": "cpu", "labels": "majority"}},
                                      "cpu").id)
    run_training(store, load_job("dpo", job2.config), PrintReporter(), job=job2)
    assert "p02" in trained["ids"]
    assert {d for _, item, d, _ in store.job_decisions(job2.id) if item == "p02"} == {ids["p02"][0],
                                                                                    store.decisions("pair", item_ids=["p02"])[-1].id}


def test_users_cli_reads_the_password_from_stdin_never_from_argv(tmp_path, monkeypatch, capsys):
    import io

    from engine.cli import main

    db = str(tmp_path / "u.db")
    monkeypatch.setattr("sys.stdin", io.StringIO("correct horse\n"))
    assert main(["users", "add", "ann", "--role", "maintainer", "--db", db]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["users", "add", "bob", "--role", "viewer", "--db", db]) == 2
    assert main(["users", "list", "--db", db]) == 0
    out = capsys.readouterr()
    assert "ann\tmaintainer" in out.out and "bob" not in out.out and "at least 8 characters" in out.err
    assert main(["users", "remove", "ann", "--db", db]) == 0
    assert main(["users", "remove", "ann", "--db", db]) == 2
    assert "no user 'ann'" in capsys.readouterr().err
