"""Review queue: work shared out among curators, agreement between them, and disagreements to settle.

Each curator asks for items and gets ones nobody else holds right now (a lease, 10 minutes); each item
needs the set number of independent reviews (a maintainer's setting). A save under an expired or
foreign lease, or on a version someone changed meanwhile, is refused and says why. The final label
follows the store's rule (engine.store.review): a maintainer's settlement, else unanimity among the
required reviews, else unsettled. Env and model text is shown only in `st.code` and data frames.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import auth, data
from dashboard.store import ConflictError, DriverError, LeaseError, Store, StoreError
from dashboard.text import md

KINDS = {"Preference pairs": "pair", "Samples (refinement, revisions, SFT)": "sample"}
ALL = "(all)"
BATCH = 5
SEEN = "rq_seen"  # item id -> the version shown when it was handed out (what a review expects)
FLASH = "rq_flash"
ERROR = "rq_error"

path = data.db_path()
db = str(path)
state = st.session_state
seen: dict[str, int] = state.setdefault(SEEN, {})
runs = data.list_runs(db, data.db_version(path))


def _refuse(message: str) -> None:
    state[ERROR] = message


def _claim(kind: str, run_id: str | None) -> None:
    who = auth.acting_as(db, "curate")
    if who is None:
        return _refuse(state.pop(auth.NOTICE, "Not saved."))
    try:
        with Store(db) as store:
            got = store.claim(kind, who, n=BATCH, run_id=run_id)
            for item_id in got:  # reviews are checked against the version handed out now
                seen[item_id] = (store.pair(item_id) if kind == "pair" else store.sample(item_id)).version
    except (StoreError, OSError) as e:
        return _refuse(f"The queue could not be read: {e}")
    state[FLASH] = f"You hold {len(got)} item(s) now." if got else "Nothing left for you to review here."


def _release(kind: str) -> None:
    who = auth.acting_as(db, "curate")
    if who is None:
        return _refuse(state.pop(auth.NOTICE, "Not saved."))
    with Store(db) as store:
        n = store.release(kind, who)
    state[FLASH] = f"Gave {n} item(s) back to the queue."


def _review(kind: str, item_id: str, label: str) -> None:
    who = auth.acting_as(db, "curate")
    if who is None:
        return _refuse(state.pop(auth.NOTICE, "Not saved."))
    try:
        with Store(db) as store:
            store.review(kind, item_id, who, label, seen.get(item_id, -1))
    except (DriverError, OSError) as e:
        return _refuse(f"The database refused the review: {e}")
    except (LeaseError, ConflictError, StoreError) as e:
        return _refuse(f"Not saved: {e}")
    seen.pop(item_id, None)
    state[FLASH] = f"Saved your review of {kind} {item_id}: {label}."
    data.clear_dataset_caches()


def _settle(kind: str, item_id: str, label: str) -> None:
    who = auth.acting_as(db, "settle")
    if who is None:
        return _refuse(state.pop(auth.NOTICE, "Not saved."))
    try:
        with Store(db) as store:
            store.settle(kind, item_id, who, label)
    except (StoreError, OSError) as e:
        return _refuse(f"Not settled: {e}")
    state[FLASH] = f"Settled {kind} {item_id}: {label}."
    data.clear_dataset_caches()


def _set_required() -> None:
    who = auth.acting_as(db, "settle")
    if who is None:
        return _refuse(state.pop(auth.NOTICE, "Not saved."))
    try:
        with Store(db) as store:
            store.set_required_reviews(int(state["rq_required"]))
    except (StoreError, OSError) as e:
        return _refuse(f"Not saved: {e}")
    state[FLASH] = f"Each item now needs {int(state['rq_required'])} review(s)."


def _add_user() -> None:
    from engine import auth as engine_auth

    if auth.acting_as(db, "manage_users") is None:
        return _refuse(state.pop(auth.NOTICE, "Not saved."))
    name, role = str(state.get("rq_user_name") or "").strip(), state.get("rq_user_role", "curator")
    password = str(state.get("rq_user_password") or "")
    state["rq_user_password"] = ""
    try:
        with Store(db) as store:
            engine_auth.add_user(store, name, role, password)
    except (StoreError, OSError) as e:
        return _refuse(f"User not added: {e}")
    state[FLASH] = f"Added user {name} ({role})."


def _remove_user() -> None:
    me_now = auth.acting_as(db, "manage_users")
    if me_now is None:
        return _refuse(state.pop(auth.NOTICE, "Not saved."))
    name = state.get("rq_user_remove")
    if not name or name == me_now:
        return _refuse("User not removed: choose another user than yourself.")
    try:
        with Store(db) as store:
            store.remove_user(name)
    except (StoreError, OSError) as e:
        return _refuse(f"User not removed: {e}")
    state[FLASH] = f"Removed user {name}; their sessions are ended."


def _show_users() -> None:
    """The maintainers' user list and forms (shown also when the page stops early)."""
    if auth.may("manage_users"):
        from engine.auth import ROLES

        with Store(db, readonly=True) as store:
            users = store.users()
        with st.expander("Users"):
            st.dataframe(pd.DataFrame([{"user": u.name, "role": u.role} for u in users], columns=["user", "role"]),
                         hide_index=True, key="rq_users")
            with st.form("rq_user_form", border=False):
                user_cols = st.columns(3)
                user_cols[0].text_input("User name", key="rq_user_name")
                user_cols[1].selectbox("Role", ROLES, index=1, key="rq_user_role")
                user_cols[2].text_input("Password (8+ characters)", type="password", key="rq_user_password")
                st.form_submit_button("Add user", on_click=_add_user)
            others = [u.name for u in users if me is None or u.name != me.name]
            if others:
                st.selectbox("Remove user", others, key="rq_user_remove")
                st.button("Remove", key="rq_user_remove_btn", on_click=_remove_user)


