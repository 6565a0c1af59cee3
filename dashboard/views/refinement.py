"""Refinement data: AgentRefine samples (docs/algorithms.md §5), with the script they were played in and the Dungeon
Master's verdict on every player action.

Why this page: refinement tuning masks the turns the DM flagged as erroneous (loss 0) and trains on
the rest; a wrong mask teaches the mistake. Here a person reads each turn with the DM's answer and
evaluation, flips a turn's loss flag where the DM was wrong, and approves or rejects the sample.
The page builds its own data too: a refine job (model — `offline`, the scripted TextCraft synthesizer,
needs no LLM — count, personas file, seed) through dashboard.builders, with a Builds table of the jobs.

Every write names the version the page showed (`expected_version`); a stale one is refused by the
store and explained, never overwritten. Env and model text is shown only in `st.code`, `st.text`,
`st.json` and data frames. The URL holds the sample id, so a view can be shared.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import auth, builders, data
from dashboard.history import history_table
from dashboard.store import CURATION_STATUSES, ConflictError, EditError, JobInfo, Store, StoreError
from dashboard.text import md
from dashboard.versions import VersionGuard
from engine.datasets.samples import Sample

KIND = "refine"
PAGE_SIZE = 100
ERROR = "rf_error"
FLASH = "rf_flash"
PAGE = "rf_page"

path = data.db_path()
db = str(path)
version = data.db_version(path)
qp = st.query_params
state = st.session_state
guard = VersionGuard("rf", "sample", "sample")


# --- writes: each callback runs before the page re-reads, with the version the page showed ----------------


def _write(sample_id: str, action: Callable[[Store, str], Sample], done: str) -> Sample | None:
    """Run one curation write; a refusal becomes a message on the page, never a traceback."""
    state.pop(ERROR, None)
    who = auth.acting_as(db, "curate")
    if who is None:
        state[ERROR] = state.pop(auth.NOTICE, "Not saved.")
        return None
    try:
        with Store(db) as store:
            sample = action(store, who)
    except ConflictError as e:
        guard.refused(sample_id, e)
        return None
    except (EditError, StoreError, OSError) as e:
        state[ERROR] = f"The store refused the change: {e}"
        return None
    guard.saved(sample_id, sample.version)
    state[FLASH] = done
    data.clear_dataset_caches()
    return sample


def _set_status(sample_id: str, expected: int, status: str, then: tuple | None = None) -> None:
    words = {"approved": "Approved", "rejected": "Rejected", "pending": "Reset to pending"}
    done = _write(sample_id, lambda s, who: s.set_sample_status(sample_id, status, who, expected),
                  f"{words[status]} sample {sample_id}.")
    if done is not None and then is not None:
        _advance(sample_id, *then)


def _toggle_loss(sample_id: str, turn: int, expected: int, key: str) -> None:
    trains = bool(state[key])
    _write(sample_id, lambda s, who: s.set_turn_loss(sample_id, turn, trains, who, expected),
           f"Turn {turn + 1} of sample {sample_id} is now {'trained' if trains else 'masked (no loss)'}.")


def _advance(sample_id: str, f: data.Filters, page: int, index: int | None) -> None:
    """After a decision: the sample that followed it (or, if it left the list, the one now in its place)."""
    with Store(db, readonly=True) as store:
        ids = [s.id for s in store.samples(limit=PAGE_SIZE, offset=page * PAGE_SIZE, **data.as_kwargs(f))]
        following = store.samples(limit=1, offset=(page + 1) * PAGE_SIZE, **data.as_kwargs(f))
    at = ids.index(sample_id) + 1 if sample_id in ids else (index or 0)
    if at < len(ids):
        _go(ids[at])
    elif following:
        state[PAGE] = page + 1
        _go(following[0].id)
    else:
        state[FLASH] = f"{state.get(FLASH, '')} That was the last sample in the list.".strip()


# --- navigation ---------------------------------------------------------------------------------------------


def _go(sample_id: str | None) -> None:
    if sample_id is None:
        st.query_params.pop("sample", None)
    else:
        st.query_params["sample"] = sample_id


def _go_page(page: int, sample_id: str | None) -> None:
    state[PAGE] = page
    _go(sample_id)


def _restart() -> None:
    _go_page(0, None)


def _picked_row(key: str, ids: Sequence[str]) -> None:
    rows = state[key].selection.rows
    if rows:
        _go(ids[rows[0]])


def _set_page() -> None:
    _go_page(int(state["rf_page_input"]) - 1, None)


# --- display helpers ----------------------------------------------------------------------------------------


def verification_of(sample: Sample) -> dict[str, Any]:
    """What `orchard refine` recorded about checking the sample (empty for imported data)."""
    value = sample.source.get("verification")
    return value if isinstance(value, dict) else {}


def flagged_turns(sample: Sample) -> set[int]:
    """Sample turns whose player action the DM evaluated as erroneous. The verifier counts DM and player
    turns together (DM at even indices, player at odd ones); sample turn k is player turn 2k + 1."""
    flagged = verification_of(sample).get("flagged_turns")
    if not isinstance(flagged, list):
        return set()
    return {(int(i) - 1) // 2 for i in flagged if isinstance(i, int)}


def dm_evaluations(sample: Sample) -> dict[int, dict[str, Any]]:
    """Sample turn k -> the DM's evaluation of its action ({"error", "detail", "thought"}), when recorded."""
    out: dict[int, dict[str, Any]] = {}
    for e in verification_of(sample).get("evaluations") or []:
        if isinstance(e, dict) and isinstance(e.get("player_turn"), int):
            out[(e["player_turn"] - 1) // 2] = e
    return out


def builds_table(jobs: Sequence[JobInfo]) -> pd.DataFrame:
    """One row per refine job: what it was asked (model, count) and what it made (rows, failed)."""
    return pd.DataFrame([{
        "job": j.id, "state": j.state, "model": str(j.config.get("model", "")), "count": j.config.get("n"),
        "rows": j.progress.get("rows"), "failed": j.progress.get("failed"),
        "queued": pd.Timestamp(j.created_at, unit="s").floor("s"), "output": j.output_path or "",
    } for j in jobs], columns=["job", "state", "model", "count", "rows", "failed", "queued", "output"])


def turns_table(sample: Sample, flags: set[int], evaluations: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """The sample's turns at a glance: the action, the DM's verdict and whether the turn is trained."""
    def action(text: str) -> str:
        return text.rsplit("Action:", 1)[-1].strip() if "Action:" in text else text

    return pd.DataFrame([{
        "turn": i + 1, "action": action(t.text),
        "DM error": str((evaluations.get(i) or {}).get("error", "flagged" if i in flags else "none")),
        "loss": "trained" if t.trains else "masked",
    } for i, t in enumerate(sample.turns)], columns=["turn", "action", "DM error", "loss"])


# --- the list -----------------------------------------------------------------------------------------------

with st.sidebar:
    statuses = st.multiselect("Status", list(CURATION_STATUSES), key="rf_status", on_change=_restart,
                              placeholder="all statuses", persist_state="session")

st.title("Refinement data")
st.caption("AgentRefine samples: one model (or the `offline` synthesizer) played the Dungeon Master and the "
           "player in a generated script. Turns the DM flagged as erroneous are masked (no loss). Build them "
           "here or with `orchard refine generate`.")

f = data.filters(kind=KIND, status=statuses)
counts = data.sample_counts(db, f, version)
total = counts["total"]
builders.refine_builder(db, empty=total == 0 and not statuses)
builds = builders.refine_builds(db)
if builds:
    st.caption(f"Builds ({len(builds)}, newest first)")
    st.dataframe(builds_table(builds), hide_index=True, key="rf_builds", height=min(38 + 35 * len(builds), 212))
pages = max(1, -(-total // PAGE_SIZE))
page = min(max(int(state.get(PAGE, 0)), 0), pages - 1)
state[PAGE] = page
samples = data.sample_page(db, f, PAGE_SIZE, page * PAGE_SIZE, version)
ids = [s.id for s in samples]
if not samples:
    st.info("No refinement samples match. Build some above (model `offline` needs no LLM) or with "
            "`orchard refine generate`, or widen the status filter.")
    st.stop()

sample_id = qp.get("sample")
loaded = data.read_sample(db, sample_id) if sample_id else None
if sample_id and (loaded is None or loaded[0].kind != KIND):
    st.warning("The sample named in the URL is not a refinement sample here; showing the first one.")
    loaded = None
if loaded is None:
    sample_id = ids[0]
    loaded = data.read_sample(db, sample_id)
if loaded is None:
    st.info("That sample was just removed; reload the page.")
    st.stop()
qp["sample"] = loaded[0].id  # == sample_id, which is a str by now
sample, history = loaded
src = sample.source
flags = flagged_turns(sample)
evaluations = dm_evaluations(sample)

st.caption(f"{total} refinement samples · {counts['pending']} pending · {counts['approved']} approved · "
           f"{counts['rejected']} rejected · {counts['edited']} edited — select a row to open it")
table = pd.DataFrame([{
    "": "▶" if s.id == sample_id else "",
    "sample": s.id, "persona": s.task.id, "turns": len(s.turns),
    "masked": sum(1 for t in s.turns if not t.trains),
    "DM flags": len(flagged_turns(s)),
    "corrections": verification_of(s).get("corrections"),
    "model": s.source.get("model", ""), "status": s.status,
} for s in samples])
key = f"rf_table_{page}_{sample_id}"
st.dataframe(table, hide_index=True, key=key, on_select=partial(_picked_row, key, ids),
             selection_mode="single-row", height=min(38 + 35 * len(table), 240))
if pages > 1:
    state["rf_page_input"] = page + 1
    st.number_input("List page", 1, pages, key="rf_page_input", on_change=_set_page)

# --- curation bar -------------------------------------------------------------------------------------------

flash = state.pop(FLASH, None)
if flash:
    st.success(flash)
if ERROR in state:
    st.error("Not saved.")
    st.code(state.pop(ERROR), language=None, wrap_lines=True)
expected, blocked = guard.panel(sample)

index = ids.index(sample.id) if sample.id in ids else None
then = (f, page, index)
prev_id = ids[index - 1] if index else None
if index is None:  # a sample outside the list (a link): Next goes to the list's first one
    next_id: str | None = ids[0]
else:
    next_id = ids[index + 1] if index + 1 < len(ids) else None
st.subheader(f"Sample {index + 1 + page * PAGE_SIZE if index is not None else '—'} of {total}")
nav = st.columns(4)
nav[0].button("Previous", key="rf_prev", icon=":material/arrow_back:", shortcut="K", width="stretch",
              disabled=prev_id is None, on_click=_go, args=(prev_id,))
nav[1].button("Approve & next", key="rf_approve_next", icon=":material/check:", type="primary", shortcut="A",
              width="stretch", disabled=blocked, on_click=_set_status,
              args=(sample.id, expected, "approved", then))
nav[2].button("Reject & next", key="rf_reject_next", icon=":material/close:", shortcut="X", width="stretch",
              disabled=blocked, on_click=_set_status, args=(sample.id, expected, "rejected", then))
nav[3].button("Next", key="rf_next", icon=":material/arrow_forward:", shortcut="J", width="stretch",
              disabled=next_id is None, on_click=_go, args=(next_id,))
more = st.columns(4)
more[0].button("Approve", key="rf_approve", width="stretch", disabled=blocked or sample.status == "approved",
               on_click=_set_status, args=(sample.id, expected, "approved"))
more[1].button("Reject", key="rf_reject", width="stretch", disabled=blocked or sample.status == "rejected",
               on_click=_set_status, args=(sample.id, expected, "rejected"))
more[2].button("Reset to pending", key="rf_reset", width="stretch",
               disabled=blocked or sample.status == "pending", on_click=_set_status,
               args=(sample.id, expected, "pending"))
st.caption("Shortcuts: A approve & next · X reject & next · J next · K previous "
           "(not while typing in a field).")

verification = verification_of(sample)
c = st.columns(5)
c[0].metric("Status", md(sample.status))
c[1].metric("Turns", len(sample.turns))
c[2].metric("Masked turns", sum(1 for t in sample.turns if not t.trains))
c[3].metric("DM-flagged actions", len(flags))
c[4].metric("Error → correction episodes", md(verification.get("corrections", "—")))  # value: Markdown
st.text(f"sample {sample.id} · persona {sample.task.id} · model {src.get('model', '—')} · "
        f"version {sample.version} · last changed by {sample.updated_by or '—'}")

# --- the script ---------------------------------------------------------------------------------------------

script = src.get("script") if isinstance(src.get("script"), dict) else None
persona = src.get("persona") if isinstance(src.get("persona"), dict) else None
with st.expander("Script: persona, environment, task and actions", expanded=False):
    if persona:
        st.caption("PERSONA")
        st.code(str(persona.get("persona", "")), language=None, wrap_lines=True)
    if script:
        st.caption("TASK")
        st.code(str(script.get("task", "")), language=None, wrap_lines=True)
        st.caption("ENVIRONMENT")
        st.json(script.get("environment", {}), expanded=1)
        st.caption("ACTIONS (a player action is valid when it matches a pattern with listed parameter "
                   "values)")
        st.dataframe(pd.DataFrame([{
            "name": a.get("name"), "pattern": a.get("pattern"),
            "parameters": json.dumps(a.get("parameters", {}), ensure_ascii=False),
            "examples": " | ".join(a.get("examples", [])),
        } for a in script.get("actions", [])]), hide_index=True, key=f"rf_actions_{sample.id}")
    else:
        st.caption("No script was stored with this sample (imported data); the system prompt below has it.")
    st.caption("SYSTEM PROMPT (as trained)")
    st.code(sample.task.system, language=None, wrap_lines=True)

# --- the trajectory -----------------------------------------------------------------------------------------

st.subheader("Trajectory")
st.caption("Each turn: the player's thought and action, then the DM's answer and its evaluation of that "
           "action. Untick “train on this turn” to mask a turn (loss 0); tick it to train on it.")
st.dataframe(turns_table(sample, flags, evaluations), hide_index=True, key=f"rf_turns_{sample.id}_{sample.version}",
             height=min(38 + 35 * len(sample.turns), 318))
st.caption("DM · FIRST OBSERVATION")
st.code(sample.task.first_user_message(), language=None, wrap_lines=True)
for i, turn in enumerate(sample.turns):
    with st.container(border=True):
        flagged = i in flags
        head = st.columns([3, 2], vertical_alignment="center")
        verdict = ":red[**flagged as an error**]" if flagged else ":green[no error]"
        differs = " · :orange[mask differs from the DM's verdict]" if turn.trains == flagged else ""
        head[0].markdown(f"**Turn {i + 1}** · DM evaluation: {verdict}{differs}")
        loss_key = f"rf_loss_{sample.id}_{i}_{sample.version}"
        head[1].checkbox("Train on this turn", value=turn.trains, key=loss_key, disabled=blocked,
                         on_change=_toggle_loss, args=(sample.id, i, expected, loss_key),
                         help="The loss flag: unticked turns are masked (loss 0) in refinement tuning.")
        left, right = st.columns(2, gap="medium")
        left.caption("PLAYER")
        left.code(turn.text, language=None, wrap_lines=True)
        last = i == len(sample.turns) - 1
        answer = turn.observation if turn.observation is not None else (
            verification.get("final_observation") if last else None)
        note = " (after the last action; not in the chat)" if turn.observation is None else ""
        right.caption(f"DM'S ANSWER{note}")
        right.code(str(answer or "—"), language=None, wrap_lines=True)
        evaluation = evaluations.get(i)
        if evaluation:
            right.caption(f"DM'S EVALUATION · error: {md(evaluation.get('error', '?'))}")
            right.code(str(evaluation.get("detail") or evaluation.get("thought") or "—"), language=None,
                       wrap_lines=True)

rejections = verification.get("rejections") or []
with st.expander(f"How it was verified ({len(rejections)} rejected attempts, "
                 f"{md(verification.get('continuations', 0))} continuations, "
                 f"{md(verification.get('regenerations', 0))} regenerations)"):
    if rejections:
        st.dataframe(pd.DataFrame(rejections), hide_index=True, key=f"rf_rejections_{sample.id}")
    st.caption("COST AND SETTINGS")
    st.json({"cost": src.get("cost"), "config": src.get("config"),
             "dropped_turns": verification.get("dropped_turns")}, expanded=False)

st.caption("History (newest first)")
st.dataframe(history_table(history), hide_index=True, key=f"rf_history_{sample.id}_{sample.version}")
