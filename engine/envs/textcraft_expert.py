"""A scripted TextCraft expert: gold trajectories for training data, and noisy ones with labelled mistakes.

The expert re-plans from the env's CURRENT inventory at every step (get the missing base items, craft
intermediates bottom-up, craft the goal), so it recovers from its own mistakes and from whatever another
policy did before it took over. With probability `noise` a step is instead a plausible mistake (a
wasted or failing command); `ExpertStep.is_mistake` says so, so that callers can mask or label it.

`compact=True` writes the same five parts in far fewer words (a PLAN of "get N item" / "craft N item"
lines, one-clause THOUGHT and EXPLANATION): the tiny model is trained on these, because every earlier
step is repeated in the actor prompt's history, and long texts push late-step prompts past what a
CPU-trained model can learn (measured in docs/decisions.md, "A capable tiny policy").
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import lru_cache

from engine.actions import CompositeAction
from engine.envs.base import EnvError, Step
from engine.envs.textcraft import GOAL_COUNT, TextCraftEnv
from engine.envs.textcraft_recipes import Recipe, TreeNode, readable, recipe_book, recipe_tree

MISTAKE_KINDS = ("get_craftable", "get_distractor", "wrong_count", "wrong_ingredient", "inventory")


@dataclass(frozen=True)
class ExpertStep:
    """One expert step. `mistake` names the deliberate mistake ("" for a correct step)."""

    action: CompositeAction
    mistake: str = ""

    @property
    def is_mistake(self) -> bool:
        return bool(self.mistake)


@dataclass(frozen=True)
class Move:
    """One planned command and why: `need` of `item` (`held` already) for `parents` (none: the goal)."""

    item: str
    need: int
    held: int
    parents: tuple[str, ...]
    recipe: Recipe | None = None  # None: a get
    batches: int = 0
    using: tuple[tuple[str, int], ...] = ()

    @property
    def command(self) -> str:
        if self.recipe is None:
            return f"get {self.need - self.held} {readable(self.item)}"
        using = ", ".join(f"{n} {readable(i)}" for i, n in self.using)
        return f"craft {self.recipe.count * self.batches} {readable(self.item)} using {using}"


def plan(goal: str, inventory: dict[str, int]) -> list[Move]:
    """The commands that craft `goal` from `inventory`, bottom-up; empty when the goal is held.

    Held items are reserved as the plan uses them, so every command is executable when its turn comes;
    the gets of one base item are merged into its first get (fetching early is harmless, saves steps).
    """
    inv = dict(inventory)
    moves: list[Move] = []

    def ensure(node: TreeNode, need: int, parents: tuple[str, ...]) -> str:
        options = [node.item, *sorted(node.accepted - {node.item})]
        usable = next((m for m in options if inv.get(m, 0) >= need), None)
        if usable is not None:
            inv[usable] -= need
            return usable
        held = inv.get(node.item, 0)
        if node.recipe is None:
            moves.append(Move(node.item, need, held, parents))
            inv[node.item] = need
        else:
            batches = math.ceil((need - held) / node.recipe.count)
            using = tuple(
                (ensure(child, ing.count * batches, (node.item,)), ing.count * batches)
                for child, ing in zip(node.children, node.recipe.ingredients, strict=True)
            )
            moves.append(Move(node.item, need, held, parents, node.recipe, batches, using))
            inv[node.item] = held + node.recipe.count * batches
        inv[node.item] -= need
        return node.item

    if inventory.get(goal, 0) < GOAL_COUNT:
        ensure(recipe_tree(goal).root, GOAL_COUNT, ())
    merged: list[Move] = []
    first_get: dict[str, int] = {}
    for move in moves:
        if move.recipe is None and move.item in first_get:
            i = first_get[move.item]
            extra = tuple(p for p in move.parents if p not in merged[i].parents)
            merged[i] = replace(
                merged[i], need=merged[i].need + move.need - move.held, parents=merged[i].parents + extra
            )
            continue
        if move.recipe is None:
            first_get[move.item] = len(merged)
        merged.append(move)
    return merged


@lru_cache(maxsize=1024)
def _distractor_items(goal: str) -> tuple[str, ...]:
    """Base items of recipes that use the goal tree's items but are not needed for the goal."""
    book, tree = recipe_book(), recipe_tree(goal)
    needed = {goal}.union(*tree.nodes.values())
    found = {
        ing.key
        for item in (goal, *tree.nodes)
        for recipe in book.uses.get(item, ())
        for ing in recipe.ingredients
        if ing.key in book.base and not ing.accepted & needed
    }
    return tuple(sorted(found))


