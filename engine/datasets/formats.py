"""Exports and imports of training data (docs/algorithms.md §6): JSONL and Parquet that `datasets.load_dataset`
reads and TRL trains on.

Exports:
- `dpo_rows`: TRL conversational preference rows (`prompt` messages, `chosen`/`rejected` assistant
  message lists) plus metadata: run, tree, task, nodes, Q values, stored log-probs, curation status,
  and the provenance columns (engine.datasets.pairs.SOURCE_FIELDS: margin, each side's Q~ / Q^, visits,
  model, seed, author) with every source in `sources`; TRL's DPOTrainer ignores columns it does not use.
  The log-probs are named `logprob_*`, not `ref_*_logps`, because TRL would take those as the
  reference log-probs of whatever model it trains, which they are only for the generating one.
- `sft_rows`: `messages` with a per-message `train` flag (bool on assistant messages, null on others).
- `agentgym_rows`: AgentGym `conversations` [{from: human|gpt, value, loss: true|false|null}].
- `step_rows`: one prompt/completion row per trainable turn, in the policy's inference format.
- `tokenize_messages`: `input_ids` + `assistant_masks` honouring the `train` flags with ANY chat
  template, which TRL's SFTTrainer takes as a pre-tokenized dataset (per-turn loss, way (b)).

Imports read AgentGym / AgentRefine-style rows (`conversations` with `from`/`value` and an optional
per-turn `loss` or `weight`, optional leading `system` turn) and chat rows (`messages` with
`role`/`content` and an optional `train` or `weight`), from JSONL, JSON arrays or Parquet. The WHOLE
file is validated before anything is returned, and each problem names the file, line and field. JSON
arrays are read in chunks with the same per-record size limit as JSONL lines, text must be valid
Unicode (no lone surrogates), and nothing may follow the array's `]`. Parquet records are held to
the same limit on their DECODED size (`_parquet_records`: the metadata first, then each record).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from engine.datasets.pairs import SOURCE_FIELDS, Pair
from engine.datasets.samples import (
    KINDS,
    DatasetError,
    Sample,
    Task,
    Turn,
    stable_id,
    to_conversations,
    to_messages,
    to_step_rows,
)
from engine.fileio import atomic_write

OUTPUT_SUFFIXES = (".jsonl", ".parquet")
MAX_LINE_BYTES = 16 * 1024 * 1024
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class ImportFormatError(DatasetError):
    """A record of an import file is not valid: the message is `FILE:LINE: FIELD: problem`."""

    def __init__(self, path: str | Path, line: int | None, field_name: str, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {field_name}: {problem}" if field_name else f"{where}: {problem}")
        self.path, self.line, self.field, self.problem = str(path), line, field_name, problem


# --- exports -----------------------------------------------------------------------------------


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


# Source fields a DPO row has already (as the pair row's own columns, `id` for `pair_id`): not repeated.
_ROW_FIELDS = ("pair_id", "run_id", "tree_id", "task_id", "node_id", "chosen_node", "rejected_node", "q_chosen", "q_rejected")


def dpo_rows(pairs: Iterable[Pair]) -> list[dict[str, Any]]:
    return [
        {
            "id": p.id,
            "prompt": _plain(p.prompt),
            "chosen": p.messages("chosen"),
            "rejected": p.messages("rejected"),
            "kind": p.kind,
            "run_id": p.run_id,
            "tree_id": p.tree_id,
            "task_id": p.task_id,
            "node_id": p.node_id,
            "chosen_node": p.chosen_node,
            "rejected_node": p.rejected_node,
            "depth": p.depth,
            "q_chosen": p.q_chosen,
            "q_rejected": p.q_rejected,
            "logprob_chosen": p.logprob_chosen,
            "logprob_rejected": p.logprob_rejected,
            "status": p.status,
            **_provenance_columns(p),
        }
        for p in pairs
    ]


def _provenance_columns(p: Pair) -> dict[str, Any]:
    """The pair's provenance (its first source; None where it has none) as flat columns, and every
    source it was built from (`sources`, one record each: several for a pair that runs built alike)."""
    first = p.provenance
    extra = [k for k in SOURCE_FIELDS if k not in _ROW_FIELDS]
    return {**{k: first.get(k) for k in extra}, "n_sources": len(p.sources),
            "sources": [{k: s.get(k) for k in SOURCE_FIELDS} for s in p.sources]}


def _meta(s: Sample) -> dict[str, Any]:
    return {"id": s.id, "kind": s.kind, "run_id": s.run_id, "task_id": s.task.id, "status": s.status}


def sft_rows(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    return [{**_meta(s), "messages": to_messages(s)} for s in samples]


def agentgym_rows(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    return [{"item_id": s.id, **_meta(s), "conversations": to_conversations(s)} for s in samples]


def step_rows(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    return [row for s in samples for row in to_step_rows(s)]


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    """Rows as the JSONL file `write_rows` writes (one JSON object a line, UTF-8): also a download's bytes."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def write_rows(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSONL or Parquet (by suffix), atomically: a reader never sees half a file."""
    out = Path(path)
    if out.suffix not in OUTPUT_SUFFIXES:
        raise DatasetError(f"{out}: unknown output format {out.suffix or '(no suffix)'!r} (use .jsonl or .parquet)")
    if not rows:
        raise DatasetError(f"{out}: nothing to export (no rows matched); nothing written")

    def write(tmp: str) -> None:
        if out.suffix == ".jsonl":
            Path(tmp).write_bytes(jsonl_bytes(rows))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), tmp)

    try:
        return atomic_write(out, write)
    except UnicodeEncodeError:  # a lone surrogate in a row stored before imports refused them
        raise DatasetError(f"{out}: {_unencodable(rows)} holds text that is not valid Unicode (a lone "
                           "surrogate); nothing written") from None


