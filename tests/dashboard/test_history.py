"""Curation history in words (dashboard.history): no raw JSON on a page."""

from __future__ import annotations

from dashboard.history import history_table, in_words
from engine.store import HistoryEntry


def test_changes_read_as_words_and_long_texts_are_cut() -> None:
    assert in_words({"status": "pending"}) == "status: pending"
    assert in_words(None) == "" and in_words({"a_b": None, "c": [1, 2]}) == "a b: — · c: 1, 2"
    edit = in_words({"chosen": "word " * 50})
    assert edit.startswith("chosen: word word") and edit.endswith("…") and len(edit) < 100
    table = history_table([HistoryEntry(version=1, at=0.0, who="", action="swap", before={"status": "pending"},
                                        after={"status": "edited"})])
    assert table.iloc[0].to_dict() | {"when": None} == {"version": 1, "when": None, "who": "—",
                                                         "action": "swapped chosen and rejected",
                                                         "before": "status: pending", "after": "status: edited"}