def _names(items: tuple[str, ...]) -> str:
    return " and ".join(map(readable, items))


def _batches(n: int) -> str:
    return f"{n} batch{'es' if n > 1 else ''}"


class TextCraftExpert:
    """Plans the next command from `env`'s current state; `noise` is the per-step mistake probability."""

    def __init__(
        self, env: TextCraftEnv, noise: float = 0.0, seed: int | str = 0, compact: bool = False,
        chain: bool = False,
    ) -> None:
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {noise}")
        self.env, self.noise, self._rng, self.compact = env, noise, random.Random(seed), compact
        self.chain = chain  # compact texts that reason top-down from the goal (see _chain_reasons)

    def act(self, first_step: bool = False) -> ExpertStep:
        """The next step; `first_step` adds the PLAN (the numbered commands from the current state)."""
        task = self.env.current_task
        if task is None:
            raise EnvError("the expert needs a reset env: call env.reset(task_id) first")
        goal = task.meta["goal_item"]
        moves = plan(goal, dict(self.env.inventory))
        plan_text = None
        if first_step:
            if self.chain:
                plan_text = _chain_plan(moves, goal)
            else:
                plan_text = _compact_plan(moves, goal) if self.compact else self._plan_text(moves, goal)
        if not moves:
            thought = f"I already hold {readable(goal)}, the goal."
            return ExpertStep(
                CompositeAction(thought, "inventory", "Nothing is left to craft.", plan=plan_text)
            )
        if self.noise and self._rng.random() < self.noise:
            mistake = self._mistake(goal, moves, plan_text)
            if mistake is not None:
                return mistake
        if self.chain:
            thought, explanation = _chain_reasons(moves, moves[0], goal)
        else:
            thought, explanation = _compact_reasons(moves[0]) if self.compact else self._reasons(moves[0])
        return ExpertStep(CompositeAction(thought, moves[0].command, explanation, plan=plan_text))

    @staticmethod
    def _plan_text(moves: list[Move], goal: str) -> str:
        lines = [
            f"{i}. {m.command} ({f'for {_names(m.parents)}' if m.parents else 'the goal'})"
            for i, m in enumerate(moves, 1)
        ]
        return "\n".join(lines) or f"1. Nothing to do: {readable(goal)} is already held."

    @staticmethod
    def _reasons(move: Move) -> tuple[str, str]:
        item = readable(move.item)
        if move.recipe is None:
            thought = (
                f"I need {move.need} {item} for {_names(move.parents)} and hold {move.held}. "
                f"{item.capitalize()} is a base item, so I get the missing {move.need - move.held}."
            )
            return thought, f"'get' fetches base items; {item} has no recipe."
        using = ", ".join(f"{n} {readable(i)}" for i, n in move.using)
        made = move.recipe.count * move.batches
        if not move.parents:
            thought = f"I hold every ingredient of the goal ({using}); crafting {item} completes the task."
        else:
            thought = (
                f"I need {move.need} {item} for {_names(move.parents)} and hold {move.held}. "
                f"I have the ingredients ({using}), so I craft {_batches(move.batches)}."
            )
        explanation = (
            f"The recipe '{move.recipe.line()}' makes {move.recipe.count} per batch; "
            f"{_batches(move.batches)} {'give' if move.batches > 1 else 'gives'} {made}."
        )
        return thought, explanation

    def _mistake(self, goal: str, moves: list[Move], plan_text: str | None) -> ExpertStep | None:
        """A plausible wrong step, or None when the drawn kind does not apply here."""
        rng, kind = self._rng, self._rng.choice(MISTAKE_KINDS)
        craft = next(m for m in moves if m.recipe is not None)  # the goal's craft comes last
        if kind == "get_craftable":
            item = readable(rng.choice([m.item for m in moves if m.recipe is not None]))
            thought = f"I need {item}. Getting it directly is quicker than crafting it."
            command, explanation = f"get 1 {item}", f"'get' should give me {item} in one step."
            if self.compact:
                thought, explanation = f"Get {item} directly.", f"get gives {item}."
        elif kind == "get_distractor":
            pool = _distractor_items(goal)
            if not pool:
                return None
            item = readable(rng.choice(pool))
            thought = f"{item.capitalize()} goes into recipes with my ingredients; I gather some in case."
            command, explanation = f"get {rng.randint(1, 4)} {item}", f"'get' fetches {item}, a base item."
            if self.compact:
                thought, explanation = f"{item.capitalize()} may be useful.", f"get {item}."
        elif kind in ("wrong_count", "wrong_ingredient"):
            using = list(craft.using)
            i = rng.randrange(len(using))
            if kind == "wrong_count":
                named, n = using[i]
                using[i] = (named, n + 1 if n == 1 or rng.random() < 0.5 else n - 1)
            else:
                pool = _distractor_items(goal)
                if not pool:
                    return None
                using[i] = (rng.choice(pool), using[i][1])
            wrong = replace(craft, using=tuple(using))
            if self.chain:
                thought, explanation = _chain_reasons(moves, wrong, goal)
            else:
                thought, explanation = _compact_reasons(wrong) if self.compact else self._reasons(wrong)
            command = wrong.command
        else:
            thought = "Let me check what I am carrying before the next step."
            command, explanation = "inventory", "'inventory' lists the items I hold."
            if self.compact:
                thought, explanation = "Check the inventory.", "list held items."
        return ExpertStep(CompositeAction(thought, command, explanation, plan=plan_text), kind)


