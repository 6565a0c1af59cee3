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
