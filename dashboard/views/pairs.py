"""Preference pairs: the curation queue for Agent Q's step pairs (and the trajectory-level baseline's).

Filter the queue (run / task / kind / status / depth / Q gap), compare chosen with rejected (side by
side, with a word diff and their Q values), see why the pair exists ("Why this pair": both sides' nodes,
Q~ / Q^ / Q, visits, model, seed, author, and every run that built it), and approve, reject, swap or
edit each pair. Next /
Previous and "approve & next" keep the flow at keyboard speed (the buttons carry shortcuts).

Why the version bookkeeping: two people may curate the same pair. The page remembers the version of
each pair it showed (`pp_seen`) and every write names it as `expected_version`, so the store refuses a
write based on a pair someone else has changed since (ConflictError) and the page explains that
instead of overwriting. Every write is recorded under the person dashboard.auth says is here, and
is refused for a viewer or without a login where one is needed. Env and model text is shown only in
`st.code`, `st.text` and data frames, never as markdown or HTML. The URL holds run / task / pair, so a
view can be shared.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from functools import partial

import pandas as pd
import streamlit as st

from dashboard import auth, builders, data
from dashboard.history import history_table
from dashboard.store import CURATION_STATUSES, ConflictError, EditError, Store, StoreError
from dashboard.text import md
from dashboard.versions import VersionGuard
from engine.actions import FormatError, parse
from engine.datasets.pairs import Pair

PAGE_SIZE = 50
MAX_SCAN_PAGES = 40  # how far a shared link's pair is looked for in the queue
ALL = "(all)"
ORDERS = {"Tree order": "tree", "Largest Q gap first": "gap", "Recently changed first": "updated"}
KINDS = {"Step pairs": "step", "Trajectory pairs (baseline)": "trajectory", "All kinds": None}
ROLES = {"system": "SYSTEM", "user": "USER", "assistant": "ASSISTANT"}
ERROR = "pp_error"  # (pair id, why an edit or write was refused)
FLASH = "pp_flash"  # one-line outcome of the last action
PAGE = "pp_page"
WALK = "pp_walk"  # (queue key, pair ids): the queue page in the order the curator found it

path = data.db_path()
db = str(path)
version = data.db_version(path)
runs = data.list_runs(db, version)
qp = st.query_params
state = st.session_state
guard = VersionGuard("pp", "pair", "pair", drafts=("pp_edit_chosen_{id}", "pp_edit_rejected_{id}"))


# --- writes: each callback runs before the page re-reads, with the version the page showed ----------------


def _write(pair_id: str, action: Callable[[Store, str], Pair], done: str) -> Pair | None:
    """Run one curation write as the person here; a refusal becomes a message on the page, never a traceback."""
    state.pop(ERROR, None)
    who = auth.acting_as(db, "curate")
    if who is None:
        state[ERROR] = (pair_id, state.pop(auth.NOTICE, "Not saved."))
        return None
    try:
        with Store(db) as store:
            pair = action(store, who)
    except ConflictError as e:
        guard.refused(pair_id, e)
        return None
    except EditError as e:
        state[ERROR] = (pair_id, str(e))
        return None
    except (StoreError, OSError) as e:
        state[ERROR] = (pair_id, f"The database refused the change: {e}")
        return None
    guard.saved(pair_id, pair.version)  # the editor starts again from the stored texts
    state[FLASH] = done
    data.clear_dataset_caches()
    return pair


def walk_order(key: str, ids: Sequence[str]) -> list[str]:
    """The queue page in the order the curator found it. WHY: a swap or an edit re-sorts the queue (tree
    order sorts by the chosen and rejected nodes, gap order by the gap), and "next" by position would then
    skip the pair that moved up into the changed one's place. So the walk keeps its order while the
    filters, order and page stay; pairs that left the queue drop out, new ones join at the end."""
    walk = state.get(WALK)
    if not walk or walk[0] != key:
        out = list(ids)
    else:
        present, known = set(ids), set(walk[1])
        out = [i for i in walk[1] if i in present] + [i for i in ids if i not in known]
    state[WALK] = (key, out)
    return out


def _advance(pair_id: str, f: data.Filters, order: str, page: int, walk: Sequence[str]) -> None:
    """After a decision on `pair_id`: show the pair that followed it in the walk (`walk_order`) and is
    still in the queue; if the decision took it out of the queue (e.g. a "pending" filter), the next
    one takes its place."""
    with Store(db, readonly=True) as store:
        kw = data.as_kwargs(f)
        rows = [p.id for p in store.pairs(limit=PAGE_SIZE, offset=page * PAGE_SIZE, order=order, **kw)]
        # the walk after it, then what moved into this page since (e.g. up from the next one)
        after = [*walk[walk.index(pair_id) + 1:], *(i for i in rows if i not in set(walk))] if pair_id in walk else rows
        target = next((i for i in after if i in set(rows)), None)
        if target is not None:
            _go(target)
            return
        following = store.pairs(limit=1, offset=(page + 1) * PAGE_SIZE, order=order, **kw)
    if following:
        state[PAGE] = page + 1
        _go(following[0].id)
    else:
        state[FLASH] = f"{state.get(FLASH, '')} That was the last pair in the queue.".strip()


def _decide(pair_id: str, expected: int, status: str, then: tuple | None = None) -> None:
    words = {"approved": "Approved", "rejected": "Rejected", "pending": "Reset to pending"}
    done = _write(pair_id, lambda s, who: s.set_pair_status(pair_id, status, who, expected),
                  f"{words[status]} pair {pair_id}.")
    if done is not None and then is not None:
        _advance(pair_id, *then)


def _swap(pair_id: str, expected: int) -> None:
    _write(pair_id, lambda s, who: s.swap_pair(pair_id, who, expected),
           f"Swapped chosen and rejected of pair {pair_id}.")


def _save_edit(pair_id: str, expected: int, shown: tuple[str, str]) -> None:
    """`shown`: the texts the page showed; saving them unchanged would only add noise to the history."""
    chosen = state.get(f"pp_edit_chosen_{pair_id}", "")
    rejected = state.get(f"pp_edit_rejected_{pair_id}", "")
    if (chosen, rejected) == shown:
        state[FLASH] = "Nothing to save: the texts are unchanged."
        return
    _write(pair_id, lambda s, who: s.edit_pair(pair_id, chosen, rejected, who, expected),
           f"Saved the edit of pair {pair_id}.")


def _bulk(f: data.Filters, status: str, matched: int) -> None:
    state.pop(ERROR, None)
    who = auth.acting_as(db, "settle")  # a sweeping change: maintainers only
    if who is None:
        state[ERROR] = ("", state.pop(auth.NOTICE, "Not saved."))
        return
    try:
        with Store(db) as store:
            changed = store.bulk_set_pair_status(status, who, **data.as_kwargs(f))
    except (StoreError, OSError) as e:
        state[ERROR] = ("", f"The database refused the bulk change: {e}")
        return
    state["pp_bulk_ok"] = False
    verb = "Approved" if status == "approved" else "Rejected"
    state[FLASH] = (f"{verb} {changed} pairs: all {matched} pairs matching the filters are {status} now "
                    "(those that already were are left as they were).")
    guard.reopen()  # the pair on screen changed too, by this person: work on its new version
    data.clear_dataset_caches()


# --- navigation: callbacks write the query parameters, the page reads them on the rerun ---------------------


def _go(pair_id: str | None) -> None:
    if pair_id is None:
        st.query_params.pop("pair", None)
    else:
        st.query_params["pair"] = pair_id


def _go_page(page: int, pair_id: str | None) -> None:
    state[PAGE] = page
    _go(pair_id)


def _restart_queue() -> None:
    """A filter changed: back to the first pair of the new queue."""
    state[PAGE] = 0
    _go(None)


def _pick_run() -> None:
    chosen = state["pp_run"]
    for key in ("run", "task", "pair"):
        st.query_params.pop(key, None)
    if chosen != ALL:
        st.query_params["run"] = chosen
    state[PAGE] = 0


def _pick_task() -> None:
    chosen = state["pp_task"]
    st.query_params.pop("task", None)
    if chosen != ALL:
        st.query_params["task"] = chosen
    _restart_queue()


def _picked_row(key: str, ids: Sequence[str]) -> None:
    rows = state[key].selection.rows
    if rows:
        _go(ids[rows[0]])


def _set_page() -> None:
    _go_page(int(state["pp_page_input"]) - 1, None)


# --- display helpers ----------------------------------------------------------------------------------------


def command_of(text: str) -> str:
    parsed = parse(text)
    return "(not a composite action)" if isinstance(parsed, FormatError) else parsed.command


def words_of(pair: Pair, which: str) -> list[str]:
    if pair.kind == "trajectory":
        return " ".join(f"{m['role']}: {m['content']}" for m in pair.messages(which)).split()
    return (pair.chosen if which == "chosen" else pair.rejected).split()


def _clip(words: list[str], keep: int = 6) -> str:
    if len(words) <= 2 * keep + 1:
        return " ".join(words)
    return f"{' '.join(words[:keep])} … ({len(words) - 2 * keep} words) … {' '.join(words[-keep:])}"


def word_diff(rejected: list[str], chosen: list[str]) -> pd.DataFrame:
    """difflib's opcodes over words, one row each: what only one side has, and the shared runs between."""
    names = {"equal": "same", "replace": "changed", "delete": "only rejected", "insert": "only chosen"}
    rows = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=rejected, b=chosen, autojunk=False).get_opcodes():
        show = _clip if op == "equal" else " ".join
        rows.append({"change": names[op], "rejected": show(rejected[i1:i2]), "chosen": show(chosen[j1:j2])})
    return pd.DataFrame(rows, columns=["change", "rejected", "chosen"])


