"""Markdown / HTML injection: every text from a model, an env, a server, a job or its log is shown
as text on every page. The fixture store (markup_fixture.py) puts a payload — image link, <img>,
link, **bold**, <script> — into each such field (run name, task goal, observation, thought, raw
completion, critic reason, judge reason and model, refinement texts, job name / error / phase / log,
evaluated model, and numbers of imported samples). Each page is run through AppTest; every string of every element is collected from the
element protos. Strings in elements that show plain text (code, text, json, select options, text
areas, tables) may hold a payload verbatim; any other string that holds one is rendered as Markdown
(markdown-it with raw HTML allowed: the worst case) and must come out as text: no image, link,
emphasis or HTML element. And each field's payload must appear, literally, on its page."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from markdown_it import MarkdownIt
from markup_fixture import FIELDS, P, build_markup_store
from streamlit.testing.v1 import AppTest

from dashboard.text import md
from engine.store import Store

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
# (element type, proto field) pairs that Streamlit shows as plain text.
PLAIN = {("code", "code_text"), ("text", "body"), ("json", "body"), ("selectbox", "options"),
         ("selectbox", "raw_value"), ("multiselect", "options"), ("multiselect", "raw_values"),
         ("text_area", "value"), ("text_area", "default"), ("text_input", "value"), ("text_input", "default")}
MARKDOWN = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
# An element made from a payload: its image, link or script, or its own **bold** as emphasis.
MARKUP = re.compile(r"<(img|a|script)\b|<(strong|em)>zq[a-z]+bold</")


@pytest.fixture(scope="module")
def markup_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("markup") / "orchard.db"
    return path, build_markup_store(path)


def _strings(msg, path: str = "") -> Iterator[tuple[str, str]]:
    """(field path, value) of every string in a protobuf message, nested messages and maps included."""
    for fd, value in msg.ListFields():
        if isinstance(value, str | bytes) or hasattr(value, "ListFields"):
            items = [value]
        elif hasattr(value, "keys"):
            items = [*map(str, value), *(value[k] for k in value)]
        elif isinstance(value, int | float | bool):
            items = []
        else:
            items = list(value)
        for v in items:
            if hasattr(v, "ListFields"):
                yield from _strings(v, f"{path}{fd.name}.")
            elif isinstance(v, str):
                yield f"{path}{fd.name}", v


def _elements(node) -> Iterator[tuple[str, str, str]]:
    proto = getattr(node, "proto", None)
    if proto is not None and hasattr(proto, "ListFields"):
        for field, value in _strings(proto):
            yield node.type, field, value
    for child in getattr(node, "children", {}).values():
        yield from _elements(child)


def _rendered_text(markdown: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", MARKDOWN.render(markdown)))


def check_page(page: str, expect: tuple[str, ...], **params: str) -> None:
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(page)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown: list[str] = [str(cell) for df in at.dataframe for col in df.value.columns for cell in df.value[col]]
    for chart in at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart"):
        # Its rows travel as Arrow; Vega's tooltip escapes & and < before showing a cell: plain text.
        rows = pa.ipc.open_stream(chart.proto.data.data).read_all().to_pylist()
        shown += [v for row in rows for v in row.values() if isinstance(v, str)]
    for kind, field, value in _elements(at._tree):
        if not any(tag in value for tag in FIELDS):
            continue
        if (kind, field) in PLAIN:
            shown.append(value)
        elif kind == "plotly_chart":  # Plotly renders a subset of HTML in labels: must be escaped
            assert not MARKUP.search(value), (page, kind, field, value[:200])
        else:  # everything else may be rendered as Markdown
            rendered = MARKDOWN.render(value)
            assert not MARKUP.search(rendered), (page, kind, field, value[:200], rendered[:300])
            shown.append(_rendered_text(value))
    text = "\n".join(shown)
    missing = [tag for tag in expect if P[tag] not in text]
    assert not missing, (page, missing)
    assert not at.get("html"), page  # no HTML element on any page


def test_escape_helper_renders_exactly_the_text() -> None:
    for value in P.values():
        rendered = MARKDOWN.render(md(value))
        assert not MARKUP.search(rendered) and _rendered_text(md(value)).strip() == value
    assert md("two\nlines") == "two lines"


def test_search_pages_show_untrusted_text_as_text(markup_db, monkeypatch) -> None:
    path, ids = markup_db
    monkeypatch.setenv("ORCHARD_DB", str(path))
    check_page("views/runs.py", ("RUNNAME", "JOBNAME", "JOBERR", "JOBPHASE", "JOBLOG"))
    with Store(path) as store:
        trees = {task: store.load_tree(tid) for tid, task in store.tree_ids(ids["run"])}
    task, tree = next((t, tr) for t, tr in trees.items() if any(n.format_error for n in tr.nodes))
    raw = next(n for n in tree.nodes if n.format_error)
    obs = next(n for n in tree.nodes if P["OBS"] in n.observation and n.action is not None)
    check_page("views/tree_explorer.py", ("RUNNAME", "GOAL", "RAW", "CRITIC"), run=ids["run"], task=task,
               node=str(raw.id))
    check_page("views/tree_explorer.py", ("GOAL", "OBS", "THOUGHT", "CRITIC"), run=ids["run"], task=task,
               node=str(obs.id))


def test_data_pages_show_untrusted_text_as_text(markup_db, monkeypatch) -> None:
    path, ids = markup_db
    monkeypatch.setenv("ORCHARD_DB", str(path))
    check_page("views/trajectories.py", ("RUNNAME", "GOAL", "JUDGE", "JUDGEMODEL", "IMPORTED"))
    check_page("views/pairs.py", ("RUNNAME", "GOAL", "THOUGHT"))
    # with a run chosen: its build forms and the build jobs' panels
    run = ids["run"]
    check_page("views/trajectories.py", ("RUNNAME", "JOBNAME", "JOBERR", "JOBPHASE", "JOBLOG"), run=run)
    check_page("views/pairs.py", ("RUNNAME", "JOBNAME", "JOBERR", "JOBPHASE", "JOBLOG"), run=run)
    check_page("views/refinement.py", ("PERSONA", "DMOBS", "PLAYER", "IMPORTED"))


def test_model_pages_show_untrusted_text_as_text(markup_db, monkeypatch) -> None:
    path, ids = markup_db
    monkeypatch.setenv("ORCHARD_DB", str(path))
    check_page("views/training.py", ("RUNNAME", "JOBNAME", "JOBERR", "JOBPHASE", "JOBLOG"), job=ids["job"])
    check_page("views/evaluation.py", ("EVALMODEL", "JOBNAME", "JOBERR", "JOBPHASE", "JOBLOG"))
