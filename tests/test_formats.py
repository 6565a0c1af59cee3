"""Exports load with `datasets.load_dataset` and train in TRL (the per-turn loss mask reaches the
trainer); imports round-trip and reject malformed files naming file, line and field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from test_pairs import _two_outcome_tree, add
from test_revisions import Judge, spliced_tree

from engine.datasets.formats import (
    ImportFormatError,
    agentgym_rows,
    dpo_rows,
    read_samples,
    sft_rows,
    step_rows,
    tokenize_messages,
    write_rows,
)
from engine.datasets.pairs import PairsConfig, build_pairs
from engine.datasets.revisions import RevisionConfig, build_revisions
from engine.datasets.samples import DatasetError, TreeRef, to_messages

DESC = "Commands: anything."


def built_pairs():
    tree, ids = _two_outcome_tree()
    tree.nodes[ids["r1"]].Q_critic = 1.0
    add(tree, 0, "left", N=2, value_sum=0.0, q_critic=0.0)
    return build_pairs([TreeRef(tree, "run1", 1, DESC)], PairsConfig())


def revision_samples():
    tree, _ = spliced_tree()
    built = build_revisions([TreeRef(tree, "run1", 1, DESC)], Judge({"b2": "Judgement: Bad"}), RevisionConfig())
    return built.revision + built.good


def load(path):
    import datasets

    return datasets.load_dataset("parquet" if path.suffix == ".parquet" else "json", data_files=str(path),
                                 split="train")


# --- exports -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_every_export_loads_with_load_dataset(tmp_path, suffix):
    pairs = built_pairs()
    samples = revision_samples()
    assert pairs.step and pairs.trajectory
    exports = {
        "dpo": dpo_rows(pairs.step + pairs.trajectory),
        "sft": sft_rows(samples),
        "agentgym": agentgym_rows(samples),
        "steps": step_rows(samples),
    }
    for name, rows in exports.items():
        ds = load(write_rows(rows, tmp_path / f"{name}{suffix}"))
        assert len(ds) == len(rows)
        assert ds[0]["id"] == rows[0]["id"]

    dpo = load(tmp_path / f"dpo{suffix}")
    p = pairs.step[0]
    row = dpo[0]
    assert row["prompt"] == p.prompt and row["chosen"] == [{"role": "assistant", "content": p.chosen}]
    assert row["rejected"] == [{"role": "assistant", "content": p.rejected}]
    assert (row["q_chosen"], row["node_id"], row["status"]) == (p.q_chosen, p.node_id, "pending")
    traj = dpo[len(pairs.step)]
    assert traj["kind"] == "trajectory" and traj["chosen"][-1]["role"] == "assistant"

    sft = load(tmp_path / f"sft{suffix}")
    rev = samples[0]
    assert sft[0]["messages"] == to_messages(rev)
    assert [m["train"] for m in sft[0]["messages"] if m["role"] == "assistant"] == [t.trains for t in rev.turns]
    gym = load(tmp_path / f"agentgym{suffix}")
    assert {c["from"] for c in gym[0]["conversations"]} == {"human", "gpt"}
    assert [c["loss"] for c in gym[0]["conversations"] if c["from"] == "gpt"] == [t.loss for t in rev.turns]
    steps = load(tmp_path / f"steps{suffix}")
    assert set(steps.column_names) >= {"prompt", "completion"}


def test_write_rows_refuses_unknown_suffix_and_empty_exports_and_leaves_no_temp_files(tmp_path):
    with pytest.raises(DatasetError, match="use .jsonl or .parquet"):
        write_rows([{"a": 1}], tmp_path / "x.csv")
    with pytest.raises(DatasetError, match="nothing to export"):
        write_rows([], tmp_path / "x.jsonl")
    write_rows([{"a": 1}], tmp_path / "x.jsonl")
    assert [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]


# --- imports -----------------------------------------------------------------------------------


def test_agentgym_and_messages_exports_import_back_to_the_same_turns(tmp_path):
    samples = revision_samples()
    for name, rows in (("gym.jsonl", agentgym_rows(samples)), ("msgs.parquet", sft_rows(samples))):
        result = read_samples(write_rows(rows, tmp_path / name))
        assert result.records == len(samples) and result.duplicates == 0
        for original, back in zip(samples, result.samples):
            assert [(t.text, t.loss) for t in back.turns] == [(t.text, t.loss) for t in original.turns]
            assert [t.observation for t in back.turns] == [t.observation for t in original.turns]
            assert back.kind == "imported" and back.task.id == original.id
        assert read_samples(tmp_path / name).samples[0].id == result.samples[0].id  # stable ids


def test_agentrefine_style_rows_with_system_turns_weights_and_json_arrays(tmp_path):
    rows = [
        {"id": "refine-1", "conversations": [
            {"from": "system", "value": "You are the player."},
            {"from": "human", "value": "You are in a kitchen. Task: boil water."},
            {"from": "gpt", "value": "Thought: get a pot.\nAction: take pot", "weight": 0},
            {"from": "human", "value": "There is no pot here."},
            {"from": "gpt", "value": "Thought: look around.\nAction: look", "weight": 1},
        ]},
        {"id": "refine-2", "conversations": [
            {"from": "human", "value": "Task: open the door."},
            {"from": "gpt", "value": "Action: open door", "loss": None},
            {"from": "human", "value": "The door is open."},
        ]},
    ]
    path = tmp_path / "refine.json"
    path.write_text(json.dumps(rows, indent=2))
    result = read_samples(path, kind="refine")
    a, b = result.samples
    assert a.task.system == "You are the player." and a.task.first_observation.startswith("You are in a kitchen")
    assert [t.loss for t in a.turns] == [False, True] and a.turns[0].observation == "There is no pot here."
    assert a.turns[1].observation is None and a.kind == "refine" and a.source["line"] == 2
    assert b.turns[0].loss is None and b.turns[0].trains and b.turns[0].observation == "The door is open."
    lines = path.read_text().splitlines()
    assert b.source["line"] == lines.index('    "id": "refine-2",')  # the line of its opening brace
    msgs = to_messages(a)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["train"] for m in msgs] == [None, None, False, None, True]


def test_duplicate_records_collapse(tmp_path):
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ACTION: wait"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n\n" + json.dumps(row) + "\n")
    result = read_samples(path)
    assert result.records == 2 and result.duplicates == 1 and len(result.samples) == 1


GOOD = {"conversations": [{"from": "human", "value": "task"}, {"from": "gpt", "value": "ACTION: go", "loss": True}]}


@pytest.mark.parametrize("bad_line,line,field,problem", [
    ('{"conversations": [', 3, None, "not valid JSON"),
    ('[1, 2]', 3, None, "expected a JSON object"),
    ('{"dialog": []}', 3, "conversations", "missing"),
    ('{"conversations": []}', 3, "conversations", "non-empty list"),
    ('{"conversations": [{"from": "human"}]}', 3, "conversations[0].value", "missing"),
    ('{"conversations": [{"value": "x"}]}', 3, "conversations[0].from", "missing"),
    ('{"conversations": [{"from": "human", "value": 5}]}', 3, "conversations[0].value", "expected text"),
    ('{"conversations": [{"from": "bot", "value": "x"}]}', 3, "conversations[0].from", "unknown role 'bot'"),
    ('{"conversations": [{"from": "gpt", "value": "x"}]}', 3, "conversations[0].from", "expected 'human'"),
    ('{"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]}', 3,
     "conversations[1].from", "expected 'gpt'"),
    ('{"conversations": [{"from": "human", "value": "a"}, {"from": "system", "value": "b"}]}', 3,
     "conversations[1].from", "only come first"),
    ('{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b", "loss": "yes"}]}', 3,
     "conversations[1].loss", "true, false or null"),
    (('{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b", "loss": true, '
      '"weight": 0}]}'), 3, "conversations[1].weight", "contradicts"),
    ('{"conversations": [{"from": "human", "value": "a", "loss": true}, {"from": "gpt", "value": "b"}]}', 3,
     "conversations[0].loss", "user turns carry no loss"),
    ('{"conversations": [{"from": "human", "value": "a"}]}', 3, "conversations", "no assistant"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}', 3,
     "messages[1].role", "unknown role 'tool'"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "train": 1}]}', 3,
     "messages[1].train", "true, false or null"),
    ('{"item_id": {"a": 1}, "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}',
     3, "item_id", "expected text or an integer"),
    ("[" * 100_000 + "]" * 100_000, 3, None, "nested too deeply"),
    ('{"id": ' + "9" * 5000 + "}", 3, None, "4300 digits"),
])
def test_malformed_records_name_file_line_and_field(tmp_path, bad_line, line, field, problem):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + bad_line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(ImportFormatError) as err:
        read_samples(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: ") and problem in message, message
    assert err.value.line == line and (field is None or err.value.field == field), message


def test_a_50_mb_line_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(GOOD) + "\n")
        f.write('{"conversations": [{"from": "human", "value": "' + "x" * (50 * 1024 * 1024) + '"}]}\n')
    with pytest.raises(ImportFormatError, match=r"big.jsonl:2: line is 52,428,\d+ bytes, over the 16,777,216"):
        read_samples(path)


def _parquet(path, rows) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")
    return path.stat().st_size


def test_a_tiny_zstd_parquet_expanding_to_a_40_mib_turn_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "bomb.parquet"
    turn = {"from": "human", "value": "x" * (40 * 1024 * 1024)}  # one repetitive string: zstd takes it to KB
    assert _parquet(path, [{"conversations": [turn, {"from": "gpt", "value": "ACTION: go"}]}]) < 64 * 1024
    with pytest.raises(ImportFormatError, match=r"bomb.parquet:1: row group 0 holds 41,9\d\d,\d+ bytes uncompressed "
                                                r"for 1 row\(s\): over the 16,777,216-byte limit per record"):
        read_samples(path)


def test_a_parquet_record_over_the_limit_among_small_ones_names_its_row_and_field(tmp_path):
    path = tmp_path / "one-big.parquet"
    small = {"conversations": [{"from": "human", "value": "task"}, {"from": "gpt", "value": "ACTION: go"}]}
    big = {"conversations": [{"from": "human", "value": "y" * (2 * 1024 * 1024)}, {"from": "gpt", "value": "go"}]}
    _parquet(path, [small] * 149 + [big] + [small] * 50)  # 10 KB a row on average: the metadata passes
    with pytest.raises(ImportFormatError) as err:
        read_samples(path, max_line_bytes=1024 * 1024)
    assert str(err.value).startswith(f"{path}:150: conversations: record is 2,097,") and "\n" not in str(err.value)
    assert "over the 1,048,576-byte limit per record" in str(err.value)
    assert len(read_samples(path, max_line_bytes=4 * 1024 * 1024).samples) == 2  # within the limit: imported


def test_other_unreadable_inputs(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        read_samples(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ImportFormatError, match="no records"):
        read_samples(empty)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(ImportFormatError, match="junk.parquet: not a readable Parquet file"):
        read_samples(junk)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    with pytest.raises(ImportFormatError, match="latin.jsonl:2: not UTF-8"):
        read_samples(latin)
    arr = tmp_path / "arr.json"
    arr.write_text("[\n" + json.dumps(GOOD) + ",\n" + json.dumps({"x": 1}) + "\n]")
    with pytest.raises(ImportFormatError, match="arr.json:3: conversations: missing"):
        read_samples(arr)
    arr.write_text("[\n" + json.dumps(GOOD) + ",\n{oops}\n]")
    with pytest.raises(ImportFormatError, match="arr.json:3: not valid JSON"):
        read_samples(arr)
    with pytest.raises(DatasetError, match="unknown sample kind"):
        read_samples(arr, kind="nope")


FUZZ = Path(__file__).parent / "data" / "fuzz" / "imports"
FUZZ_EXPECTED = json.loads((FUZZ / "expected.json").read_text(encoding="utf-8"))


def test_every_file_of_the_import_corpus_has_an_expectation():
    assert sorted(p.name for p in FUZZ.iterdir() if p.name != "expected.json") == sorted(FUZZ_EXPECTED)


@pytest.mark.parametrize("name", sorted(FUZZ_EXPECTED))
def test_hostile_import_files_are_refused_with_file_line_and_field(name):
    """The corpus in tests/data/fuzz/imports: lone surrogates in ids and texts (once a traceback, or
    imported and then every export failed), content after a JSON array's `]` (once ignored), ..."""
    want = FUZZ_EXPECTED[name]
    with pytest.raises(ImportFormatError) as err:
        read_samples(FUZZ / name)
    message = str(err.value)
    assert message.startswith(f"{FUZZ / name}:{want['line']}: ") and want["problem"] in message, message
    assert err.value.field == (want["field"] or ""), message
    assert "\n" not in message


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_json_arrays_read_in_chunks_give_every_record_and_line(tmp_path, monkeypatch, chunk):
    """Arrays are read in chunks (no longer whole): records, numbers and multi-byte characters cut at
    a chunk's end come out as if read at once, with the line each record starts on."""
    from engine.datasets import formats

    rows = [{"item_id": 10 ** i, "conversations": [{"from": "human", "value": f"h{i} é€😀 \\\" \\u00e9"},
                                                     {"from": "gpt", "value": f"ACTION: {i}", "loss": i % 2 == 0}]}
            for i in range(6)]
    text = "  \n[\n" + ",\n\n".join(json.dumps(r, ensure_ascii=i % 2 == 0) for i, r in enumerate(rows)) + "\n]\n\n"
    path = tmp_path / "a.json"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(formats, "_ARRAY_CHUNK", chunk)
    result = read_samples(path)
    assert [s.task.id for s in result.samples] == [str(r["item_id"]) for r in rows]
    assert [s.turns[0].text for s in result.samples] == [f"ACTION: {i}" for i in range(6)]
    assert [s.source["line"] for s in result.samples] == [3 + 2 * i for i in range(6)]
    assert result.samples[1].task.first_observation == rows[1]["conversations"][0]["value"]


