"""`orchard demo` end to end on whatever the embedded `tiny` policy is: every stage stores what its
dashboard page shows (issue 14 item 3). Slow: the real demo, a few minutes on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.demo import DEMO, run_demo
from engine.store import Store

STAGES = ("model (load the shipped checkpoint)", "search", "pairs", "revisions", "refine (offline)", "evaluate base",
          "train", "evaluate trained")


@pytest.mark.slow
def test_a_demo_run_stores_every_stage_of_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One real demo run (a few minutes; one test, so that test workers never run it twice)."""
    lines: list[str] = []
    result = run_demo(db=tmp_path / "orchard.db", log=lines.append)
    for stage in STAGES:
        assert any(line.startswith(f"time {stage}: ") and "(cpu " in line for line in lines), stage
    with Store(tmp_path / "orchard.db", must_exist=True) as store:
        assert len(store.pairs(run_id=result.run_id, kind=["step"])) >= 1
        refined = store.samples(kind="refine")  # the Refinement page's rows, and the build that made them
        assert len(refined) == result.refined == DEMO.refine_personas
        assert all(sum(not t.trains for t in s.turns) >= 2 for s in refined)  # the refused mistakes, masked
        assert [j.kind for j in store.jobs() if j.kind == "refine"] == ["refine"]
        (model,) = store.models()
        assert model.path == result.model and (Path(model.path) / "config.json").is_file()
        assert store.job(model.job_id).state == "succeeded" and store.job_metrics(model.job_id)
        evaluations = store.evaluations()
        assert [e["model"] for e in evaluations] == [evaluations[0]["model"], result.model]
        assert evaluations[0]["task_ids"] == evaluations[1]["task_ids"] and len(evaluations[0]["task_ids"]) == 8
        assert [r["idx"] for r in store.iterations()] == [0, 1]
        # The Loop view's record agrees with the Runs, Training and Evaluation pages' own records.
        loop = {r["idx"]: r for r in store.iterations()}
        assert loop[1]["solved_in_search"] == store.run(result.run_id).solved >= 1
        assert loop[1]["model"] == result.model and loop[1]["train"] == store.model_record(result.model).metrics
        assert [loop[0]["eval"]["eval_id"], loop[1]["eval"]["eval_id"]] == [e["id"] for e in evaluations]
        # Next iteration continues with the demo's own recipe and its held-out evaluation, not the defaults.
        from engine.jobs.submit import next_iteration_config
        from engine.loop import IterateConfig

        nxt = IterateConfig.from_dict(next_iteration_config(store, loop[1]["loop_id"]))
        assert nxt.method == "exit" and nxt.search_config().constrained and nxt.model == result.model
        assert nxt.eval_config().constrained and nxt.eval_config().max_steps == DEMO.eval_max_steps
        # The trees hold a success leaf and the revisions a judged first error (what the pages show).
        success_leaves = [n for tid, _ in store.tree_ids(result.run_id) for n in store.load_tree(tid).nodes
                          if n.terminal is not None and (n.reward or 0) >= DEMO.search.success_threshold]
        judged = [s for s in store.samples(run_id=result.run_id, kind="revision") if s.source["error_found"]]
    assert len(success_leaves) >= 1, "no success leaf in the demo's trees"
    assert len(judged) >= 1, "no revision trajectory with a judged first error"
    # Every dashboard page renders the demo's store without an exception or an error box.
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "dashboard"))
    from test_every_page import every_page

    every_page(monkeypatch, tmp_path / "orchard.db")


@pytest.mark.parametrize(("flag", "value", "field"), [("--simulations", "0", "simulations"),
                                                      ("--train-steps", "0", "train_steps"),
                                                      ("--tasks", "", "tasks"), ("--eval-tasks", "5:2", "range")])
def test_a_bad_demo_setting_is_one_line_before_anything_runs(tmp_path: Path, capsys, flag, value, field) -> None:
    from engine.cli import main

    assert main(["demo", flag, value, "--db", str(tmp_path / "orchard.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
    assert not (tmp_path / "orchard.db").exists()
