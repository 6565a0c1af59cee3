"""Where a trained model goes: --out never destroys what Orchard did not write, one live job per
output folder, the folder is replaced atomically, and every job keeps its model record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import ConfigError
from engine.jobs.runner import JobRunner
from engine.store import ModelRecord, Store
from engine.train.common import TRAIN_META, TrainError, check_output_folder, save_model


class _Weights:
    """Stands in for a model and its tokenizer: save_pretrained writes one file (or fails midway)."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail = name, fail

    def save_pretrained(self, path: str | Path, **kwargs) -> None:
        (Path(path) / f"{self.name}.bin").write_text(self.name)
        if self.fail:
            raise OSError("disk full (simulated)")


def _siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p != folder)


def test_a_non_empty_folder_that_is_no_orchard_model_is_refused_and_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    with pytest.raises(TrainError, match=r"not empty and is not an Orchard model folder \(no orchard_train.json\)"):
        check_output_folder(home)
    with pytest.raises(TrainError, match="not an Orchard model folder"):
        save_model(_Weights("model"), _Weights("tok"), home, {})
    assert sorted(p.name for p in home.iterdir()) == ["thesis.tex"]
    assert _siblings(home) == []  # no temp folder left beside it
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainError, match="is a file, not a folder"):
        check_output_folder(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert check_output_folder(tmp_path / "empty") == (tmp_path / "empty").resolve()
    assert check_output_folder(tmp_path / "new") == (tmp_path / "new").resolve()


def test_an_orchard_model_folder_is_replaced_atomically_and_a_failed_save_keeps_it(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    out = tmp_path / "models" / "m"
    save_model(_Weights("first"), _Weights("tok"), out, {"job": 1})
    assert sorted(p.name for p in out.iterdir()) == ["first.bin", TRAIN_META, "tok.bin"]
    with pytest.raises(OSError, match="disk full"):  # a crash while writing the new model
        save_model(_Weights("second", fail=True), _Weights("tok"), out, {"job": 2})
    assert sorted(p.name for p in out.iterdir()) == ["first.bin", TRAIN_META, "tok.bin"]
    assert json.loads((out / TRAIN_META).read_text())["job"] == 1 and _siblings(out) == []
    from engine.train import common

    real_replace = common.os.replace

    def crash_on_moving_the_new_model_in(src, dst):
        if Path(src).name.startswith(".m.saving-"):
            raise OSError("killed (simulated)")
        real_replace(src, dst)

    monkeypatch.setattr(common.os, "replace", crash_on_moving_the_new_model_in)
    with pytest.raises(OSError, match="killed"):  # the old model was out of the way: it is put back
        save_model(_Weights("second"), _Weights("tok"), out, {"job": 2})
    monkeypatch.undo()
    assert json.loads((out / TRAIN_META).read_text())["job"] == 1 and _siblings(out) == []
    save_model(_Weights("third"), _Weights("tok"), out, {"job": 3})
    assert sorted(p.name for p in out.iterdir()) == [TRAIN_META, "third.bin", "tok.bin"]
    assert json.loads((out / TRAIN_META).read_text())["job"] == 3 and _siblings(out) == []


@pytest.mark.parametrize("marker", [{}, [], {"format": True, "saved_at": "x", "files": []},
                                    {"format": 1, "saved_at": "2026", "kind": "dpo"},  # no file list
                                    {"format": 1, "saved_at": "2026", "files": ["../x"]}])
def test_a_hand_made_marker_does_not_make_a_folder_replaceable(tmp_path: Path, marker) -> None:
    out = tmp_path / "work"
    out.mkdir()
    (out / TRAIN_META).write_text(json.dumps(marker))
    (out / "keep.txt").write_text("mine")
    with pytest.raises(TrainError, match=f"not an Orchard model folder \\(its {TRAIN_META} lacks"):
        check_output_folder(out)
    with pytest.raises(TrainError, match="not an Orchard model folder"):
        save_model(_Weights("model"), _Weights("tok"), out, {"job": 1})
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", TRAIN_META] and _siblings(out) == []
    assert (out / "keep.txt").read_text() == "mine"


def test_a_model_folder_holding_a_user_file_is_refused_and_keeps_everything(tmp_path: Path) -> None:
    out = tmp_path / "m"
    save_model(_Weights("first"), _Weights("tok"), out, {"job": 1})
    assert json.loads((out / TRAIN_META).read_text())["files"] == ["first.bin", TRAIN_META, "tok.bin"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(TrainError, match=r"holds files its model did not come with \(notes.txt\)"):
        check_output_folder(out)
    with pytest.raises(TrainError, match="nothing is deleted"):
        save_model(_Weights("second"), _Weights("tok"), out, {"job": 2})
    assert sorted(p.name for p in out.iterdir()) == ["first.bin", "notes.txt", TRAIN_META, "tok.bin"]
    assert _siblings(out) == []
    (out / "notes.txt").unlink()  # moved out: the model is replaced
    save_model(_Weights("second"), _Weights("tok"), out, {"job": 2})
    assert sorted(p.name for p in out.iterdir()) == [TRAIN_META, "second.bin", "tok.bin"]


def test_a_second_live_job_on_one_output_folder_is_refused(tmp_path: Path) -> None:
    from tiny_model_fixture import build_tiny_model

    model = str(build_tiny_model(tmp_path / "base"))
    out = tmp_path / "trained"
    with Store(tmp_path / "o.db") as store:
        runner = JobRunner(store)
        first = runner.submit("dpo", {"model": model, "output": str(out), "train": {"device": "cpu"}}, device="cpu",
                              start=False)
        for config, device in (({"model": model, "output": str(out)}, "cuda:0"),  # another device: still one folder
                               ({"model": model, "output": str(out / "inner")}, "cpu"),
                               ({"iterate": {"output_root": str(tmp_path)}}, "cpu")):
            kind = "iterate" if "iterate" in config else "sft"
            with pytest.raises(ConfigError, match=f"job {first.id} \\(dpo, queued\\) writes to {out}"):
                runner.submit(kind, config, device=device, start=False)
        assert [j.id for j in store.jobs()] == [first.id]  # nothing queued for the refused ones
        other = runner.submit("sft", {"model": model, "output": str(tmp_path / "elsewhere")}, device="cpu",
                              start=False)
        assert other.state == "queued"
        runner.cancel(first.id)
        again = runner.submit("sft", {"model": model, "output": str(out)}, device="cpu", start=False)
        assert again.state == "queued"  # the folder is free once its job has ended


def test_every_job_keeps_its_model_record_when_a_later_job_replaces_the_folder(tmp_path: Path) -> None:
    with Store(tmp_path / "o.db") as store:
        store.save_model(ModelRecord(path="/m", name="m", kind="dpo", job_id="job1", metrics={"steps": 1}))
        store.save_model(ModelRecord(path="/other", name="o", kind="sft", job_id="job0"))
        store.save_model(ModelRecord(path="/m", name="m", kind="sft", job_id="job2", metrics={"steps": 2}))
        assert store.model_record("/m").job_id == "job2"
        assert [m.job_id for m in store.models()] == ["job0", "job2"]
        history = {m.job_id: m for m in store.models(include_replaced=True)}
        assert set(history) == {"job0", "job1", "job2"}
        assert history["job1"].replaced_by == "job2" and history["job1"].replaced_at is not None
        assert history["job1"].metrics == {"steps": 1} and history["job2"].replaced_at is None
        store.save_model(ModelRecord(path="/m", name="m", kind="sft", job_id="job2", metrics={"steps": 3}))
        assert len(store.models(include_replaced=True)) == 3  # the same job saving again: its own record
        assert store.model_record("/m").metrics == {"steps": 3}


def test_migration_5_keeps_the_model_records_of_a_version_4_database(tmp_path: Path, monkeypatch) -> None:
    import engine.store as store_module
    import engine.store.schema as schema_module

    path = tmp_path / "v4.db"
    monkeypatch.setattr(schema_module, "MIGRATIONS", schema_module.MIGRATIONS[:4])
    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", 4)
    with Store(path) as old:
        old.con.execute("INSERT INTO models VALUES ('/m', 'm', 'dpo', '/base', 'job1', '[\"p1\"]', '{}', '{}', 1.0)")
        old.con.commit()
    monkeypatch.undo()
    with Store(path) as new:
        assert new.schema_version == store_module.SCHEMA_VERSION
        record = new.model_record("/m")
        assert (record.job_id, record.parent, record.data_ids, record.replaced_at) == ("job1", "/base", ["p1"], None)
        new.save_model(ModelRecord(path="/m", name="m", kind="sft", job_id="job2"))
        assert [m.replaced_by for m in new.models(include_replaced=True)] == ["job2", None]


def test_a_library_training_call_refuses_the_folder_before_it_trains(tmp_path: Path) -> None:
    from engine.train.sft import SFTTrainConfig, train_sft

    mine = tmp_path / "data"
    mine.mkdir()
    (mine / "corpus.txt").write_text("keep me")
    with pytest.raises(TrainError, match="not an Orchard model folder"):  # no model, no samples: never reached
        train_sft(tmp_path / "no-model", [], SFTTrainConfig.for_cpu(), mine)
    assert (mine / "corpus.txt").read_text() == "keep me"
