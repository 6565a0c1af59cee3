"""Every `docs/algorithms.md §N` reference in the repository names a section that exists there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
HEADING = re.compile(r"^#{2,3} §(\d+(?:\.\d+)?) ", re.MULTILINE)


def _sections() -> set[str]:
    return set(HEADING.findall((ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")))


def _references() -> list[tuple[str, str]]:
    """(where, section) for each § that follows `algorithms.md` on a line of code, tests or docs."""
    files = [ROOT / "README.md", *(p for d in ("engine", "dashboard", "tests", "bench", "docs")
                                   for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md"))]
    out = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            at = line.find("algorithms.md")
            if at >= 0 and path.name != "algorithms.md":
                out += [(f"{path.relative_to(ROOT)}:{n}", s) for s in SECTION.findall(line[at:])]
    return out


def test_sections_are_numbered_one_to_seven_with_the_mcts_steps():
    assert {"1", "2", "2.1", "2.2", "2.3", "2.4", "2.5", "3", "4", "4.1", "4.2", "4.3", "5", "6", "7"} <= _sections()


def test_every_reference_points_at_an_existing_section():
    sections, refs = _sections(), _references()
    assert len(refs) > 30  # the code does cite the document
    missing = [f"{where}: §{s}" for where, s in refs if s not in sections]
    assert missing == []