def show_text(pair: Pair, which: str) -> None:
    if pair.kind == "step":
        st.code(pair.chosen if which == "chosen" else pair.rejected, language=None, wrap_lines=True)
        return
    for message in pair.messages(which):
        st.caption(ROLES.get(message.get("role", ""), "MESSAGE"))
        st.code(str(message.get("content", "")), language=None, wrap_lines=True)


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def _text(value: object) -> str:
    return "—" if value is None else str(value)


def _num(value: object) -> float | None:
    return round(float(value), 3) if isinstance(value, int | float) and not isinstance(value, bool) else None


def sides_table(pair: Pair) -> pd.DataFrame:
    """Both sides of the pair's first source: node, Q (eq. 10), Q~, Q^, visits, author, model, seed."""
    src = pair.provenance
    rows = [{
        "side": side, "node": src.get(f"{side}_node"), "Q": _num(src.get(f"q_{side}")),
        "Q~ (MCTS)": _num(src.get(f"q_mcts_{side}")), "Q^ (critic)": _num(src.get(f"q_critic_{side}")),
        "visits": src.get(f"visits_{side}"), "proposed by": src.get(f"author_{side}") or "policy",
        "model": _text(src.get(f"model_{side}")), "seed": _text(src.get(f"seed_{side}")),
    } for side in ("chosen", "rejected")]
    return pd.DataFrame(rows)