def show_item(store: Store, kind: str, item_id: str) -> None:
    """The item's content, as text only."""
    if kind == "pair":
        pair = store.pair(item_id)
        st.text(f"pair {pair.id} · {pair.kind} · run {pair.run_id} · task {pair.task_id} · node {pair.node_id} · "
                f"Q {pair.q_chosen:.3f} vs {pair.q_rejected:.3f}")
        if pair.prompt:
            st.caption("What the agent saw (last message)")
            st.code(str(pair.prompt[-1].get("content", "")), language=None, wrap_lines=True)
        for column, which in zip(st.columns(2), ("chosen", "rejected"), strict=True):
            with column:
                st.caption(which.capitalize())
                if pair.kind == "step":
                    st.code(getattr(pair, which), language=None, wrap_lines=True)
                    continue
                for message in pair.messages(which):  # a trajectory pair: the turns after the prompt
                    st.code(f"{str(message.get('role', '')).upper()}: {message.get('content', '')}", language=None,
                            wrap_lines=True)
        return
    sample = store.sample(item_id)
    st.text(f"sample {sample.id} · {sample.kind} · task {sample.task.id} · {len(sample.turns)} turns")
    st.caption("Goal")
    st.code(sample.task.goal, language=None, wrap_lines=True)
    for i, turn in enumerate(sample.turns):
        st.caption(f"Turn {i + 1}" + ("" if turn.trains else " (masked)"))
        st.code(turn.text, language=None, wrap_lines=True)


st.title("Review queue")
me = auth.viewer()
with st.sidebar:
    kind_label = st.selectbox("Items", list(KINDS), key="rq_kind", persist_state="session")
    run_pick = st.selectbox("Run", [ALL, *(r.id for r in reversed(runs))], key="rq_run",
                            format_func=lambda i: "All runs" if i == ALL else
                            next((f"{r.name} · {r.id}" for r in runs if r.id == i), i))
kind = KINDS[kind_label]
run_id = None if run_pick == ALL else run_pick

flash = state.pop(FLASH, None)
if flash:
    st.success(md(flash))
error = state.pop(ERROR, None)
if error:
    st.error("Not saved.")
    st.code(error, language=None, wrap_lines=True)

