"""`offline`: a scripted AgentRefine synthesizer, NOT a language model: it answers the refine pipeline's
prompts (engine/datasets/refine.py) from TextCraft's own task generator and scripted expert.

WHY: AgentRefine needs a model that writes a JSON script and then plays Dungeon Master and player in
one JSON log; the embedded default (the tiny policy, 4096 positions) cannot, so the Refinement page
stayed empty after `orchard demo` and a build from the dashboard was a dead end. This generator
stands in for that model where none is at hand. Its answers go through the SAME code as a model's:
`parse_script` / `check_script`, `parse_turns` / `verify_trajectory`, continuation and regeneration,
`to_sample`'s per-turn loss mask. Nothing is special-cased downstream; rows say `model: offline`.

What it writes:
- script prompt -> a TextCraft task (a train task, never a test one) chosen by a hash of the persona
  and the request's seed, as a script: the task's crafting commands as the environment, three
  actions (`get`, `craft`, `inventory`) whose regexes and parameter lists come from the goal's recipe
  tree. The persona only seeds the choice: a scripted synthesizer cannot theme a world.
- trajectory prompt (and continuation / regeneration) -> the expert (engine/envs/textcraft_expert.py)
  solves the task in a real TextCraftEnv; before some of its steps (at least the prompt's "at least
  N mistakes", each before a different correct step) a plausible expert mistake is injected that the
  env REJECTS (a get of a craftable item, wrong counts, a wrong ingredient: a rejected command
  changes nothing), then the expert's correct step follows as the refinement, its thought quoting
  the env's refusal. The DM turns are the env's own observations; the DM's evaluation flags the
  mistake as "parameter" when it breaks the script's rules, else "logic". The log is a function of
  the script alone, so a continuation (the verified prefix then the rest) gets the same log, whose
  repeated prefix the pipeline strips.

Deterministic: the same personas and `RefineConfig.seed` give the same rows. No tokens are generated:
`Completion.n_tokens` is 0 and log-probs are None.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from engine.llm.base import Completion, GeneratorError, Prompt, SampleRequest

OFFLINE_MODEL = "offline"
MAX_GET = 64  # `get` counts the script allows (a Minecraft stack)
MIN_STEPS = 3  # expert steps a chosen task needs at least (a get and a craft alone make a thin log)
MAX_STEPS = 40  # expert steps per log at most (the tasks need at most ~12)
MISTAKE_DRAWS = 24  # expert mistakes drawn per injection until one the env rejects
REJECTED_KINDS = ("get_craftable", "wrong_count", "wrong_ingredient")  # the env refuses these
WHY = {
    "get_craftable": "only base items can be fetched with 'get'; this item has a recipe and must be crafted",
    "wrong_count": "the ingredient counts do not match the recipe for that many items",
    "wrong_ingredient": "an ingredient named is not part of the item's recipe",
}
_SCRIPT_HEAD = "You are writing a script for a text game"
_TRAJECTORY_HEAD = "You will write the complete log of one game"


def is_offline(model: str) -> bool:
    """Whether a model spec names this synthesizer."""
    return model.strip() == OFFLINE_MODEL


def _hash(*parts: object) -> int:
    digest = hashlib.sha1(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


@lru_cache(maxsize=1)
def _train_tasks() -> tuple[tuple[str, int], ...]:
    """(task id, correct steps from scratch) of every TextCraft train task."""
    from engine.envs.textcraft import TextCraftEnv
    from engine.envs.textcraft_expert import plan

    return tuple((t.id, len(plan(t.meta["goal_item"], {}))) for t in TextCraftEnv().tasks("train"))


def _corrections_asked(text: str) -> int:
    found = re.search(r"at least (\d+) mistakes", text)
    return int(found.group(1)) if found else 2


def _mistakes(asked: int) -> int:
    return max(asked, 1)


# ---------------------------------------------------------------- scripts


def make_script(persona: str, seed: int, corrections: int = 2) -> dict[str, Any]:
    """The script for `persona` (see the module docstring): a TextCraft train task with enough
    expert steps to place `corrections` mistakes before distinct ones."""
    from engine.envs.textcraft import MAX_BATCHES, TextCraftEnv
    from engine.envs.textcraft_expert import plan
    from engine.envs.textcraft_recipes import readable, recipe_tree

    need = _mistakes(corrections)
    pool = [tid for tid, steps in _train_tasks() if steps >= max(need, MIN_STEPS)] or [t for t, _ in _train_tasks()]
    task = TextCraftEnv().task(pool[_hash(persona, seed) % len(pool)])
    goal = task.meta["goal_item"]
    moves = plan(goal, {})
    tree = recipe_tree(goal)
    gets = sorted({readable(m.item) for m in moves if m.recipe is None}
                  | {readable(item) for item in tree.nodes if not any(m.item == item and m.recipe for m in moves)})
    crafts = [m for m in moves if m.recipe is not None]
    craft_items = sorted({readable(m.item) for m in crafts})
    counts: set[int] = set()
    ingredients: set[str] = set()
    for m in crafts:
        assert m.recipe is not None
        for b in range(1, MAX_BATCHES + 1):
            counts.add(m.recipe.count * b)
            ingredients.add(", ".join(f"{n // m.batches * b} {readable(i)}" for i, n in m.using))
    first = moves[0]
    lines = task.context.removeprefix("Crafting commands:\n").splitlines()
    return {
        "environment": {
            "world": "TextCraft: craft a Minecraft item from base materials (written by the offline synthesizer "
                     "from TextCraft's task generator and scripted expert, not by a language model)",
            "textcraft_task": task.id,
            "variant": seed,
            "crafting_commands": lines,
            "base_items": gets,
            "player": {"inventory": []},
        },
        "task": f"{task.goal[0].upper()}{task.goal[1:]} (TextCraft task {task.id}).",
        "actions": [
            {"name": "get", "pattern": r"get (?P<count>[0-9]+) (?P<item>[a-z][a-z0-9' -]*)",
             "parameters": {"count": [str(n) for n in range(1, MAX_GET + 1)], "item": gets},
             "examples": [first.command if first.recipe is None else f"get 1 {gets[0]}"]},
            {"name": "craft", "pattern": r"craft (?P<count>[0-9]+) (?P<item>[a-z][a-z0-9' -]*?) using "
                                         r"(?P<ingredients>[a-z0-9][a-z0-9' ,-]*)",
             "parameters": {"count": [str(n) for n in sorted(counts)], "item": craft_items,
                            "ingredients": sorted(ingredients)},
             "examples": [crafts[-1].command]},
            {"name": "inventory", "pattern": "inventory", "parameters": {}, "examples": ["inventory"]},
        ],
    }


# ---------------------------------------------------------------- trajectories


def _held(env: Any) -> str:
    from engine.envs.textcraft_recipes import readable

    return ", ".join(f"{n} {readable(i)}" for i, n in env.inventory.items()) or "nothing"


def make_trajectory(script_data: dict[str, Any], corrections: int = 2) -> list[dict[str, Any]]:
    """The log of `script_data` (a script `make_script` wrote): the expert's solution with
    `corrections` env-rejected mistakes, each followed by its refinement (the module docstring)."""
    from engine.datasets.refine import _dm, check_script
    from engine.envs.base import EnvError
    from engine.envs.textcraft import TextCraftEnv
    from engine.envs.textcraft_expert import TextCraftExpert, plan

    env_data = script_data.get("environment") if isinstance(script_data, dict) else None
    task_id = env_data.get("textcraft_task") if isinstance(env_data, dict) else None
    variant = env_data.get("variant", 0) if isinstance(env_data, dict) else 0
    script = check_script(script_data)
    if not isinstance(task_id, str) or not hasattr(script, "actions"):
        raise GeneratorError("offline synthesizer: the script is not one it wrote (no TextCraft task in it)")
    env = TextCraftEnv()
    try:
        first = env.reset(task_id)
    except EnvError as e:
        raise GeneratorError(f"offline synthesizer: {e}") from None
    task = env.current_task
    assert task is not None
    steps = len(plan(task.meta["goal_item"], {}))
    rng = random.Random(_hash(task_id, variant, "mistakes"))
    at = set(rng.sample(range(steps), min(_mistakes(corrections), steps)))
    expert = TextCraftExpert(env)
    noisy = TextCraftExpert(env, noise=1.0, seed=f"{task_id}/{variant}")
    turns: list[dict[str, Any]] = [_dm(
        f"The player starts with nothing; the goal is to {task.goal}.",
        f"{first} Your goal: {task.goal}.")]
    refusal: str | None = None
    done_steps = 0
    for _ in range(MAX_STEPS):
        if done_steps in at and refusal is None:
            at.discard(done_steps)
            mistake = _rejected_mistake(env, noisy)
            if mistake is not None:
                action, kind, observation = mistake
                turns.append({"role": "player", "thought": f"{action.thought} {action.explanation}".strip(),
                              "action": action.command})
                problem = _problem(script, action.command)
                turns.append(_dm(
                    f"The game refused '{action.command}': {WHY[kind]}. Nothing changed; the player holds "
                    f"{_held(env)}.", observation, "parameter" if problem else "logic",
                    f"{WHY[kind][0].upper()}{WHY[kind][1:]}." + (f" The script's rules: {problem}." if problem else "")))
                refusal = observation
                continue
        step_action = expert.act(first_step=False).action
        step = env.step(step_action.command)
        if not step.info.get("ok", True):  # the expert's own plan failed: not a log to keep
            raise GeneratorError(f"offline synthesizer: the expert's step {step_action.command!r} failed on "
                                 f"{task_id}: {step.observation}")
        thought = f"{step_action.thought} {step_action.explanation}".strip()
        if refusal is not None:
            thought = f"My last command was refused (\"{refusal}\"), so I correct it. {thought}"
        turns.append({"role": "player", "thought": thought, "action": step_action.command})
        turns.append(_dm(
            f"The command worked; the player holds {_held(env)}." + (" The goal is crafted." if step.done else ""),
            step.observation, done=step.done))
        refusal = None
        done_steps += 1
        if step.done:
            return turns
    raise GeneratorError(f"offline synthesizer: the expert did not finish {task_id} in {MAX_STEPS} steps")


def _rejected_mistake(env: Any, noisy: Any) -> tuple[Any, str, str] | None:
    """An expert mistake the env refuses: (action, kind, the env's refusal); the env is left as it was."""
    for _ in range(MISTAKE_DRAWS):
        state = env.snapshot()
        step = noisy.act(first_step=False)
        if step.mistake not in REJECTED_KINDS:
            continue
        result = env.step(step.action.command)
        env.restore(state)
        if not result.info.get("ok", True):
            return step.action, step.mistake, result.observation
    return None


def _problem(script: Any, command: str) -> str | None:
    from engine.datasets.refine import RefineConfig, _command_problem

    found = _command_problem(script.actions, command, RefineConfig())
    return None if found is None else found[1]


# ---------------------------------------------------------------- the Generator


class OfflineRefineGenerator:
    """A `Generator` named "offline" for the refine pipeline only (see the module docstring); other
    prompts are a GeneratorError, never a made-up answer."""

    name = OFFLINE_MODEL

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        return [[Completion(text=self.answer(r.prompt, r.params.seed or 0), n_tokens=0, finish_reason="stop")] * r.n
                for r in requests]

    def answer(self, prompt: Prompt, seed: int) -> str:
        head = prompt[0]["content"] if prompt else ""
        if head.startswith(_SCRIPT_HEAD):
            persona = re.search(r"^Persona: (.*)$", head, re.MULTILINE)
            script = make_script(persona.group(1) if persona else "", seed, corrections=2)
            return json.dumps(script, ensure_ascii=False)
        if head.startswith(_TRAJECTORY_HEAD):
            from engine.datasets.refine import extract_object

            data = extract_object(head)  # the script is the prompt's first JSON object
            return json.dumps(make_trajectory(data or {}, _corrections_asked(head)), ensure_ascii=False)
        raise GeneratorError("offline synthesizer: it answers only AgentRefine's script and trajectory prompts")

    def logprobs(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float | None]:
        return [None] * len(completions)