def sources_table(pair: Pair) -> pd.DataFrame:
    """Every build that made the pair (one row per run / node it came from), its own first."""
    rows = [{
        "run": str(s.get("run_id", "")), "task": str(s.get("task_id", "")), "node": s.get("node_id"),
        "chosen node": s.get("chosen_node"), "rejected node": s.get("rejected_node"),
        "margin": _num(s.get("margin")), "Q chosen": _num(s.get("q_chosen")), "Q rejected": _num(s.get("q_rejected")),
        "visits": f"{s.get('visits_chosen')} / {s.get('visits_rejected')}",
        "authors": f"{s.get('author_chosen') or 'policy'} / {s.get('author_rejected') or 'policy'}",
        "model": " / ".join(_text(s.get(f"model_{side}")) for side in ("chosen", "rejected")),
        "seed": " / ".join(_text(s.get(f"seed_{side}")) for side in ("chosen", "rejected")),
        "alpha": _num(s.get("alpha")), "source id": str(s.get("pair_id", "")),
    } for s in pair.sources]
    return pd.DataFrame(rows)


def why_this_pair(pair: Pair) -> None:
    """The pair's provenance and every source, as text and data frames only (ids and model names are untrusted)."""
    if not pair.sources:
        st.info("This pair was stored before pairs kept their provenance: rebuild the run's pairs to record it.")
        return
    src = pair.provenance
    why = (f"Q(chosen) − Q(rejected) = {fmt(_num(src.get('margin')))} (eq. 10, alpha {src.get('alpha')}) is over "
           "the build's theta, and the two sides ask the env for different commands."
           if pair.kind == "step" else
           f"a successful trajectory against a failed one (reward margin {fmt(_num(src.get('margin')))}), with "
           "different commands.")
    st.text(f"Built from run {src.get('run_id')} · task {src.get('task_id')} · node {src.get('node_id')}: {why}")
    st.dataframe(sides_table(pair), hide_index=True, key=f"pp_sides_{pair.id}_{pair.version}")
    n = len(pair.sources)
    st.caption(f"Sources: {n} build{'s' if n != 1 else ''} made this pair"
               + (" (the same prompt and the same two commands: merged into one pair)" if n > 1 else ""))
    st.dataframe(sources_table(pair), hide_index=True, key=f"pp_sources_{pair.id}_{pair.version}")
    if pair.status == "edited":
        st.caption("A person edited or swapped this pair since it was built: the provenance is the build's.")


