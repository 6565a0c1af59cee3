"""The Data pages (trajectories, preference pairs, refinement data) through Streamlit's AppTest, on a
private copy of the fixture store per test (the pages write curation decisions)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from dash_fixtures import JUDGE_BAD, XSS, copy_store, open_app
from streamlit.testing.v1 import AppTest

from engine.datasets.pairs import Pair
from engine.datasets.samples import Sample, Task, Turn
from engine.store import Store

PAIRS = "views/pairs.py"
TRAJECTORIES = "views/trajectories.py"
REFINEMENT = "views/refinement.py"


@pytest.fixture()
def db(store_db, tmp_path: Path, monkeypatch) -> tuple[Path, dict[str, str]]:
    source, runs = store_db
    path = copy_store(source, tmp_path / "orchard.db")
    monkeypatch.setenv("ORCHARD_DB", str(path))
    return path, runs


def open_page(page: str, who: str | None = None, **params: str) -> AppTest:
    at = open_app(page, **params)
    if who is not None:
        at.text_input(key="who").input(who).run()
    assert not at.exception
    return at


def stored_pair(path: Path, pair_id: str) -> Pair:
    with Store(path) as store:
        return store.pair(pair_id)


def queue(at: AppTest):
    """The queue table (the first data frame on the pairs page)."""
    return at.dataframe[0].value


def frame(at: AppTest, column: str):
    """The first data frame with `column` (frames without selection carry no key in AppTest)."""
    return next(d.value for d in at.dataframe if column in d.value)


def markdown_texts(at: AppTest) -> list[str]:
    kinds = ("markdown", "caption", "title", "header", "subheader")
    out = [e.value for kind in kinds for e in getattr(at, kind)]
    out += [e.value for kind in ("info", "warning", "error", "success") for e in getattr(at, kind)]
    return out + [m.label for m in at.metric] + [str(m.value) for m in at.metric]


def code_texts(at: AppTest) -> list[str]:
    return [e.value for e in at.code] + [e.value for e in at.text]


def frame_texts(at: AppTest) -> str:
    return "\n".join(d.value.to_csv() for d in at.dataframe)


def assert_no_markup_rendered(at: AppTest) -> None:
    assert all("<script" not in t and "**bold**" not in t for t in markdown_texts(at))
    assert not at.get("html")


# --- preference pairs ---------------------------------------------------------------------------------------


def test_filters_narrow_the_queue_and_the_url_names_run_task_pair(db) -> None:
    path, runs = db
    at = open_page(PAIRS, run="fixture-run")
    assert at.title[0].value == "Preference pairs"
    with Store(path) as store:
        steps = store.pair_counts(run_id=runs["main"], kind="step")["total"]
        every = store.pair_counts(run_id=runs["main"])["total"]
        goal4 = store.pairs(run_id=runs["main"], task_id="goal-4")
    assert at.query_params["run"] == runs["main"]
    assert set(queue(at)["kind"]) == {"step"}  # step pairs first: the Agent Q data
    assert len(queue(at)) == steps and f"{steps} pairs match" in at.caption[0].value
    at.selectbox(key="pp_kind").select("All kinds").run()
    assert len(queue(at)) == every > steps

    at.selectbox(key="pp_task").select("goal-4").run()
    assert at.query_params["task"] == "goal-4"
    table = queue(at)
    assert list(table["pair"]) == [p.id for p in goal4] and set(table["task"]) == {"goal-4"}
    assert at.query_params["pair"] == goal4[0].id  # the first of the queue is shown

    at.selectbox(key="pp_kind").select("Step pairs").run()
    assert set(queue(at)["kind"]) == {"step"}
    at.slider(key="pp_gap").set_value(0.8).run()
    table = queue(at)
    expected = [p.id for p in goal4 if p.kind == "step" and p.gap >= 0.8]
    assert expected and list(table["pair"]) == expected
    at.slider(key="pp_depth_5").set_value((1, 1)).run()  # the run's depth limit is 5
    assert set(queue(at)["depth"]) <= {1}
    assert not at.exception


def test_approve_and_next_records_who_and_moves_to_the_next_pair(db) -> None:
    path, runs = db
    at = open_page(PAIRS, who="alice", run=runs["main"], task="goal-4")
    ids = list(queue(at)["pair"])
    assert at.query_params["pair"] == ids[0]
    at.button(key="pp_approve_next").click().run()
    assert not at.exception
    stored = stored_pair(path, ids[0])
    assert (stored.status, stored.updated_by, stored.version) == ("approved", "alice", 2)
    assert at.query_params["pair"] == ids[1]
    assert any(f"Approved pair {ids[0]}" in s.value for s in at.success)

    # With a "pending" filter the approved pair leaves the queue: the next one takes its place.
    at.multiselect(key="pp_status").select("pending").run()
    pending = list(queue(at)["pair"])
    assert ids[0] not in pending and at.query_params["pair"] == pending[0] == ids[1]
    at.button(key="pp_reject_next").click().run()
    assert stored_pair(path, ids[1]).status == "rejected"
    assert at.query_params["pair"] == ids[2] and ids[1] not in list(queue(at)["pair"])

    at.button(key="pp_next").click().run()
    assert at.query_params["pair"] == ids[3]
    at.button(key="pp_prev").click().run()
    assert at.query_params["pair"] == ids[2]


def test_history_lists_who_did_what(db) -> None:
    path, runs = db
    at = open_page(PAIRS, who="alice", run=runs["main"], task="goal-3")
    pair_id = at.query_params["pair"]
    at.button(key="pp_reject").click().run()
    at.text_input(key="who").input("bob").run()
    at.button(key="pp_approve").click().run()
    history = at.dataframe[-1].value  # newest first
    assert list(history["who"]) == ["bob", "alice", "orchard"]
    assert list(history["action"]) == ["approved", "rejected", "created"]  # in words, no raw JSON
    assert list(history["after"]) == ["status: approved", "status: rejected", "status: pending"]
    assert list(history["before"]) == ["status: rejected", "status: pending", ""] and list(history["version"]) == [3, 2, 1]
    assert not any("{" in v for v in (*history["before"], *history["after"]))
    with Store(path) as store:
        assert [h.who for h in store.pair_history(pair_id)] == ["orchard", "alice", "bob"]


def test_swap_exchanges_chosen_and_rejected(db) -> None:
    path, runs = db
    at = open_page(PAIRS, who="carol", run=runs["main"], task="goal-4")
    at.selectbox(key="pp_kind").select("Step pairs").run()
    pair_id = at.query_params["pair"]
    before = stored_pair(path, pair_id)
    assert before.chosen in code_texts(at) and before.rejected in code_texts(at)
    at.button(key="pp_swap").click().run()
    after = stored_pair(path, pair_id)
    assert (after.chosen, after.rejected) == (before.rejected, before.chosen)
    assert (after.q_chosen, after.q_rejected, after.status) == (before.q_rejected, before.q_chosen, "edited")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Q chosen"] == f"{after.q_chosen:.3f}" and metrics["Status"] == "edited"
    diff = frame(at, "change")
    assert "same" in set(diff["change"]) and set(diff["change"]) & {"changed", "only chosen", "only rejected"}


def test_edit_is_validated_by_the_action_parser(db) -> None:
    path, runs = db
    at = open_page(PAIRS, who="dave", run=runs["main"], task="goal-4")
    at.selectbox(key="pp_kind").select("Step pairs").run()
    pair_id = at.query_params["pair"]
    before = stored_pair(path, pair_id)

    # Form fields are sent with the form's submit button, as in the browser.
    at.text_area(key=f"pp_edit_chosen_{pair_id}").input("I think I should go right, no sections at all")
    at.button(key="pp_save_edit").click().run()
    assert not at.exception
    assert any("Not saved" in e.value for e in at.error)
    assert any("no ACTION section" in c for c in code_texts(at))
    assert stored_pair(path, pair_id) == before  # untouched

    better = "THOUGHT: The goal is right.\nACTION: right\nEXPLANATION: one step closer.\nSTATUS: CONTINUE"
    at.text_area(key=f"pp_edit_chosen_{pair_id}").input(better)
    at.button(key="pp_save_edit").click().run()
    after = stored_pair(path, pair_id)
    assert (after.chosen, after.rejected) == (better, before.rejected)
    assert (after.status, after.updated_by) == ("edited", "dave")
    assert not at.error and better in code_texts(at)
    assert at.dataframe[-1].value["action"][0] == "edited"


def test_bulk_approve_changes_exactly_what_the_filter_matches(db) -> None:
    path, runs = db
    at = open_page(PAIRS, who="erin", run=runs["main"], task="goal-5")
    at.selectbox(key="pp_kind").select("Step pairs").run()
    with Store(path) as store:
        matched = [p.id for p in store.pairs(run_id=runs["main"], task_id="goal-5", kind="step")]
        others = store.pair_counts(run_id=runs["main"], status="pending")["total"] - len(matched)
    assert matched and at.button(key="pp_bulk_approve").disabled  # needs the confirmation first
    at.checkbox(key="pp_bulk_ok").check().run()
    at.button(key="pp_bulk_approve").click().run()
    assert not at.exception
    assert any(f"Approved {len(matched)} pairs" in s.value for s in at.success)
    with Store(path) as store:
        assert {p.id for p in store.pairs(run_id=runs["main"], status="approved")} == set(matched)
        assert store.pair_counts(run_id=runs["main"], status="pending")["total"] == others
        assert {store.pair_history(i)[-1].who for i in matched} == {"erin"}
    assert set(queue(at)["status"]) == {"approved"}
    assert not at.warning  # the pair on screen was changed by this person, not by someone else
    assert at.checkbox(key="pp_bulk_ok").value is False  # the next bulk needs a new confirmation


def test_second_save_on_a_changed_pair_is_refused_with_a_clear_message(db) -> None:
    path, runs = db
    at = open_page(PAIRS, who="alice", run=runs["main"], task="goal-4")
    at.selectbox(key="pp_kind").select("Step pairs").run()
    pair_id = at.query_params["pair"]
    with Store(path) as other:  # someone else, between this page's load and its save
        other.set_pair_status(pair_id, "rejected", "bob", expected_version=1)
    at.button(key="pp_approve").click().run()
    assert not at.exception
    stored = stored_pair(path, pair_id)
    assert (stored.status, stored.updated_by, stored.version) == ("rejected", "bob", 2)  # not overwritten
    assert any("NOT saved" in w.value for w in at.warning)
    assert any("changed by bob" in c and "you had version 1, it is now 2" in c for c in code_texts(at))
    assert at.button(key="pp_approve_next").disabled and at.button(key="pp_save_edit").disabled
    with Store(path) as store:
        assert [h.action for h in store.pair_history(pair_id)] == ["create", "reject"]

    at.button(key="pp_reload").click().run()
    assert not at.warning and not at.button(key="pp_approve").disabled
    at.button(key="pp_approve").click().run()
    assert stored_pair(path, pair_id).status == "approved"
    assert stored_pair(path, pair_id).updated_by == "alice"

    # A change by someone else that shows up on a plain rerun is pointed out before anyone clicks.
    with Store(path) as other:
        other.set_pair_status(pair_id, "pending", "bob", expected_version=3)
    at.run()
    assert any("changed this pair after you opened it" in w.value and "NOT saved" not in w.value
               for w in at.warning)
    assert at.button(key="pp_approve").disabled and at.metric[0].value == "pending"


def test_two_people_editing_the_same_pair_the_second_save_is_refused(db) -> None:
    path, runs = db
    at = open_page(PAIRS, who="alice", run=runs["main"], task="goal-4")
    at.selectbox(key="pp_kind").select("Step pairs").run()
    pair_id = at.query_params["pair"]
    before = stored_pair(path, pair_id)
    theirs = "THOUGHT: Bob's version.\nACTION: right\nEXPLANATION: bob\nSTATUS: CONTINUE"
    mine = "THOUGHT: Alice's version.\nACTION: right\nEXPLANATION: alice\nSTATUS: CONTINUE"
    at.text_area(key=f"pp_edit_chosen_{pair_id}").input(mine)  # alice is typing ...
    with Store(path) as other:  # ... while bob saves his edit of the same pair
        other.edit_pair(pair_id, theirs, before.rejected, "bob", expected_version=before.version)
    at.button(key="pp_save_edit").click().run()  # alice saves second
    assert not at.exception
    stored = stored_pair(path, pair_id)
    assert (stored.chosen, stored.updated_by) == (theirs, "bob")
    assert any("NOT saved" in w.value and "nothing was overwritten" in w.value for w in at.warning)
    assert at.text_area(key=f"pp_edit_chosen_{pair_id}").value == mine  # her draft is still there to copy
    assert theirs in code_texts(at)  # and the page shows bob's version
    at.button(key="pp_reload").click().run()
    assert at.text_area(key=f"pp_edit_chosen_{pair_id}").value == theirs


def test_a_pair_removed_meanwhile_is_explained_not_a_traceback(db) -> None:
    path, runs = db
    at = open_page(PAIRS, run=runs["main"], task="goal-3")
    pair_id = at.query_params["pair"]
    with Store(path) as store:  # a rebuild that no longer produces any pair prunes the untouched ones
        store.save_pairs(runs["main"], [])
    at.button(key="pp_approve").click().run()
    assert not at.exception
    assert any("Not saved" in e.value for e in at.error)
    assert any(f"no pair '{pair_id}'" in c for c in code_texts(at))
    assert any("No pairs match" in i.value for i in at.info)


def test_shared_link_and_unknown_url_values(db) -> None:
    path, runs = db
    with Store(path) as store:
        ids = [p.id for p in store.pairs(run_id=runs["main"], task_id="goal-4", kind="step")]
    at = open_page(PAIRS, run=runs["main"], task="goal-4", pair=ids[3])
    assert at.subheader[0].value == f"Pair 4 of {len(ids)}"
    assert ids[3] in at.text[0].value
    at.button(key="pp_prev").click().run()
    assert at.query_params["pair"] == ids[2]

    at = open_page(PAIRS, run="no-such-run", task="nope", pair="0" * 20)
    warnings = " ".join(w.value for w in at.warning)
    assert "run named in the URL was not found" in warnings and "does not exist" in warnings
    assert "run" not in at.query_params and at.query_params["pair"] == queue(at)["pair"][0]


def test_pair_texts_with_markup_are_shown_as_text(db) -> None:
    path, runs = db
    with Store(path) as store:
        marked = [p for p in store.pairs(run_id=runs["main"]) if XSS in p.prompt[-1]["content"]
                  or XSS in p.chosen + p.rejected]
    assert marked, "the fixture env answers 'wait' with markup"
    at = open_page(PAIRS, run=runs["main"], task=marked[0].task_id, pair=marked[0].id)
    assert any(XSS in c for c in code_texts(at))
    assert_no_markup_rendered(at)


# --- trajectories -------------------------------------------------------------------------------------------


def revision_judged_bad(path: Path):
    with Store(path) as store:
        return next(s for s in store.samples(kind="revision")
                    if any(j["answer"] == JUDGE_BAD for j in s.source["judgements"]))


def test_trajectories_show_both_paths_t_prime_and_its_judgement(db) -> None:
    path, runs = db
    sample = revision_judged_bad(path)
    src = sample.source
    at = open_page(TRAJECTORIES, run=runs["main"], task=sample.task.id, sample=sample.id)
    assert at.title[0].value == "Trajectories" and at.query_params["sample"] == sample.id
    good, bad = [d.value for d in at.dataframe if "observation" in d.value and "step" in d.value]
    assert list(good["node"]) == src["good_path"] and list(bad["node"]) == src["bad_path"]
    marked = bad[bad[""] == "◀ t'"]
    assert list(marked["node"]) == [src["t_prime_node"]] and list(marked["judgement"]) == ["Bad"]
    split = next(i for i, (b, g) in enumerate(zip(src["bad_path"], src["good_path"])) if b != g)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["t' (bad path step)"] == str(split + src["t_prime"] + 1)
    assert JUDGE_BAD in code_texts(at)  # the judge's own words, verbatim
    assert any("Transition point t'" in m.value and f"node {src['t_prime_node']}" in m.value
               for m in at.markdown)

    spliced = frame(at, "loss")
    assert list(spliced["part"]) == [
        {"prefix": "shared prefix", "bad": "bad steps (to t')", "revision": "revision turn",
         "good": "good suffix"}[t.segment] for t in sample.turns]
    assert list(spliced["loss"]) == ["✗ no loss" if t.loss is False else "✓ trained" for t in sample.turns]
    assert "✗ no loss" in set(spliced["loss"]) and "revision turn" in set(spliced["part"])
    assert list(spliced["node"]) == ["— (revision turn)" if t.node is None else str(t.node) for t in sample.turns]
    assert not {"None", "<NA>", "nan"} & set(spliced["node"])  # the revision turn has no node: said so
    assert_no_markup_rendered(at)  # the judge's answer carries markup


def test_trajectory_approve_with_version_check(db) -> None:
    path, runs = db
    at = open_page(TRAJECTORIES, who="frank", run=runs["main"])
    sample_id = at.query_params["sample"]
    at.button(key="tr_approve").click().run()
    with Store(path) as store:
        assert (store.sample(sample_id).status, store.sample(sample_id).updated_by) == ("approved", "frank")
        store.set_sample_status(sample_id, "rejected", "gina", expected_version=2)
    at.button(key="tr_reset").click().run()
    assert not at.exception and any("NOT saved" in w.value for w in at.warning)
    with Store(path) as store:
        assert store.sample(sample_id).status == "rejected"
    at.button(key="tr_next").click().run()
    assert at.query_params["sample"] != sample_id


# --- refinement ---------------------------------------------------------------------------------------------


def test_refinement_shows_dm_evaluations_and_toggles_a_loss_flag(db) -> None:
    path, _ = db
    with Store(path) as store:
        sample = next(s for s in store.samples(kind="refine") if s.task.id == "apprentice")
    at = open_page(REFINEMENT, sample=sample.id)
    at.switch_page(PAIRS).run()  # the name is kept across pages
    at.text_input(key="who").input("hana").run()
    at.switch_page(REFINEMENT).run()
    assert at.text_input(key="who").value == "hana" and at.query_params["sample"] == sample.id
    heads = [m.value for m in at.markdown if m.value.startswith("**Turn")]
    flagged = [i for i, t in enumerate(sample.turns) if t.loss is False]
    assert flagged == [1, 3] and len(heads) == len(sample.turns)
    assert all(("flagged as an error" in h) == (i in flagged) for i, h in enumerate(heads))
    assert sample.source["script"]["task"] in code_texts(at)
    evaluations = sample.source["verification"]["evaluations"]
    assert [e["error"] != "none" for e in evaluations] == [i in flagged for i in range(len(sample.turns))]
    details = [e["detail"] for e in evaluations if e["detail"]]
    assert details and all(d in code_texts(at) for d in details)  # the DM's reasons, as text
    assert any(XSS in c for c in code_texts(at))
    assert_no_markup_rendered(at)

    box = f"rf_loss_{sample.id}_1_{sample.version}"
    assert at.checkbox(key=box).value is False
    at.checkbox(key=box).check().run()
    assert not at.exception
    with Store(path) as store:
        stored = store.sample(sample.id)
        assert stored.turns[1].loss is True and stored.status == "edited"
        assert store.sample_history(sample.id)[-1].who == "hana"
    assert at.checkbox(key=f"rf_loss_{sample.id}_1_{stored.version}").value is True
    turn2 = next(m.value for m in at.markdown if m.value.startswith("**Turn 2"))
    assert "mask differs from the DM's verdict" in turn2


def test_refinement_approve_and_next_and_a_refused_stale_toggle(db) -> None:
    path, _ = db
    at = open_page(REFINEMENT, who="ivan")
    first = at.query_params["sample"]
    ids = list(at.dataframe[0].value["sample"])
    at.button(key="rf_approve_next").click().run()
    assert not at.exception and at.query_params["sample"] == ids[1]
    with Store(path) as store:
        assert (store.sample(first).status, store.sample(first).updated_by) == ("approved", "ivan")
        version = store.sample(ids[1]).version
        store.set_turn_loss(ids[1], 0, False, "judy", expected_version=version)  # someone else, meanwhile
    at.checkbox(key=f"rf_loss_{ids[1]}_2_{version}").uncheck().run()
    assert not at.exception and any("NOT saved" in w.value for w in at.warning)
    with Store(path) as store:
        stored = store.sample(ids[1])
        assert stored.turns[2].loss is True and stored.turns[0].loss is False and stored.updated_by == "judy"
    at.button(key="rf_reload").click().run()
    assert not at.warning


# --- robustness ---------------------------------------------------------------------------------------------


def test_pages_without_datasets_say_how_to_build_them(tmp_path: Path, monkeypatch) -> None:
    from doubles import ScriptedGenerator, SnapshotLineEnv

    from engine.config import SearchConfig
    from engine.search.runner import new_run

    path = tmp_path / "runs-only.db"
    with Store(path) as store:
        new_run(store, "line", SnapshotLineEnv().tasks()[:1], ScriptedGenerator(),
                SearchConfig(simulations=2, k=2, depth_limit=2), "bare", make_env=SnapshotLineEnv)
    monkeypatch.setenv("ORCHARD_DB", str(path))
    expected = {PAIRS: "orchard pairs build", TRAJECTORIES: "orchard revisions build",
                REFINEMENT: "orchard refine"}
    for page, command in expected.items():
        at = open_page(page, sample="nope", pair="nope")
        assert any(command in i.value for i in at.info), page
        assert not at.error


def test_foreign_database_is_refused_on_every_data_page(monkeypatch, foreign_db: Path) -> None:
    monkeypatch.setenv("ORCHARD_DB", str(foreign_db))
    for page in (PAIRS, TRAJECTORIES, REFINEMENT):
        at = open_page(page)
        assert at.error and "cannot be opened" in at.error[0].value
        assert all("Traceback" not in c for c in code_texts(at))


def test_the_queue_pages_through_more_pairs_than_fit_one_page(db) -> None:
    path, runs = db
    with Store(path) as store:
        real = store.pairs(run_id=runs["main"])
        template = next(p for p in real if p.kind == "step")
        extra = [replace(template, id=f"extra{i:03d}", node_id=1000 + i, q_chosen=0.9, q_rejected=0.1, merge_key="",
                         sources=()) for i in range(60)]  # distinct pairs: no content key, so never merged
        store.save_pairs(runs["main"], [*real, *extra])
        ordered = [p.id for p in store.pairs(run_id=runs["main"], kind="step")]
    assert len(ordered) > 50
    at = open_page(PAIRS, who="kim", run=runs["main"], pair=ordered[49])  # a link to the last of page 1
    assert at.subheader[0].value == f"Pair 50 of {len(ordered)}"
    at.button(key="pp_next").click().run()
    assert at.query_params["pair"] == ordered[50] and at.subheader[0].value == f"Pair 51 of {len(ordered)}"
    at.button(key="pp_prev").click().run()
    assert at.query_params["pair"] == ordered[49]

    at.multiselect(key="pp_status").select("pending").run()  # the queue of work left ...
    at.query_params["pair"] = ordered[49]  # ... from the last pair of its first page
    at.run()
    at.button(key="pp_approve_next").click().run()
    assert stored_pair(path, ordered[49]).status == "approved"
    assert at.query_params["pair"] == ordered[50]  # it moved up into page 1, where the approved one was
    assert at.subheader[0].value == f"Pair 50 of {len(ordered) - 1}"


def test_imported_refinement_rows_without_a_script_still_show(db) -> None:
    path, _ = db
    imported = Sample(id="imported-1", kind="refine", task=Task(first_observation="You are in a room."),
                      turns=(Turn("Thought: look.\nAction: look", "A door.", True), Turn("Action: open door", None)),
                      source={"file": "agentrefine.jsonl", "line": 1, "format": "agentgym", "original_id": None})
    with Store(path) as store:
        store.save_samples([imported])
    at = open_page(REFINEMENT, sample="imported-1")
    assert at.query_params["sample"] == "imported-1"
    assert any("No script was stored" in c.value for c in at.caption)
    assert "A door." in code_texts(at) and not at.error


def test_imported_rows_show_before_any_search_run(tmp_path: Path, monkeypatch) -> None:
    """`orchard import` into a new database, no run yet: the Refinement page curates the rows, the
    Training and Evaluation pages open; the search pages still say there are no runs."""
    imported = Sample(id="imported-2", kind="refine", task=Task(first_observation="A cellar."),
                      turns=(Turn("Thought: go.\nAction: go up", "A hall.", True),),
                      source={"file": "x.jsonl", "line": 1, "format": "agentgym", "original_id": None})
    path = tmp_path / "imported-only.db"
    with Store(path) as store:
        store.save_samples([imported])
    monkeypatch.setenv("ORCHARD_DB", str(path))
    at = open_page(REFINEMENT, sample="imported-2")
    assert "A hall." in code_texts(at) and not at.error and not at.info
    for page in ("views/training.py", "views/evaluation.py"):
        at = open_page(page)
        assert not at.error and not any("No runs yet" in i.value for i in at.info), page
    for page in (PAIRS, TRAJECTORIES):
        assert any("No runs yet" in i.value for i in open_page(page).info), page


def test_swap_then_approve_and_next_goes_to_the_pair_that_followed_it_not_past_it(db) -> None:
    """Tree order sorts by (node, chosen node, rejected node): a swap moves the pair down the queue. The
    next pair is the one that followed it when the curator came to it, which a swap moved up (issue 31 B)."""
    path, runs = db
    at = open_page(PAIRS, who="erin", run=runs["main"])
    at.selectbox(key="pp_kind").select("Step pairs").run()
    with Store(path) as store:
        queue_ids = [p.id for p in store.pairs(run_id=runs["main"], kind="step")]
        before = {p.id: p for p in store.pairs(run_id=runs["main"], kind="step")}
    # a pair whose swap puts it after the pair that follows it (same branching node, chosen < rejected)
    i = next(i for i, (a, b) in enumerate(pairwise(queue_ids)) if
             (before[a].tree_id, before[a].node_id) == (before[b].tree_id, before[b].node_id)
             and before[a].rejected_node > before[b].chosen_node)
    swapped, neighbour = queue_ids[i], queue_ids[i + 1]
    at.query_params["pair"] = swapped
    at.run()
    at.button(key="pp_swap").click().run()
    assert at.query_params["pair"] == swapped  # the cursor stays on the swapped pair
    with Store(path) as store:
        moved = [p.id for p in store.pairs(run_id=runs["main"], kind="step")]
    assert moved.index(swapped) > moved.index(neighbour)  # what made "next" skip the neighbour
    at.button(key="pp_approve_next").click().run()
    assert not at.exception
    assert stored_pair(path, swapped).status == "approved"
    assert at.query_params["pair"] == neighbour and stored_pair(path, neighbour).status == "pending"
    at.button(key="pp_approve_next").click().run()
    assert stored_pair(path, neighbour).status == "approved"
    assert at.query_params["pair"] == queue_ids[i + 2]  # and on past the swapped pair, not back to it
    at.button(key="pp_prev").click().run()
    assert at.query_params["pair"] == neighbour


def test_the_curators_name_is_kept_for_the_session_across_pages(db) -> None:
    """The name typed once is recorded on every later decision, after visits to pages without the field."""
    path, runs = db
    at = open_page(PAIRS, who="frank", run=runs["main"])
    at.switch_page("views/evaluation.py").run()
    assert "who" not in [t.key for t in at.text_input]
    at.switch_page(TRAJECTORIES).run()
    assert at.text_input(key="who").value == "frank"
    at.switch_page(PAIRS).run()
    pair_id = at.query_params["pair"]
    at.button(key="pp_reject").click().run()
    assert stored_pair(path, pair_id).updated_by == "frank"


def test_the_revisions_judge_defaults_to_the_runs_own_model(db) -> None:
    """Not the newest trained model: Agent-R's judge is the policy that searched (issue 31 C)."""
    from engine.store import ModelRecord

    path, runs = db
    with Store(path) as store:
        store.save_model(ModelRecord(path="/models/dpo-newest", name="dpo-newest", kind="dpo", parent="tiny",
                                     job_id=None, data_ids=[], config={}, metrics={}))
        searched_with = store.run(runs["main"]).model
    at = open_page(TRAJECTORIES, run=runs["main"])
    assert at.text_input(key="rb_model").value == searched_with != "/models/dpo-newest"