def test_a_huge_record_in_a_json_array_is_refused_without_reading_the_file_whole(tmp_path):
    import tracemalloc

    path = tmp_path / "big.json"
    with open(path, "w") as f:
        f.write("[\n" + json.dumps(GOOD) + ',\n{"conversations": [{"from": "human", "value": "')
        f.writelines("x" * (1 << 20) for _ in range(40))
    tracemalloc.start()
    try:
        with pytest.raises(ImportFormatError, match=r"big.json:3: record is over the 4,194,304-character limit"):
            read_samples(path, max_line_bytes=4 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"peak {peak:,} bytes for a 40 MiB file"


def test_exporting_rows_onto_a_folder_is_one_error_and_leaves_it_alone(tmp_path):
    """Once an IsADirectoryError traceback from the final rename."""
    from engine.fileio import OutputError

    for suffix in (".jsonl", ".parquet"):
        folder = tmp_path / f"rows{suffix}"
        (folder / "inside").mkdir(parents=True)
        with pytest.raises(OutputError, match=f"rows{suffix}: is a folder; name a file"):
            write_rows([{"a": 1}], folder)
        assert [p.name for p in folder.iterdir()] == ["inside"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "rows.parquet"]


def test_a_stored_lone_surrogate_makes_export_one_error_not_a_traceback(tmp_path):
    """Rows imported before the import refused lone surrogates: the export names the row, writes nothing."""
    from engine.datasets.samples import Sample, Task, Turn

    bad = Sample(id="s1", kind="imported", task=Task(id="t", first_observation="x\udc00"),
                 turns=(Turn(text="ACTION: go", observation=None, loss=True),))
    for suffix in (".jsonl", ".parquet"):
        out = tmp_path / f"o{suffix}"
        with pytest.raises(DatasetError, match=r"row 1 \(id 's1'\) holds text that is not valid Unicode"):
            write_rows(sft_rows([bad]), out)
        assert list(tmp_path.iterdir()) == []


# --- TRL ---------------------------------------------------------------------------------------

# ChatML whose assistant messages are inside {% generation %} only when their `train` flag is not
# false (the flag rendered outside the generation markers), so TRL's assistant_only_loss honours the exported flags.
TRAIN_FLAG_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' and message['train'] is not false %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from tiny_model_fixture import build_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    tok = AutoTokenizer.from_pretrained(folder)
    assert "{% generation %}" in tok.chat_template
    return folder, AutoModelForCausalLM.from_pretrained(folder), tok


def _train_config(cls, out, **kw):
    return cls(output_dir=str(out), bf16=False, gradient_checkpointing=False, max_steps=1,
               per_device_train_batch_size=2, report_to=[], save_strategy="no", use_cpu=True, logging_steps=1,
               dataloader_num_workers=0, **kw)


def test_dpo_trainer_takes_one_step_on_exported_pairs(tmp_path, tiny):
    from trl import DPOConfig, DPOTrainer

    _, model, tok = tiny
    pairs = built_pairs()
    ds = load(write_rows(dpo_rows(pairs.step + pairs.trajectory), tmp_path / "dpo.parquet"))
    policy = copy.deepcopy(model)
    trainer = DPOTrainer(model=policy, ref_model=copy.deepcopy(model), processing_class=tok, train_dataset=ds,
                         args=_train_config(DPOConfig, tmp_path / "out", max_length=1024))
    row = trainer.train_dataset[0]  # the completion the trainer scores is exactly the chosen action
    assert tok.decode(row["chosen_ids"]).startswith(pairs.step[0].chosen + "<|im_end|>")
    assert tok.decode(row["rejected_ids"]).startswith(pairs.step[0].rejected + "<|im_end|>")
    before = [p.detach().clone() for p in policy.parameters()]
    trainer.train()
    (log, _) = trainer.state.log_history
    assert log["loss"] == pytest.approx(0.693147, abs=1e-4)  # policy == reference at step 0: -log sigmoid(0)
    assert any(not b.equal(a) for b, a in zip(before, policy.parameters()))


def _trained_text(tok, input_ids, labels) -> str:
    return tok.decode([i for i, lab in zip(input_ids, labels) if lab != -100])


def test_sft_trainer_gives_masked_turns_no_loss_with_a_train_flag_template(tmp_path, tiny):
    from trl import SFTConfig, SFTTrainer

    _, model, tok = tiny
    tok = copy.deepcopy(tok)
    tok.chat_template = TRAIN_FLAG_TEMPLATE
    samples = revision_samples()
    rev = samples[0]
    ds = load(write_rows(sft_rows(samples), tmp_path / "sft.jsonl"))
    trainer = SFTTrainer(model=copy.deepcopy(model), processing_class=tok, train_dataset=ds,
                         args=_train_config(SFTConfig, tmp_path / "out", assistant_only_loss=True, max_length=4096))
    batch = next(iter(trainer.get_train_dataloader()))
    assert "labels" in batch
    row = trainer.train_dataset[0]
    trained = _trained_text(tok, row["input_ids"], row["labels"])
    expected = "".join(t.text + "<|im_end|>" for t in rev.turns if t.loss)
    assert trained == expected  # the bad turns and every user turn carry no loss
    assert all(t.text not in trained for t in rev.turns if t.loss is False)
    # the same rows pre-tokenized by tokenize_messages give the very same mask (way (b))
    masks = tokenize_messages(ds[0]["messages"], tiny[2])
    assert masks["input_ids"] == row["input_ids"]
    assert masks["assistant_masks"] == [int(lab != -100) for lab in row["labels"]]
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] > 0


def test_sft_trainer_on_pretokenized_rows_from_tokenize_messages(tmp_path, tiny):
    import datasets
    from trl import SFTConfig, SFTTrainer

    _, model, tok = tiny
    samples = revision_samples()
    flagged = samples[0]
    rows = sft_rows(samples)
    ds = datasets.Dataset.from_list([tokenize_messages(r["messages"], tok) for r in rows])
    trainer = SFTTrainer(model=copy.deepcopy(model), processing_class=tok, train_dataset=ds,
                         args=_train_config(SFTConfig, tmp_path / "out", max_length=4096))
    row = trainer.train_dataset[0]
    trained = _trained_text(tok, row["input_ids"], row["labels"])
    assert trained == "".join(t.text + "<|im_end|>" for t in flagged.turns if t.loss)
    # flipping one flag moves exactly that turn in or out of the loss
    rows[0]["messages"][[i for i, m in enumerate(rows[0]["messages"]) if m["role"] == "assistant"][2]]["train"] = True
    again = tokenize_messages(rows[0]["messages"], tok)
    bad = flagged.turns[2].text
    assert bad in _trained_text(tok, again["input_ids"], [0 if m else -100 for m in again["assistant_masks"]])
    trainer.train()
    assert trainer.state.global_step == 1