# --- resolve the filters (run and task from the URL) --------------------------------------------------------

notes: list[str] = []
run_id = data.resolve_run(db, qp["run"], version) if qp.get("run") else None
if qp.get("run") and run_id is None:
    notes.append("The run named in the URL was not found (or is ambiguous); showing all runs.")
    qp.pop("run", None)
tasks = [task for _, task in data.tree_index(db, run_id, version)] if run_id else []
task_id = qp.get("task")
if task_id is not None and task_id not in tasks:
    if run_id is not None:
        notes.append("The task named in the URL is not in this run; showing all its tasks.")
    task_id = None
    qp.pop("task", None)
if run_id is not None:
    qp["run"] = run_id

run_names = {r.id: f"{r.name} · {r.id}" for r in runs}
state["pp_run"] = run_id or ALL
state["pp_task"] = task_id or ALL
run_info = next((r for r in runs if r.id == run_id), None)
limits = [int(r.config.get("depth_limit", 0) or 0) for r in ([run_info] if run_info else runs)]
max_depth = max([*limits, 1])

with st.sidebar:
    st.selectbox("Run", [ALL, *(r.id for r in reversed(runs))], key="pp_run", on_change=_pick_run,
                 format_func=lambda i: "All runs" if i == ALL else run_names.get(i, i))
    st.selectbox("Task", [ALL, *tasks], key="pp_task", on_change=_pick_task, disabled=run_id is None,
                 format_func=lambda t: "All tasks" if t == ALL else t,
                 help=None if run_id else "Choose a run first")
    kind_label = st.selectbox("Kind", list(KINDS), key="pp_kind", on_change=_restart_queue,
                              persist_state="session")
    statuses = st.multiselect("Status", list(CURATION_STATUSES), key="pp_status", on_change=_restart_queue,
                              placeholder="all statuses", persist_state="session")
    depth = st.slider("Depth (of the node the pair branches at)", 0, max_depth, (0, max_depth),
                      key=f"pp_depth_{max_depth}", on_change=_restart_queue)
    min_gap = st.slider("Minimum Q gap (chosen − rejected)", 0.0, 1.0, 0.0, 0.05, key="pp_gap",
                        on_change=_restart_queue, persist_state="session")
    order_label = st.radio("Order", list(ORDERS), key="pp_order", on_change=_restart_queue,
                           persist_state="session")

f = data.filters(
    run_id=run_id, task_id=task_id, kind=KINDS[kind_label], status=statuses,
    depth_min=depth[0] if depth[0] > 0 else None, depth_max=depth[1] if depth[1] < max_depth else None,
    min_gap=min_gap if min_gap > 0 else None,
)
order = ORDERS[order_label]

st.title("Preference pairs")
for note in notes:
    st.warning(note)
builders.pairs_builder(db, run_info)

counts = data.pair_counts(db, f, version)
total = counts["total"]
with st.sidebar:
    if total and st.toggle("Export these pairs", key="pp_export",
                           help="The TRL DPO rows `orchard export pairs` writes, of the pairs the filters match."):
        n_rows, blob = data.export_rows(db, "pairs", f, version)
        st.download_button(f"Download {n_rows} DPO rows (JSONL)", blob, file_name="pairs.jsonl",
                           mime="application/jsonl", key="pp_download", on_click="ignore")