def test_a_revisions_build_that_made_nothing_says_why_with_its_counts(db) -> None:
    from dash_fixtures import Judge
    from doubles import ScriptedGenerator

    from engine.config import SearchConfig
    from engine.datasets.builds import run_revisions
    from engine.envs.registry import env_factory
    from engine.jobs.kinds import load_job
    from engine.jobs.worker import StoreReporter
    from engine.search.runner import new_run

    path, _ = db
    with Store(path) as store:  # line-env commands on TextCraft: no leaf is a success
        run_id, _ = new_run(store, "textcraft", env_factory("textcraft")().tasks("train")[:1], ScriptedGenerator(),
                            SearchConfig(simulations=3, k=2, depth_limit=2), "no-wins")
        job = store.create_job("revisions", {"run": run_id, "model": "judge-double"}, "cpu", name="revisions")
        store.claim_next_job("cpu")
        run_revisions(store, load_job("revisions", job.config), StoreReporter(store, job.id), judge=Judge())
        store.finish_job(job.id, "succeeded", output_path=run_id)
    at = open_page(TRAJECTORIES, run=run_id)
    assert not at.exception, at.exception
    why = "\n".join(w.value for w in at.warning).replace("\\", "")
    assert "no revision trajectories: none of the 1 trees has a success leaf" in why, why
    assert any("success leaves 0" in c.value.replace("\\", "") for c in at.caption)