with Store(db, readonly=True) as store:
    try:
        required: int | None = store.required_reviews()
    except StoreError as e:  # an unreadable stored setting: say so, and keep the form that sets it again
        required = None
        st.error(str(e))
    if auth.may("settle"):
        with st.popover("Reviews per item"):
            state.setdefault("rq_required", required or 1)
            st.number_input("Independent reviews each item needs", 1, 20, key="rq_required")
            st.button("Save setting", key="rq_required_save", on_click=_set_required)
    if required is None:
        _show_users()
        st.stop()  # everything else below counts reviews against the setting
    progress = store.review_progress(kind, run_id)
    agreement = store.agreement(kind, run_id)
    disputes = store.disagreements(kind, run_id)
    held = store.held(kind, me.name) if me is not None else []

    st.caption(f"Each item needs {required} independent review(s). Final label: a maintainer's settlement, "
               "else the required reviews if they agree, else unsettled (training leaves it out).")

    # --- my queue ------------------------------------------------------------------------------------------
    st.subheader("My queue")
    reason = auth.why_not("curate")
    if reason:
        st.info(reason)
    else:
        c = st.columns(2)
        c[0].button(f"Get up to {BATCH} items", key="rq_claim", type="primary", on_click=_claim,
                    args=(kind, run_id))
        c[1].button("Give my items back", key="rq_release", disabled=not held, on_click=_release, args=(kind,))
        if not held:
            st.caption("You hold no items. Ask for some: they are yours for 10 minutes.")
        for item_id, expires in held:
            try:
                version = store.pair(item_id).version if kind == "pair" else store.sample(item_id).version
            except StoreError:
                continue
            seen.setdefault(item_id, version)
            with st.container(border=True, key=f"rq_item_{item_id}"):
                st.text(f"{kind} {item_id} · yours until {time.strftime('%H:%M:%S', time.localtime(expires))}")
                show_item(store, kind, item_id)
                b = st.columns(2)
                b[0].button("Approve", key=f"rq_approve_{item_id}", on_click=_review,
                            args=(kind, item_id, "approved"), width="stretch")
                b[1].button("Reject", key=f"rq_reject_{item_id}", on_click=_review,
                            args=(kind, item_id, "rejected"), width="stretch")

# --- progress and agreement -------------------------------------------------------------------------------
st.subheader("Progress")
st.caption(f"{progress['complete']} of {progress['items']} items have their final reviews or a settlement.")
st.dataframe(pd.DataFrame([{"curator": c, "reviews": v["reviews"], "holding now": v["holding"]}
                           for c, v in progress["curators"].items()], columns=["curator", "reviews", "holding now"]),
             hide_index=True, key="rq_progress")


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


st.subheader("Agreement")
st.caption(f"Over {agreement['items']} items reviewed at least twice: raw agreement {_fmt(agreement['raw'])}, "
           f"Fleiss' kappa {_fmt(agreement['fleiss_kappa'])}.")
st.dataframe(pd.DataFrame([{"curators": " / ".join(p["raters"]), "items": p["items"], "raw": _fmt(p["raw"]),
                            "Cohen's kappa": _fmt(p["cohen_kappa"])} for p in agreement["pairs"]],
                          columns=["curators", "items", "raw", "Cohen's kappa"]), hide_index=True, key="rq_kappa")

# --- disagreements -----------------------------------------------------------------------------------------
st.subheader("Disagreements")
if not disputes:
    st.caption("None: no unsettled item has reviews that differ.")
can_settle = auth.may("settle")
for item_id, labels in disputes:
    with st.container(border=True, key=f"rq_dispute_{item_id}"):
        st.text(f"{kind} {item_id}: " + ", ".join(f"{who} {label}" for who, label in sorted(labels.items())))
        if can_settle:
            b = st.columns(2)
            b[0].button("Settle: approved", key=f"rq_settle_ok_{item_id}", on_click=_settle,
                        args=(kind, item_id, "approved"))
            b[1].button("Settle: rejected", key=f"rq_settle_no_{item_id}", on_click=_settle,
                        args=(kind, item_id, "rejected"))
if disputes and not can_settle:
    st.caption("A maintainer settles these.")

# --- users (maintainers) -----------------------------------------------------------------------------------
_show_users()