def _unencodable(rows: list[dict[str, Any]]) -> str:
    """Which row UTF-8 cannot encode, named by its id (searched only once a write has failed)."""
    for i, row in enumerate(rows):
        try:
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return f"row {i + 1} (id {str(row.get('id', '?'))!r})"
    return "a row"


def tokenize_messages(messages: list[dict[str, Any]], tokenizer: Any) -> dict[str, list[int]]:
    """`input_ids` and `assistant_masks` (1 = trained) for chat messages with `train` flags.

    Each message's tokens are what rendering it adds to the rendering of the messages before it;
    an assistant message's header counts as prompt (rendered with the generation prompt) and so
    does what the template adds after its end-of-turn (eos) token, as with `{% generation %}`
    markers. Works with any prefix-preserving chat template, markers or not."""

    def ids(msgs: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        if not msgs:
            return []
        return list(tokenizer.apply_chat_template(_plain(msgs), tokenize=True, return_dict=False,
                                                  add_generation_prompt=generation_prompt))

    eos = tokenizer.eos_token_id
    input_ids: list[int] = []
    masks: list[int] = []
    for i, m in enumerate(messages):
        is_assistant = m["role"] == "assistant"
        before = ids(messages[:i], generation_prompt=is_assistant)
        after = ids(messages[: i + 1], generation_prompt=False)
        if after[: len(before)] != before or before[: len(input_ids)] != input_ids:
            raise DatasetError(f"message {i}: the chat template does not render earlier messages unchanged "
                               "(not prefix-preserving), so per-turn masks cannot be derived")
        masks.extend([0] * (len(before) - len(input_ids)))
        span = after[len(before) :]
        trained = len(span) if is_assistant and m.get("train") is not False else 0
        if trained and eos in span:  # the turn ends at its end-of-turn token; what follows is template glue
            trained = len(span) - span[::-1].index(eos)
        masks.extend([1] * trained + [0] * (len(span) - trained))
        input_ids = after
    return {"input_ids": input_ids, "assistant_masks": masks}


# --- imports -----------------------------------------------------------------------------------


@dataclass
class ImportResult:
    samples: list[Sample] = field(default_factory=list)
    records: int = 0
    duplicates: int = 0
    formats: dict[str, int] = field(default_factory=dict)


def _records(path: Path, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value) for each record of a JSONL file, JSON array or Parquet file."""
    if path.suffix == ".parquet":
        yield from _parquet_records(path, max_line_bytes)
        return
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
        f.seek(0)
        if head.startswith(b"["):
            yield from _json_array(path, f, max_line_bytes)
            return
        line_no = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            line_no += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                size = len(raw)
                while chunk := f.readline(1 << 20):  # measure the rest without holding it
                    size += len(chunk)
                    if chunk.endswith(b"\n"):
                        break
                raise ImportFormatError(path, line_no, "", f"line is {size:,} bytes, over the "
                                        f"{max_line_bytes:,}-byte limit (is this really JSONL?)")
            if not raw.strip():
                continue
            try:
                yield line_no, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise ImportFormatError(path, line_no, "", f"not UTF-8 text ({e.reason} at byte {e.start})") from None
            except json.JSONDecodeError as e:
                raise ImportFormatError(path, line_no, "", f"not valid JSON ({e.msg} at column {e.colno})") from None
            except (RecursionError, ValueError) as e:  # nested too deep; an integer of > 4300 digits
                raise ImportFormatError(path, line_no, "", f"not valid JSON ({_json_limit(e)})") from None


_PARQUET_BATCH_BYTES = 64 * 1024 * 1024  # decoded bytes aimed at per batch (from the metadata's sizes)


def _parquet_records(path: Path, max_record_bytes: int) -> Iterator[tuple[int, Any]]:
    """(row number, record) of a Parquet file, held to the JSONL limit on DECODED sizes (a few KB of
    zstd can expand to gigabytes). Before any data is read, each row group's uncompressed size per
    row is checked against the limit (one huge value in a small file is refused there, unallocated);
    rows are then decoded in batches sized from that figure, and each record's decoded size (its
    strings' UTF-8 bytes) is checked before it is used."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        row = 0
        for index in range(pf.metadata.num_row_groups):
            group = pf.metadata.row_group(index)
            per_row = group.total_byte_size / max(group.num_rows, 1)
            if per_row > max_record_bytes:
                raise ImportFormatError(path, row + 1, "", f"row group {index} holds {group.total_byte_size:,} "
                                        f"bytes uncompressed for {group.num_rows} row(s): over the "
                                        f"{max_record_bytes:,}-byte limit per record")
            batch_size = int(max(1, min(1024, _PARQUET_BATCH_BYTES // max(per_row, 1))))
            for batch in pf.iter_batches(batch_size=batch_size, row_groups=[index]):
                for record in batch.to_pylist():
                    row += 1
                    _check_decoded(record, path, row, max_record_bytes)
                    yield row, record
    except (pa.ArrowException, OSError) as e:
        raise ImportFormatError(path, None, "", f"not a readable Parquet file ({e})") from None


def _decoded_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _decoded_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_decoded_bytes(v) for v in value)
    return 8


def _check_decoded(record: Any, path: Path, row: int, limit: int) -> None:
    sizes = {str(k): _decoded_bytes(v) for k, v in record.items()} if isinstance(record, dict) else {"": 0}
    total = sum(sizes.values())
    if total > limit:
        name = max(sizes, key=lambda k: sizes[k])
        raise ImportFormatError(path, row, name, f"record is {total:,} bytes decoded ({sizes[name]:,} in this "
                                f"field), over the {limit:,}-byte limit per record")


def _json_limit(e: BaseException) -> str:
    """Why the JSON parser gave up on well-formed but hostile input, in a few words."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split(";")[0]


_ARRAY_CHUNK = 1 << 20  # bytes read at a time from a JSON array file (tests shrink it)


def _json_array(path: Path, f: BinaryIO, max_record_bytes: int) -> Iterator[tuple[int, Any]]:
    """The records of a JSON array file, read in chunks: memory stays near one record (at most
    `max_record_bytes` characters) whatever the file's size, and anything after the closing `]`
    is refused rather than ignored."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    text, pos, line, eof = "", 0, 1, False  # `line` is the file's line number at text[pos]

    def more() -> bool:
        """Append the next chunk to `text` (dropping what was consumed); False at the end of the file."""
        nonlocal text, pos, eof
        if eof:
            return False
        chunk = f.read(_ARRAY_CHUNK)
        try:
            part = utf8.decode(chunk, final=not chunk)
        except UnicodeDecodeError as e:
            at = line + text.count("\n", pos) + chunk.count(b"\n", 0, max(e.start, 0))
            raise ImportFormatError(path, at, "", f"not UTF-8 text ({e.reason})") from None
        text, pos, eof = text[pos:] + part, 0, not chunk
        return True

    def skip(chars: str) -> None:
        nonlocal pos, line
        while True:
            while pos < len(text) and text[pos] in chars:
                line += text[pos] == "\n"
                pos += 1
            if pos < len(text) or not more():
                return

    skip(" \t\r\n")
    pos += 1  # the "[" that _records saw
    while True:
        skip(" \t\r\n,")
        if pos >= len(text):
            raise ImportFormatError(path, line, "", "not valid JSON (the array is not closed)")
        if text[pos] == "]":
            pos += 1
            skip(" \t\r\n")
            if pos < len(text):
                raise ImportFormatError(path, line, "", f"content after the end of the JSON array "
                                        f"({text[pos:pos + 20]!r}...); expected one array per file")
            return
        while True:
            try:
                value, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                # Cut at the chunk's end (or inside an escape near it), or really malformed?
                cut = e.pos >= len(text) - 12 or e.msg.startswith("Unterminated string")
                if cut and not eof and len(text) - pos <= max_record_bytes:
                    more()
                    continue
                if cut and not eof:
                    raise ImportFormatError(path, line, "", f"record is over the {max_record_bytes:,}-character "
                                            "limit (or not closed)") from None
                at = line + text.count("\n", pos, e.pos)
                raise ImportFormatError(path, at, "", f"not valid JSON ({e.msg})") from None
            except (RecursionError, ValueError) as e:
                raise ImportFormatError(path, line, "", f"not valid JSON ({_json_limit(e)})") from None
            if end == len(text) and more():  # a number or literal may continue in the next chunk
                continue
            break
        if end - pos > max_record_bytes:
            raise ImportFormatError(path, line, "", f"record is {end - pos:,} characters, over the "
                                    f"{max_record_bytes:,} limit")
        yield line, value
        line += text.count("\n", pos, end)
        pos = end


def _valid_text(value: str, field_name: str, fail: Callable[[str, str], NoReturn]) -> str:
    """`value`, if it is Unicode that UTF-8 can encode: a JSON `\\ud800` escape decodes to a lone
    surrogate, which SQLite and every UTF-8 export refuse later (a traceback, or an export that
    always fails), so it is refused here with the field that carries it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        fail(field_name, f"contains a lone surrogate {value[e.start]!r} at character {e.start} "
                         "(not valid Unicode text)")
    return value


def _turn_loss(item: dict[str, Any], where: str, flag: str, fail: Callable[[str, str], NoReturn]) -> bool | None:
    """The per-turn loss flag from `flag` (loss/train) or `weight` (0/1), which must agree."""
    value = item.get(flag)
    if value is not None and not isinstance(value, bool):
        fail(f"{where}.{flag}", f"expected true, false or null, got {value!r}")
    weight = item.get("weight")
    if weight is not None:
        if isinstance(weight, bool) or weight not in (0, 1):
            fail(f"{where}.weight", f"expected 0 or 1, got {weight!r}")
        if value is not None and value != bool(weight):
            fail(f"{where}.weight", f"weight {weight} contradicts {flag} {value}")
        value = bool(weight)
    return value


def _parse_record(record: Any, path: Path, line: int, kind: str) -> tuple[Sample, str]:
    def fail(field_name: str, problem: str) -> NoReturn:
        raise ImportFormatError(path, line, field_name, problem)

    if not isinstance(record, dict):
        fail("", f"expected a JSON object per record, got {type(record).__name__}")
    if "conversations" in record:
        key, role_key, text_key, flag, style = "conversations", "from", "value", "loss", "agentgym"
    elif "messages" in record:
        key, role_key, text_key, flag, style = "messages", "role", "content", "train", "messages"
    else:
        fail("conversations", "missing (expected AgentGym/AgentRefine `conversations` or chat `messages` rows)")
    items = record[key]
    if not isinstance(items, list) or not items:
        fail(key, f"expected a non-empty list of turns, got {json.dumps(items)[:60]}")

    system = ""
    turns: list[Turn] = []
    first: str | None = None
    expect = "user"
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(item, dict):
            fail(where, f"expected an object, got {type(item).__name__}")
        for name in (role_key, text_key):
            if name not in item:
                fail(f"{where}.{name}", "missing")
        if not isinstance(item[text_key], str):
            fail(f"{where}.{text_key}", f"expected text, got {type(item[text_key]).__name__}")
        _valid_text(item[text_key], f"{where}.{text_key}", fail)
        role = _ROLES.get(item[role_key]) if isinstance(item[role_key], str) else None
        if role is None:
            names = "human, gpt or system" if style == "agentgym" else "user, assistant or system"
            fail(f"{where}.{role_key}", f"unknown role {item[role_key]!r} (expected {names})")
        loss = _turn_loss(item, where, flag, fail)
        if role == "system":
            if i != 0:
                fail(f"{where}.{role_key}", "a system turn may only come first")
            system = item[text_key]
            continue
        if role != expect:
            want = ("human" if expect == "user" else "gpt") if style == "agentgym" else expect
            fail(f"{where}.{role_key}", f"expected {want!r} here (turns must alternate, starting with the user), "
                                        f"got {item[role_key]!r}")
        if role == "user":
            if loss is True:
                fail(f"{where}.{flag}", "user turns carry no loss (expected null or false)")
            if first is None:
                first = item[text_key]
            else:
                turns[-1] = replace(turns[-1], observation=item[text_key])
            expect = "assistant"
        else:
            turns.append(Turn(text=item[text_key], observation=None, loss=loss))
            expect = "user"
    if not turns:
        fail(key, "has no assistant (gpt) turn: nothing to train on")
    id_key = "item_id" if record.get("item_id") is not None else "id"
    task_id = record.get(id_key)
    if task_id is not None and (isinstance(task_id, bool) or not isinstance(task_id, (str, int))):
        fail(id_key, f"expected text or an integer, got {type(task_id).__name__}")
    if isinstance(task_id, str):
        _valid_text(task_id, id_key, fail)
    task = Task(id=str(task_id if task_id is not None else ""), first_observation=first or "", system=system)
    probe = Sample(id="", kind=kind, task=task, turns=tuple(turns))
    sample = Sample(
        id=stable_id("imported", kind, json.dumps(probe.data(), sort_keys=True)), kind=kind, task=task,
        turns=tuple(turns), run_id=None,
        source={"file": path.name, "line": line, "format": style, "original_id": task.id or None},
    )
    return sample, style


def read_samples(path: str | Path, kind: str = "imported", max_line_bytes: int = MAX_LINE_BYTES) -> ImportResult:
    """Every record of an AgentGym / AgentRefine / chat-messages file as Samples, or an
    `ImportFormatError` for the first bad record (so nothing is imported partially)."""
    p = Path(path)
    if kind not in KINDS:
        raise DatasetError(f"unknown sample kind {kind!r} (expected one of {', '.join(KINDS)})")
    if not p.is_file():
        raise DatasetError(f"{p}: no such file")
    out = ImportResult()
    seen: set[str] = set()
    for line, record in _records(p, max_line_bytes):
        sample, style = _parse_record(record, p, line, kind)
        out.records += 1
        out.formats[style] = out.formats.get(style, 0) + 1
        if sample.id in seen:
            out.duplicates += 1
            continue
        seen.add(sample.id)
        out.samples.append(sample)
    if not out.records:
        raise ImportFormatError(p, None, "", "no records found")
    return out
