"""Agreement between curators: raw agreement, Cohen's kappa (two raters) and Fleiss' kappa (many).

Implemented here (a few lines each) rather than pulling in scikit-learn / statsmodels for them; the
tests check them against the textbook examples. Kappa is (observed - chance) / (1 - chance); it is
None where it is undefined (chance agreement is 1: every rating the same category)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import combinations


def raw_agreement(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Share of items two raters labelled alike (None without items)."""
    if len(a) != len(b):
        raise ValueError("raw_agreement: the two raters must rate the same items")
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a) if a else None


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Cohen's kappa of two raters over the same items: chance from each rater's own label shares."""
    po = raw_agreement(a, b)
    if po is None:
        return None
    n = len(a)
    ca, cb = Counter(a), Counter(b)
    pe = sum(ca[k] * cb[k] for k in ca) / (n * n)
    return None if pe == 1 else (po - pe) / (1 - pe)


def fleiss_kappa(counts: Sequence[Mapping[str, int]]) -> float | None:
    """Fleiss' kappa from per-item category counts. Items may have different numbers of raters (at
    least 2 each; items with fewer are skipped): P_i uses each item's own count, and the category
    shares pool all ratings, which is Fleiss' formula when every item has the same number."""
    rows = [c for c in counts if sum(c.values()) >= 2]
    if not rows:
        return None
    p_items = []
    totals: Counter[str] = Counter()
    for c in rows:
        n = sum(c.values())
        p_items.append(sum(v * (v - 1) for v in c.values()) / (n * (n - 1)))
        totals.update(c)
    all_ratings = sum(totals.values())
    p_bar = sum(p_items) / len(rows)
    pe = sum((v / all_ratings) ** 2 for v in totals.values())
    return None if pe == 1 else (p_bar - pe) / (1 - pe)


def agreement_report(labels: Mapping[str, Mapping[str, str]]) -> dict:
    """From item -> {rater: label}: per rater pair (items both rated, raw agreement, Cohen's kappa),
    and over all items rated at least twice (their count, share fully agreed, Fleiss' kappa)."""
    raters = sorted({r for by in labels.values() for r in by})
    pairs = []
    for r1, r2 in combinations(raters, 2):
        both = [(by[r1], by[r2]) for by in labels.values() if r1 in by and r2 in by]
        if both:
            a, b = [x for x, _ in both], [y for _, y in both]
            pairs.append({"raters": (r1, r2), "items": len(both), "raw": raw_agreement(a, b),
                          "cohen_kappa": cohen_kappa(a, b)})
    multi = [by for by in labels.values() if len(by) >= 2]
    return {
        "pairs": pairs,
        "items": len(multi),
        "raw": sum(len(set(by.values())) == 1 for by in multi) / len(multi) if multi else None,
        "fleiss_kappa": fleiss_kappa([Counter(by.values()) for by in multi]),
    }
