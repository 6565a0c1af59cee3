"""Untrusted text inside Streamlit elements that render Markdown.

WHY: st.markdown, st.caption, st.error / warning / info / success, expander and tab labels,
widget labels and help, radio options, st.progress text and st.metric labels all render Markdown
(GitHub-flavoured, plus Streamlit's `:red[...]` directives and `$math$`); an image link in such
text makes every viewer's browser fetch a URL. Text from a model, an env, a server, a job log or an
imported file is shown with st.code / st.text / tables where it can be long; where a short piece of
it sits inside one of those elements, it goes through `md()`.
"""

from __future__ import annotations

import math
import re

# Every ASCII punctuation character (CommonMark lets each be backslash-escaped to stand for itself):
# this covers emphasis, links and images, code spans, raw HTML (<), entities (&), directives ([),
# math ($), tables (|) and headings / lists (#, -, +, digits followed by '.' or ')').
_PUNCT = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")


def md(text: object) -> str:
    """`text` as one line of Markdown that renders as exactly that text (whitespace runs collapsed)."""
    return _PUNCT.sub(r"\\\1", " ".join(str(text).split()))


def short_path(text: object, limit: int = 32) -> str:
    """A long path or spec shortened to its end (where a model folder's name is), "…" in front: so that a
    table's key columns stay in view; the full text goes in a column of its own."""
    value = " ".join(str(text).split())
    return value if len(value) <= limit else "…" + value[-(limit - 1):]


def whole_number(text: object) -> int | None:
    """`text` as a whole number >= 0 when it is ASCII digits only, else None (a URL or a typed box:
    `"²".isdigit()` is true, and int("²") raises)."""
    return int(text) if isinstance(text, str) and text.isascii() and text.isdigit() else None


def number(value: object, default: float) -> float:
    """A stored setting as a finite number, else `default` (a run's config is a stored JSON object: any
    type may be there)."""
    if isinstance(value, bool):
        return default
    try:
        out = float(value) if isinstance(value, int | float) else float(str(value))
    except (ValueError, OverflowError):
        return default
    return out if math.isfinite(out) else default
