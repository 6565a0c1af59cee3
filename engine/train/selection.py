"""Which reviewed items a trainer uses: the one selection by final label (engine/store/review.py)
that DPO, SFT, RFT, the iteration loops and the demo share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.store import FinalLabel, Store


def keep_labelled(store: Store, kind: str, items: Sequence[Any], statuses: Sequence[str], include_pending: bool,
                  rule: str) -> tuple[list[Any], dict[str, FinalLabel]]:
    """`items` whose final label is in `statuses`, and with `include_pending` those nobody decided
    anything about (`FinalLabel.undecided`); an unsettled item (reviewers disagree, too few or stale
    reviews) never. The one selection every trainer and loop uses (engine/store/review.py)."""
    finals = store.final_labels(kind, [i.id for i in items], rule=rule)
    kept = [i for i in items if finals[i.id].label in statuses or (include_pending and finals[i.id].undecided)]
    return kept, {i.id: finals[i.id] for i in kept if finals[i.id].label is not None}
