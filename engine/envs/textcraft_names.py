"""TextCraft's item names as text: the names, the words they are made of, one regex that finds them,
and a renamer that swaps them consistently.

WHY: a model that sees a recipe under its real names can memorise it (~440 training recipes) instead
of reading it from the task's crafting commands, and then fails on every held-out goal. Showing the
same episode with every item name swapped for another, the same swap in the task, the crafting
commands, the history, the observations and the answers, leaves reading as the only way to predict
the next command. The tiny model's training data does this (`engine.llm.tiny_data`), and so can the
loop's training data (`engine.datasets.renamed`, through `TextCraftEnv.renamer`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from functools import lru_cache

from engine.envs.textcraft_recipes import NS, readable, recipe_book


def item_names() -> list[str]:
    """Every readable item name of the recipe book."""
    return sorted(recipe_book().by_name)


def item_words() -> list[str]:
    """The words item names are made of ("lime", "carpet", "oak" ...), without the few function
    words some names contain ("lily of the valley"). The tokenizer keeps each one a separate piece,
    so "lime carpet" and "lime wool" share "lime", and new goals resemble known ones."""
    stop = {"a", "and", "o", "of", "on", "the"}
    return sorted({w for name in item_names() for w in name.split()} - stop)


def trie_pattern(words: Sequence[str]) -> str:
    """One regex matching any of `words`, nested by common prefix (a plain alternation of ~700
    names scans ~10x slower, in Python's `re` and in the tokenizer's Oniguruma alike)."""
    trie: dict[str, dict] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, dict]) -> str:
        alternatives = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alternatives:
            return ""
        return "(?:" + "|".join(alternatives) + ")" + ("?" if "" in node else "")

    return emit(trie)


@lru_cache(maxsize=1)
def _name_pattern() -> re.Pattern[str]:
    # Greedy trie: the longest name wins ("stone slab" before "stone").
    return re.compile(rf"{re.escape(NS)}[a-z0-9_]+|\b{trie_pattern(item_names())}\b", re.IGNORECASE)


def renamer(rng: random.Random, names: Sequence[str]) -> Callable[[str], str]:
    """A text -> text function that swaps every item name (and `minecraft:` id) for another,
    drawn on first sight and kept for the renamer's lifetime (one episode)."""
    mapping: dict[str, str] = {}
    pool = list(names)

    def swap(name: str) -> str:
        if name not in mapping:
            mapping[name] = pool.pop(rng.randrange(len(pool)))
        return mapping[name]

    def one(match: re.Match[str]) -> str:
        text = match.group(0)
        if text.lower().startswith(NS):
            return NS + swap(readable(text.lower())).replace(" ", "_")
        new = swap(text.lower())
        return new[:1].upper() + new[1:] if text[:1].isupper() else new

    return lambda text: _name_pattern().sub(one, text)