def _compact_plan(moves: list[Move], goal: str) -> str:
    """One short line per planned command: the verb, count and item (the recipe is in the task)."""
    lines = [f"{i}. {m.command.split(' using ')[0]}" for i, m in enumerate(moves, 1)]
    return "\n".join(lines) or f"1. Nothing to do: {readable(goal)} is already held."


def _compact_reasons(move: Move) -> tuple[str, str]:
    """THOUGHT names what the step is for and what is held; EXPLANATION the rule it applies."""
    item = readable(move.item)
    if move.recipe is None:
        return f"Need {move.need} {item} for {_names(move.parents)}, have {move.held}.", "Base item: get it."
    if not move.parents:
        return f"All ingredients held; craft {item}, the goal.", "This completes the task."
    thought = f"Need {move.need} {item} for {_names(move.parents)}, have {move.held}."
    return thought, f"{move.recipe.count} per batch, {_batches(move.batches)}."


def _chain_plan(moves: list[Move], goal: str) -> str:
    """The recipes to use, goal first (each line a crafting command of the task, copied): every
    line is found by the item the line before it names, which a small model can learn to look up."""
    crafts = [m for m in reversed(moves) if m.recipe is not None]
    lines = [f"{i}. {m.recipe.line()}" for i, m in enumerate(crafts, 1) if m.recipe is not None]
    return "\n".join(lines) or f"1. Nothing to do: {readable(goal)} is already held."


def _chain_reasons(moves: list[Move], move: Move, goal: str) -> tuple[str, str]:
    """THOUGHT walks from the goal down to this step's item ("jungle boat <- jungle planks <- jungle
    logs"), then says what is needed and held."""
    by_item = {m.item: m for m in moves if m.recipe is not None}
    names, cur = [move.item], move
    while cur.parents and cur.parents[0] in by_item and len(names) < 8:
        cur = by_item[cur.parents[0]]
        names.append(cur.item)
    path = " <- ".join(readable(n) for n in reversed(names))
    item = readable(move.item)
    if move.recipe is None:
        return f"{path}. Need {move.need}, have {move.held}.", "Base item: get it."
    if not move.parents:
        return f"{path}: all ingredients held, craft it.", "This completes the task."
    return f"{path}. Need {move.need}, have {move.held}.", f"{move.recipe.count} {item} per batch."


def solve(
    env: TextCraftEnv, task_id: str, noise: float = 0.0, seed: int = 0, max_steps: int = 60
) -> list[tuple[ExpertStep, Step]]:
    """Run one episode of the expert on `task_id` (stops when done or after `max_steps`). The task id is
    mixed into the seed, so that tasks run with the same seed still draw different mistakes."""
    env.reset(task_id)
    expert = TextCraftExpert(env, noise, f"{task_id}/{seed}")
    trajectory: list[tuple[ExpertStep, Step]] = []
    for i in range(max_steps):
        expert_step = expert.act(first_step=i == 0)
        step = env.step(expert_step.action.command)
        trajectory.append((expert_step, step))
        if step.done:
            break
    return trajectory
