"""Reviews count only on the content they saw: after two approvals, a Swap or an Edit makes the item
unsettled again (its reviews were about the other pair), it goes back to the queue, the same
curators may review it again, and DPO's selection no longer takes it; on both backends."""

from __future__ import annotations

import pytest
from test_team_curation import STEP, make_store, review

from engine.train.dpo import DPOTrainConfig, select_pairs


@pytest.fixture
def team(new_db):
    store, _ = make_store(new_db(), n_pairs=4)
    store.set_required_reviews(2)
    for who in ("ann", "bob"):
        assert "p00" in store.claim("pair", who, n=4)
        review(store, "p00", who, "approved")
        store.release("pair", who)
    yield store
    store.close()


def _selected(store) -> list[str]:
    return [p.id for p in select_pairs(store, DPOTrainConfig())]


@pytest.mark.parametrize("change", ["swap", "edit"])
def test_a_change_after_two_approvals_unsettles_the_pair_and_training_drops_it(team, change):
    store = team
    assert store.final_labels("pair", ["p00"])["p00"].reason == "unanimous (2 reviews)"
    assert _selected(store) == ["p00"]
    version = store.pair("p00").version
    if change == "swap":
        store.swap_pair("p00", "cyd", version)
    else:
        store.edit_pair("p00", STEP.format(i=0, a="wait"), store.pair("p00").rejected, "cyd", version)
    final = store.final_labels("pair", ["p00"])["p00"]
    assert final.label is None and final.decision_ids == ()
    assert final.reason == "changed after its 2 decision(s): to be reviewed again"
    assert _selected(store) == [], f"DPO trains on the {change}ped pair its reviewers never saw"
    assert store.review_progress("pair")["complete"] == 0
    assert store.agreement("pair")["items"] == 0
    # Back in the queue, for the same curators too; two new approvals settle it again.
    for who in ("ann", "bob"):
        assert "p00" in store.claim("pair", who, n=4)
        review(store, "p00", who, "approved")
        store.release("pair", who)
    final = store.final_labels("pair", ["p00"])["p00"]
    assert final.reason == "unanimous (2 reviews)" and len(final.decision_ids) == 2
    assert _selected(store) == ["p00"]
    assert len(store.decisions("pair", item_ids=["p00"])) == 4  # the old reviews stay on record


def test_a_status_change_keeps_the_reviews(team):
    store = team
    store.set_pair_status("p00", "pending", "cyd", store.pair("p00").version)  # no content change
    assert store.final_labels("pair", ["p00"])["p00"].reason == "unanimous (2 reviews)"


# --- include_pending: undecided items only, never unsettled ones --------------------------------------


def test_include_pending_adds_undecided_pairs_never_disagreeing_or_half_reviewed_ones(team):
    store = team  # p00: two approvals; p01: approved vs rejected; p02: 1 of 2 reviews; p03: nobody
    for item, who, label in (("p01", "ann", "approved"), ("p01", "bob", "rejected"), ("p02", "ann", "approved")):
        assert item in store.claim("pair", who, n=4)
        review(store, item, who, label)
        store.release("pair", who)
    finals = store.final_labels("pair", ["p01", "p02", "p03"])
    assert [finals[i].undecided for i in ("p01", "p02", "p03")] == [False, False, True]
    pending = DPOTrainConfig(include_pending=True)
    assert [p.id for p in select_pairs(store, pending)] == ["p00", "p03"]
    store.swap_pair("p00", "cyd", store.pair("p00").version)  # stale reviews: unsettled, not undecided
    assert [p.id for p in select_pairs(store, pending)] == ["p03"]
    store.settle("pair", "p01", "mia", "approved")
    assert [p.id for p in select_pairs(store, pending)] == ["p01", "p03"]


def test_include_pending_leaves_out_a_sample_whose_reviewers_disagree(new_db):
    from doubles import action_text

    from engine.datasets.samples import Sample, Task, Turn
    from engine.envs.base import TaskSpec
    from engine.store import Store
    from engine.train.sft import SFTTrainConfig, select_samples

    with Store(new_db()) as store:
        run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id="goal-1", goal="g")])
        task = Task(id="goal-1", goal="reach 1", context="commands: right", first_observation="You are at 0.",
                    system="You are an agent.")
        store.save_samples([Sample(id=f"s{i}", kind="good", run_id=run_id, task=task,
                                   turns=(Turn(action_text("right", "SUCCESS"), None, True),)) for i in range(2)])
        store.set_required_reviews(2)
        for who, label in (("ann", "approved"), ("bob", "rejected")):
            assert "s0" in store.claim("sample", who, n=2)
            store.review("sample", "s0", who, label, store.sample("s0").version)
            store.release("sample", who)
        config = SFTTrainConfig(include_pending=True, revision_share=None)
        assert [s.id for s in select_samples(store, config)] == ["s1"]
