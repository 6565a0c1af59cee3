"""A curated item's audit history as a table in words (the Data pages).

Why: the store keeps each change's before / after as JSON; shown raw, a person reads
`{"status": "pending"}`. Here each side is "status: pending", an edited text shortened (its full text is
in the item itself), a list as its items. Values are data, shown in a data frame (never Markdown).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboard.store import HistoryEntry

VALUE_CHARS = 80
ACTIONS = {"create": "created", "rebuild": "rebuilt", "approve": "approved", "reject": "rejected",
           "reset": "reset to pending", "edit": "edited", "swap": "swapped chosen and rejected"}


def in_words(value: Any) -> str:
    """One side of a change: `key: value` parts joined by " · "; long texts shortened."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return " · ".join(f"{k.replace('_', ' ')}: {in_words(v) or '—'}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(in_words(v) for v in value)
    text = " ".join(str(value).split())
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def history_table(entries: list[HistoryEntry]) -> pd.DataFrame:
    """Newest first: version, when, who, what was done, and the changed fields before and after."""
    return pd.DataFrame(
        [{"version": h.version, "when": pd.Timestamp(h.at, unit="s").floor("s"), "who": h.who or "—",
          "action": ACTIONS.get(h.action, h.action.replace("_", " ")), "before": in_words(h.before),
          "after": in_words(h.after)} for h in reversed(entries)],
        columns=["version", "when", "who", "action", "before", "after"],
    )