pages = max(1, -(-total // PAGE_SIZE))
page = min(max(int(state.get(PAGE, 0)), 0), pages - 1)

# The pair to show: the URL's, else the first of the queue page. A shared link's pair is looked for in
# the queue so that Next / Previous continue from it.
pair_id = qp.get("pair")
rows = data.pair_page(db, f, order, PAGE_SIZE, page * PAGE_SIZE, version)
ids = [p.id for p in rows]
if pair_id is not None and pair_id not in ids:
    for other in range(min(pages, MAX_SCAN_PAGES)):
        found = data.pair_page(db, f, order, PAGE_SIZE, other * PAGE_SIZE, version) if other != page else []
        if pair_id in [p.id for p in found]:
            page, rows, ids = other, found, [p.id for p in found]
            break
state[PAGE] = page

loaded = data.read_pair(db, pair_id) if pair_id is not None else None
if pair_id is not None and loaded is None:
    st.warning("The pair named in the URL does not exist (any more); showing the queue's first pair.")
    pair_id = None
if pair_id is None and ids:
    pair_id = ids[0]
    loaded = data.read_pair(db, pair_id)
if pair_id is not None:
    qp["pair"] = pair_id

st.caption(
    f"{total} pairs match the filters · {counts['pending']} pending · {counts['approved']} approved · "
    f"{counts['rejected']} rejected · {counts['edited']} edited"
)

flash = state.pop(FLASH, None)
if flash:
    st.success(flash)  # built from fixed words and hex pair ids only
error = state.get(ERROR)
if error and error[0] != pair_id:  # about no pair in particular, or one that is not shown (any more)
    st.error("Not saved.")
    st.code(state.pop(ERROR)[1], language=None, wrap_lines=True)

# --- the queue ----------------------------------------------------------------------------------------------

walk = walk_order(repr((f, order, page)), ids)
index = walk.index(pair_id) if pair_id in walk else None
with st.expander(f"Queue: page {page + 1} of {pages}", expanded=True):
    if rows:
        table = pd.DataFrame([{
            "": "▶" if p.id == pair_id else "",
            "pair": p.id, "task": p.task_id, "node": p.node_id, "depth": p.depth, "kind": p.kind,
            "Q chosen": round(p.q_chosen, 3), "Q rejected": round(p.q_rejected, 3), "gap": round(p.gap, 3),
            "status": p.status, "sources": len(p.sources),
            "chosen": command_of(p.chosen) if p.kind == "step" else "(trajectory)",
            "rejected": command_of(p.rejected) if p.kind == "step" else "(trajectory)",
        } for p in rows])
        key = f"pp_table_{page}_{pair_id}"
        st.dataframe(table, hide_index=True, key=key, on_select=partial(_picked_row, key, ids),
                     selection_mode="single-row", height=min(38 + 35 * len(table), 280))
    else:
        st.info("No pairs match these filters. Build them with `orchard pairs build RUN`, or widen the "
                "filters.")
    if pages > 1:
        state["pp_page_input"] = page + 1
        st.number_input("Queue page", 1, pages, key="pp_page_input", on_change=_set_page)

    with st.popover(f"Bulk decision on all {total} matching pairs", disabled=total == 0 or not auth.may("settle")):
        st.caption("Sets the status of every pair the filters match (not only this page), in one step, "
                   "recorded in each pair's history. Pairs that already have that status are left alone.")
        sure = st.checkbox(f"Yes, change all {total} pairs", key="pp_bulk_ok")
        c = st.columns(2)
        c[0].button(f"Approve all {total}", key="pp_bulk_approve", disabled=not sure, on_click=_bulk,
                    args=(f, "approved", total))
        c[1].button(f"Reject all {total}", key="pp_bulk_reject", disabled=not sure, on_click=_bulk,
                    args=(f, "rejected", total))

if loaded is None:
    st.stop()

# --- the pair -----------------------------------------------------------------------------------------------

pair, history = loaded
expected, blocked = guard.panel(pair)

if index is not None:
    prev_target: tuple[int, str | None] | None = (page, walk[index - 1]) if index > 0 else None
    if index == 0 and page > 0:
        before = data.pair_page(db, f, order, PAGE_SIZE, (page - 1) * PAGE_SIZE, version)
        prev_target = (page - 1, before[-1].id if before else None)
    next_target: tuple[int, str | None] | None = (page, walk[index + 1]) if index + 1 < len(walk) else None
    if next_target is None and page + 1 < pages:
        next_target = (page + 1, None)
else:  # a pair outside the queue (a link): Next goes to the queue's first pair
    prev_target, next_target = None, (page, ids[0]) if ids else None
then = (f, order, page, walk)

st.subheader(f"Pair {index + 1 + page * PAGE_SIZE if index is not None else '—'} of {total}")
nav = st.columns(4)
nav[0].button("Previous", key="pp_prev", icon=":material/arrow_back:", shortcut="K", width="stretch",
              disabled=prev_target is None, on_click=_go_page, args=prev_target or (page, None))
nav[1].button("Approve & next", key="pp_approve_next", icon=":material/check:", type="primary", shortcut="A",
              width="stretch", disabled=blocked, on_click=_decide,
              args=(pair.id, expected, "approved", then))
nav[2].button("Reject & next", key="pp_reject_next", icon=":material/close:", shortcut="X",
              width="stretch", disabled=blocked, on_click=_decide, args=(pair.id, expected, "rejected", then))
nav[3].button("Next", key="pp_next", icon=":material/arrow_forward:", shortcut="J", width="stretch",
              disabled=next_target is None, on_click=_go_page, args=next_target or (page, None))
more = st.columns(4)
more[0].button("Approve", key="pp_approve", disabled=blocked or pair.status == "approved", width="stretch",
               on_click=_decide, args=(pair.id, expected, "approved"))
more[1].button("Reject", key="pp_reject", disabled=blocked or pair.status == "rejected", width="stretch",
               on_click=_decide, args=(pair.id, expected, "rejected"))
more[2].button("Swap chosen / rejected", key="pp_swap", icon=":material/swap_horiz:", disabled=blocked,
               width="stretch", on_click=_swap, args=(pair.id, expected))
more[3].button("Reset to pending", key="pp_reset", disabled=blocked or pair.status == "pending",
               width="stretch", on_click=_decide, args=(pair.id, expected, "pending"))
st.caption("Shortcuts: A approve & next · X reject & next · J next · K previous "
           "(not while typing in a field).")

error = state.get(ERROR)
if error and error[0] == pair.id:
    st.error("Not saved: the store refused this change.")
    st.code(error[1], language=None, wrap_lines=True)

cells = st.columns(6)
cells[0].metric("Status", md(pair.status))
cells[1].metric("Q chosen", fmt(pair.q_chosen))
cells[2].metric("Q rejected", fmt(pair.q_rejected))
cells[3].metric("Q gap", fmt(pair.gap))
cells[4].metric("Depth", pair.depth)
cells[5].metric("Version", pair.version)
st.text(f"pair {pair.id} · {pair.kind} pair · run {pair.run_id} · task {pair.task_id} · node {pair.node_id} "
        f"(chosen node {pair.chosen_node}, rejected node {pair.rejected_node}) · last changed by "
        f"{pair.updated_by or '—'}")

with st.expander(f"Why this pair ({len(pair.sources)} source{'s' if len(pair.sources) != 1 else ''})"):
    why_this_pair(pair)

if pair.prompt:
    last = pair.prompt[-1]
    with st.expander("Prompt: what the agent saw (last message)", expanded=pair.kind == "step"):
        st.code(str(last.get("content", "")), language=None, wrap_lines=True)
    with st.expander(f"Full prompt ({len(pair.prompt)} messages)"):
        for message in pair.prompt:
            st.caption(ROLES.get(message.get("role", ""), "MESSAGE"))
            st.code(str(message.get("content", "")), language=None, wrap_lines=True)

left, right = st.columns(2, gap="medium")
with left:
    st.markdown("#### :green[Chosen]")
    st.caption(f"Q = {fmt(pair.q_chosen)} · log-prob {fmt(pair.logprob_chosen, '.2f')}")
    show_text(pair, "chosen")
with right:
    st.markdown("#### :red[Rejected]")
    st.caption(f"Q = {fmt(pair.q_rejected)} · log-prob {fmt(pair.logprob_rejected, '.2f')}")
    show_text(pair, "rejected")

st.caption("Word diff (rejected → chosen)")
st.dataframe(word_diff(words_of(pair, "rejected"), words_of(pair, "chosen")), hide_index=True,
             key=f"pp_diff_{pair.id}_{pair.version}")

if pair.kind == "step":
    with st.expander("Edit the texts", expanded=bool(error and error[0] == pair.id)):
        st.caption("Each text must stay a composite action (THOUGHT / ACTION / EXPLANATION / STATUS); the "
                   "store checks it with the action parser and refuses anything else. Saving marks the pair "
                   "edited.")
        for which in ("chosen", "rejected"):
            key = f"pp_edit_{which}_{pair.id}"
            if key not in state:
                state[key] = pair.chosen if which == "chosen" else pair.rejected
        with st.form(f"pp_edit_form_{pair.id}", border=False):
            c = st.columns(2)
            c[0].text_area("Chosen", key=f"pp_edit_chosen_{pair.id}", height=180)
            c[1].text_area("Rejected", key=f"pp_edit_rejected_{pair.id}", height=180)
            st.form_submit_button("Save edit", key="pp_save_edit", disabled=blocked, on_click=_save_edit,
                                  args=(pair.id, expected, (pair.chosen, pair.rejected)))
else:
    st.caption("Trajectory pairs are whole episodes: they can be approved, rejected or swapped, not edited.")

st.caption("History (newest first)")
st.dataframe(history_table(history), hide_index=True, key=f"pp_history_{pair.id}_{pair.version}")
