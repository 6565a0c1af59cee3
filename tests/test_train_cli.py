"""`orchard train|jobs|eval` through the argparse wiring that engine.cli uses (`add_parsers`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from doubles import action_text
from tiny_model_fixture import build_tiny_model

from engine.cli import evaluate as eval_commands
from engine.cli import train as train_commands
from engine.datasets.pairs import Pair
from engine.envs.base import TaskSpec
from engine.prompts import actor_prompt
from engine.store import Store
from engine.train.common import TrainError


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="orchard")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db")
    sub = parser.add_subparsers(dest="command", required=True)
    train_commands.add_parsers(sub, common)
    eval_commands.add_parsers(sub, common)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-cli"))


def _db_with_pairs(path: Path) -> str:
    with Store(path) as store:
        run_id = store.create_run("r", "line", "m", {}, [TaskSpec(id=f"goal-{i}", goal="g") for i in range(3)])
        store.save_pairs(run_id, [
            Pair(id=f"p{i}", kind="step", run_id=run_id, tree_id=None, task_id=f"goal-{i}", node_id=0,
                 chosen_node=1, rejected_node=2, prompt=actor_prompt("d", "reach 3", "", [], f"at {i}"),
                 chosen=action_text("right"), rejected=action_text("left"), q_chosen=1.0, q_rejected=0.0,
                 logprob_chosen=None, logprob_rejected=None, depth=0)
            for i in range(3)
        ])
    return run_id


def test_train_foreground_registers_model_and_job(tmp_path: Path, model: Path, capsys) -> None:
    db = tmp_path / "o.db"
    assert _run(["jobs", "--json", "--db", str(db)]) == 0
    assert json.loads(capsys.readouterr().out) == []
    run_id = _db_with_pairs(db)
    out = tmp_path / "m1"
    with pytest.raises(TrainError, match="include-pending"):  # pending pairs are not used by default
        _run(["train", "dpo", "--model", str(model), "--run", run_id, "--foreground", "--db", str(db),
              "--out", str(out), "--max-steps", "1"])
    assert _run(["train", "dpo", "--model", str(model), "--run", "r", "--include-pending", "--foreground",
                 "--db", str(db), "--out", str(out), "--max-steps", "1", "--batch-size", "3", "--lr", "1e-4",
                 "--beta", "0.2", "--threads", "1"]) == 0
    assert f"trained {out.resolve()}" in capsys.readouterr().out
    with Store(db) as store:
        (job,) = store.jobs()
        assert job.state == "succeeded" and job.config["train"]["beta"] == 0.2
        record = store.model_record(str(out.resolve()))
        assert record.data_ids == ["p0", "p1", "p2"] and record.config["include_pending"] is True
    assert _run(["jobs", "show", job.id[:6], "--json", "--db", str(db)]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "succeeded"
    assert _run(["jobs", "--db", str(db)]) == 0
    assert job.id in capsys.readouterr().out


@pytest.mark.slow
def test_train_as_a_job_and_cancel(tmp_path: Path, model: Path, capsys) -> None:
    db = tmp_path / "o.db"
    _db_with_pairs(db)
    assert _run(["train", "sft", "--model", str(model), "--db", str(db), "--device", "cpu", "--wait"]) == 1
    text = capsys.readouterr().out
    assert "failed: TrainError: no samples" in text
    with Store(db) as store:
        job_id = store.jobs()[0].id
    assert _run(["jobs", "cancel", job_id, "--db", str(db)]) == 0
    assert "failed" in capsys.readouterr().out  # already final: cancel leaves it as it was
    assert _run(["jobs", "log", job_id, "--db", str(db)]) == 0
    assert "TrainError" in capsys.readouterr().out


def test_eval_command_stores_an_evaluation(tmp_path: Path, model: Path, capsys) -> None:
    db = tmp_path / "o.db"
    assert _run(["eval", "--model", str(model), "--tasks", "0:2", "--split", "test", "--max-steps", "1",
                 "--max-tokens", "24", "--mode", "sampled", "--seeds", "0,1", "--json", "--db", str(db)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["mode"] == "sampled" and row["metrics"]["episodes"] == 4 and row["task_ids"] == ["test-0", "test-1"]
    with Store(db) as store:
        assert [e["id"] for e in store.evaluations(model=str(model))] == [row["id"]]


def test_train_refuses_an_out_folder_holding_other_files_before_queueing(tmp_path: Path, model: Path) -> None:
    from engine.config import ConfigError

    db = tmp_path / "o.db"
    _db_with_pairs(db)
    mine = tmp_path / "my-files"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for extra in ([], ["--foreground"]):
        with pytest.raises(ConfigError, match=f"output folder {mine} is not empty and is not an Orchard model folder"):
            _run(["train", "sft", "--model", str(model), "--db", str(db), "--device", "cpu", "--out", str(mine),
                  *extra])
    assert (mine / "notes.txt").read_text() == "keep me"
    with Store(db) as store:
        assert store.jobs() == []
