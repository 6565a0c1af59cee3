"""Optimistic locking on the curation pages (pairs, trajectories, refinement data), written once.

A page remembers the version of each item it showed; every write names it (`expected_version`), and
the store refuses one made on an item someone else has changed since (ConflictError). The page then
says so in one panel — your change was NOT saved, nothing was overwritten, here is their version —
and refuses further changes until the person reloads, so nobody overwrites work they have not seen.
Opening another item starts from its stored version. One `VersionGuard` per page holds its
session-state keys (`<prefix>_seen`, `_shown`, `_conflict`, `_error`) and its reload button.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import streamlit as st

from dashboard import auth


class Versioned(Protocol):
    """A curated item as the store returns it (a Pair, a Sample)."""

    @property
    def id(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def updated_at(self) -> float | None: ...

    @property
    def updated_by(self) -> str | None: ...


@dataclass(frozen=True)
class VersionGuard:
    """`prefix`: the page's key prefix (pp, tr, rf); `record`: the store's word for the item in the
    stale line (pair, sample); `noun`: the page's word for it (pair, trajectory, sample); `drafts`:
    session keys of an item's unsaved edits ("{id}" filled in), dropped when it is saved or reloaded."""

    prefix: str
    record: str
    noun: str
    drafts: tuple[str, ...] = ()

    @property
    def seen(self) -> dict[str, int]:
        """Item id -> the version this page showed (what a write expects)."""
        return st.session_state.setdefault(f"{self.prefix}_seen", {})

    @property
    def conflicts(self) -> dict[str, str]:
        """Item id -> why a write was refused as stale."""
        return st.session_state.setdefault(f"{self.prefix}_conflict", {})

    def refused(self, item_id: str, error: Exception) -> None:
        """A write was refused as stale (a ConflictError): the panel says so on the next run."""
        self.conflicts[item_id] = str(error)

    def saved(self, item_id: str, version: int) -> None:
        """A write went through: the page works on the version it made."""
        self.seen[item_id] = version
        self.conflicts.pop(item_id, None)
        self._drop_drafts(item_id)

    def reload(self, item_id: str, current: int) -> None:
        """Take the stored version as the one to work on (drops the refused change and any draft)."""
        self.saved(item_id, current)
        st.session_state.pop(f"{self.prefix}_error", None)

    def reopen(self) -> None:
        """The item on screen changed by this person's own hand (a bulk change): start from its new version."""
        st.session_state.pop(f"{self.prefix}_shown", None)

    def panel(self, item: Versioned) -> tuple[int, bool]:
        """(the version writes expect, whether changes are blocked), after showing why where they are:
        a read-only session, or an item changed since the page showed it (with a reload button)."""
        state = st.session_state
        if state.get(f"{self.prefix}_shown") != item.id:  # just opened: work on what is on screen now
            self.seen[item.id] = item.version
            self.conflicts.pop(item.id, None)
            state[f"{self.prefix}_shown"] = item.id
        expected = self.seen[item.id]
        stale = self.conflicts.get(item.id)
        refused = stale is not None  # a save was attempted and refused; else the item merely changed meanwhile
        if stale is None and expected != item.version:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item.updated_at or 0))
            stale = (f"{self.record} {item.id} was changed by {item.updated_by} at {at} "
                     f"(you opened version {expected}, it is now {item.version})")
        read_only = auth.why_not("curate")
        if read_only:
            st.info(read_only)
        if stale is not None:
            with st.container(border=True):
                if refused:
                    st.warning(f"Someone else changed this {self.noun} after you opened it, so your change was NOT "
                               "saved (and nothing was overwritten). The page now shows their version: reload to "
                               "work on it.")
                else:
                    st.warning(f"Someone else changed this {self.noun} after you opened it. The page shows their "
                               "version; reload to work on it (changes are refused until then).")
                st.code(stale, language=None, wrap_lines=True)
                st.button(f"Reload this {self.noun}", key=f"{self.prefix}_reload", type="primary",
                          on_click=self.reload, args=(item.id, item.version))
        return expected, stale is not None or read_only is not None

    def _drop_drafts(self, item_id: str) -> None:
        for key in self.drafts:
            st.session_state.pop(key.format(id=item_id), None)
