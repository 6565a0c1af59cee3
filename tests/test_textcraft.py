"""TextCraft env, recipe book and expert: the env is what search and training data stand on, so its
semantics (recipes, tags, batches, progress, determinism, snapshots) are pinned here."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.actions import parse, render
from engine.envs.base import Env, EnvError, SupportsSnapshot, TaskSpec
from engine.envs.check import check_env
from engine.envs.textcraft import MAX_DISTRACTORS, TextCraftEnv
from engine.envs.textcraft_expert import MISTAKE_KINDS, TextCraftExpert, plan, solve
from engine.envs.textcraft_recipes import readable, recipe_book, recipe_tree

ROOT = Path(__file__).resolve().parents[1]
ALL_SPLITS = ("train", "test")


def _fingerprint() -> str:
    """A digest of everything that must not depend on the process: task ids, goals, contexts, meta,
    and an expert episode with noise."""
    env = TextCraftEnv()
    rows = [[t.id, t.goal, t.context, t.meta] for s in ALL_SPLITS for t in env.tasks(s)]
    episode = [(e.action.command, e.mistake, st.observation) for e, st in solve(env, "test-7", noise=0.5)]
    return hashlib.sha256(json.dumps([rows, episode]).encode()).hexdigest()


# A fresh process with another PYTHONHASHSEED: times the first load and computes the fingerprint.
_PROBE = """
import json, time
start = time.perf_counter()
from engine.envs.textcraft_recipes import recipe_book
recipe_book()
load_s = time.perf_counter() - start
from tests.test_textcraft import _fingerprint
print(json.dumps({"load_s": load_s, "fingerprint": _fingerprint()}))
"""


@pytest.fixture(scope="module")
def env() -> TextCraftEnv:
    return TextCraftEnv()


@pytest.fixture(scope="module")
def probe() -> dict:
    environ = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _all_tasks(env: TextCraftEnv) -> list[TaskSpec]:
    return [t for s in ALL_SPLITS for t in env.tasks(s)]


def _task_for(env: TextCraftEnv, goal_item: str) -> str:
    return next(t.id for t in _all_tasks(env) if t.meta["goal_item"] == goal_item)


# -- recipe book -------------------------------------------------------------------------------------


def test_recipe_book_loads_fast_in_a_fresh_process(probe: dict) -> None:
    assert probe["load_s"] < 0.5, f"recipe book took {probe['load_s']:.3f} s to load"


def test_recipes_parse_shaped_shapeless_and_skip_non_crafting() -> None:
    book = recipe_book()
    (pickaxe,) = book.recipes["minecraft:stone_pickaxe"]
    assert {(i.key, i.count) for i in pickaxe.ingredients} == {
        ("minecraft:stick", 2),
        ("minecraft:stone_tool_materials", 3),
    }
    (planks,) = book.recipes["minecraft:oak_planks"]
    assert planks.line() == "craft 4 oak planks using 1 oak logs"
    # shapeless with a repeated ingredient: counted, not listed twice
    magenta = [
        r for r in book.recipes["minecraft:magenta_dye"] if r.name == "magenta_dye_from_blue_red_white_dye"
    ]
    assert magenta[0].line() == "craft 4 magenta dye using 1 blue dye, 2 red dye, 1 white dye"
    # smelting, stonecutting and special recipes are not crafting recipes: glass is only smelted
    assert "minecraft:glass" not in book.recipes and "minecraft:glass" in book.base
    names = {r.name for rs in book.recipes.values() for r in rs}
    assert "stone_brick_stairs_from_stone_stonecutting" not in names
    # 635 crafting files - 14 unpacking (block -> 9 items, 9 nuggets -> ingot) - 1 cycle (honey bottle)
    # - 1 duplicate (sugar.json = sugar_from_sugar_cane.json)
    assert len(names) == 619


def test_cycles_are_broken_so_materials_stay_base() -> None:
    book = recipe_book()
    for base in (
        "minecraft:iron_ingot",
        "minecraft:gold_ingot",
        "minecraft:diamond",
        "minecraft:honey_bottle",
    ):
        assert base in book.base and base not in book.recipes, base
    assert [r.line() for r in book.recipes["minecraft:iron_nugget"]] == [
        "craft 9 iron nugget using 1 iron ingot"
    ]
    assert [r.line() for r in book.recipes["minecraft:iron_block"]] == [
        "craft 1 iron block using 9 iron ingot"
    ]
    for item in book.recipes:  # every tree bottoms out in base items
        stack = [recipe_tree(item).root]
        while stack:
            node = stack.pop()
            assert node.recipe is not None or node.item in book.base, (item, node.item)
            stack.extend(node.children)


def test_tags_are_inferred_from_groups_and_logs() -> None:
    book = recipe_book()
    planks = book.tags["minecraft:planks"]
    assert {"minecraft:oak_planks", "minecraft:crimson_planks"} <= planks and "minecraft:planks" not in planks
    assert book.craftable("minecraft:planks") and "minecraft:planks" not in book.base
    # group "wooden_slab" names the tag "wooden_slabs"
    assert book.tags["minecraft:wooden_slabs"] >= {"minecraft:oak_slab", "minecraft:birch_slab"}
    # a tag with no craftable member is a base item that accepts itself and its vanilla members
    assert book.tags["minecraft:oak_logs"] == {
        "minecraft:oak_logs",
        "minecraft:oak_log",
        "minecraft:oak_wood",
        "minecraft:stripped_oak_log",
        "minecraft:stripped_oak_wood",
    }
    assert "minecraft:oak_logs" in book.base and not book.craftable("minecraft:oak_logs")
    # alternatives: a torch takes coal or charcoal
    (torch,) = book.recipes["minecraft:torch"]
    assert any({"minecraft:coal", "minecraft:charcoal"} <= i.accepted for i in torch.ingredients)


def test_readable_names_and_lookup() -> None:
    book = recipe_book()
    assert readable("minecraft:oak_planks") == "oak planks"
    for typed in ("oak planks", "Oak_Planks", "  OAK   planks ", "minecraft:oak_planks"):
        assert book.lookup(typed) == "minecraft:oak_planks", typed
    assert book.lookup("oak plank") is None


# -- tasks ---------------------------------------------------------------------------------------------


def test_tasks_are_sorted_split_and_well_formed(env: TextCraftEnv) -> None:
    book = recipe_book()
    train, test = env.tasks("train"), env.tasks("test")
    depths = {s: collections.Counter(t.meta["depth"] for t in env.tasks(s)) for s in ALL_SPLITS}
    summary = f"train {len(train)}, test {len(test)}, depths {depths}"
    assert len(train) == 437 and len(test) == 109, summary
    assert [t.id for t in train] == [f"train-{i}" for i in range(len(train))]
    assert [t.id for t in test] == [f"test-{i}" for i in range(len(test))]
    # interleaved back in (depth, name) order, every 5th goal is a test goal
    merged = []
    for i in range(len(train) + len(test)):
        merged.append(test[i // 5] if i % 5 == 4 else train[i - i // 5])
    keys = [(t.meta["depth"], readable(t.meta["goal_item"])) for t in merged]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    for t in train + test:
        assert 1 <= t.meta["depth"] <= 4 and t.meta["depth"] == book.depth[t.meta["goal_item"]]
        assert t.goal == f"craft 1 {readable(t.meta['goal_item'])}" and t.split in t.id
    assert env.tasks("test") == test and env.task("test-3") == test[3]


def test_context_lists_goal_recipes_and_at_most_ten_distractors(env: TextCraftEnv) -> None:
    lines_of_book = {r.line() for rs in recipe_book().recipes.values() for r in rs}
    counts = collections.Counter()
    for t in _all_tasks(env):
        header, *lines = t.context.splitlines()
        assert header == "Crafting commands:"
        tree_lines = {r.line() for r in recipe_tree(t.meta["goal_item"]).recipes}
        assert tree_lines <= set(lines), t.id
        distractors = set(lines) - tree_lines
        assert len(distractors) <= MAX_DISTRACTORS and len(lines) == len(set(lines)), t.id
        assert set(lines) <= lines_of_book, t.id  # every line is a real recipe, written as a command
        counts[len(distractors)] += 1
    assert counts[MAX_DISTRACTORS] > len(_all_tasks(env)) // 2, counts  # most tasks get the full ten


def test_task_ids_and_episodes_are_the_same_in_another_process(probe: dict) -> None:
    assert probe["fingerprint"] == _fingerprint()


def test_unknown_split_and_task_raise_env_error(env: TextCraftEnv) -> None:
    with pytest.raises(EnvError, match="split"):
        env.tasks("dev")
    with pytest.raises(EnvError, match="unknown TextCraft task id 'train-99999'.*train-0"):
        env.reset("train-99999")
    fresh = TextCraftEnv()
    with pytest.raises(EnvError, match="before reset"):
        fresh.snapshot()
    with pytest.raises(EnvError, match="reset"):
        TextCraftExpert(fresh).act()


def test_env_implements_the_protocols(env: TextCraftEnv) -> None:
    assert isinstance(env, Env) and isinstance(env, SupportsSnapshot)
    assert env.name == "textcraft"
    text = env.describe()
    for needle in ("get N ITEM", "craft N ITEM using N A, N B", "inventory", "base item", "crafted"):
        assert needle in text, needle


# -- commands ------------------------------------------------------------------------------------------


def test_stone_pickaxe_by_hand_with_tags_batches_and_progress(env: TextCraftEnv) -> None:
    task_id = _task_for(env, "minecraft:stone_pickaxe")
    assert env.reset(task_id).startswith("You are carrying nothing")
    assert env.step("inventory").observation == "Inventory: You are not carrying anything."
    assert env.step("  GET   1   Oak_Log. ").observation == "Got 1 oak log"
    # the oak logs tag accepts an oak log; one batch makes 4 whatever N <= 4 says
    step = env.step("craft 2 oak planks using 1 oak logs")
    assert step.observation == "Crafted 4 minecraft:oak_planks" and step.info["ok"]
    # the planks tag is resolved to the held oak planks
    step = env.step("craft 4 stick using 2 planks")
    # progress counts the goal itself as the last of 4 items: 1.0 only once the pickaxe is held
    assert step.observation == "Crafted 4 minecraft:stick" and step.progress == pytest.approx(1 / 4)
    assert env.step("get 3 cobblestone").progress == pytest.approx(2 / 4)  # member of stone tool materials
    step = env.step("craft 1 stone pickaxe using 2 stick, 3 cobblestone")
    assert (step.observation, step.reward, step.done, step.progress) == (
        "Crafted 1 minecraft:stone_pickaxe",
        1.0,
        True,
        1.0,
    )
    assert env.inventory == {"minecraft:oak_planks": 2, "minecraft:stick": 2, "minecraft:stone_pickaxe": 1}
    after = env.step("inventory")
    assert after.done and after.reward == 0.0 and "over" in after.observation


def test_multi_batch_crafting_needs_scaled_ingredients(env: TextCraftEnv) -> None:
    env.reset(_task_for(env, "minecraft:stone_pickaxe"))
    env.step("get 3 oak logs")
    wrong = env.step("craft 8 oak planks using 1 oak logs")
    assert not wrong.info["ok"] and "must be 2 (2 batches of 4 oak planks), not 1" in wrong.observation
    assert env.step("craft 8 oak planks using 2 oak logs").observation == "Crafted 8 minecraft:oak_planks"
    assert (
        env.step("craft 5 oak planks using 2 oak logs").observation
        == "Could not find enough items to craft minecraft:oak_planks: need 2 oak logs, have 1."
    )
    assert env.inventory == {"minecraft:oak_logs": 1, "minecraft:oak_planks": 8}


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("dance", "valid commands are 'get N item', 'craft N item using"),
        ("get stick", "say how many"),
        ("get 2 stick", "Could not find stick: stick is crafted, not gathered"),
        ("get 2 planks", "a group of craftable items"),
        ("get 1 unobtainium", "Could not find unobtainium: no item has that name"),
        ("get 1 sticks", "Did you mean: stick"),
        ("get 0 cobblestone", "at least 1"),
        ("craft stone pickaxe", "name the item, its count and every ingredient"),
        ("craft 1 stone pickaxe using 3 cobblestone", "missing 2 stick"),
        ("craft 1 stone pickaxe using 3 cobblestone, 2 stick, 1 dirt", "dirt is not an ingredient"),
        ("craft 1 stone pickaxe using 3 cobblestone, 2 stick", "Could not find enough items"),
        ("craft 1 stone pickaxe using three cobblestone, 2 stick", "Wrong item format: 'three cobblestone'"),
        ("craft 1 stone pickaxe using 3 cobbles, 2 stick", "Could not find cobbles"),
        ("craft 4 planks using 1 oak logs", "it is a group of items"),
        ("craft 1 cobblestone using 1 stone", "it is a base item; get it with 'get N cobblestone'"),
        ("craft 1 moon using 1 cheese", "Could not find moon"),
    ],
)
def test_invalid_commands_explain_what_is_wrong(env: TextCraftEnv, command: str, expected: str) -> None:
    env.reset(_task_for(env, "minecraft:stone_pickaxe"))
    env.step("get 1 oak log")
    before = dict(env.inventory)
    step = env.step(command)
    assert expected in step.observation, step.observation
    assert (step.reward, step.done, step.info["ok"]) == (0.0, False, False)
    assert env.inventory == before


def test_steps_are_fast(env: TextCraftEnv) -> None:
    commands = [e.action.command for e, _ in solve(env, "test-100")]
    commands = commands[:-1] + ["inventory", "get 2 stick", "craft 1 stick using 9 bamboo"]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.3:
        env.reset("test-100")
        for command in commands:
            env.step(command)
        n += len(commands)
    rate = n / (time.perf_counter() - start)
    assert rate > 20_000, f"{rate:.0f} steps/s"


# -- snapshots -----------------------------------------------------------------------------------------


def _random_commands(env: TextCraftEnv, task_id: str, rng: random.Random, n: int) -> list[str]:
    """Plausible commands for a task: its recipe lines (scaled), gets of their items, junk."""
    book = recipe_book()
    lines = env.task(task_id).context.splitlines()[1:]
    items = set()
    for line in lines:  # "craft 4 oak planks using 1 oak logs, 2 stick"
        made, using = line.removeprefix("craft ").split(" using ")
        items.update(part.split(" ", 1)[1] for part in [made, *using.split(", ")])
    items = sorted(items)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            out.append(rng.choice(lines))
        elif r < 0.75:
            item = rng.choice(items)
            out.append(
                f"get {rng.randint(1, 4)} {item}" if book.lookup(item) in book.base else f"get 1 {item}"
            )
        elif r < 0.9:
            out.append("inventory")
        else:
            out.append(rng.choice(["jump", "craft 1 stick", "get x oak log"]))
    return out


def _play(env: TextCraftEnv, commands: list[str]) -> list[tuple]:
    return [
        (s.observation, s.reward, s.done, s.progress, dict(env.inventory)) for s in map(env.step, commands)
    ]


def test_the_env_contract_holds_with_expert_and_random_commands(env: TextCraftEnv) -> None:
    """check_env: determinism, replay == snapshot, no aliasing, ... on expert episodes, then on 40
    sampled tasks of both splits with random plausible commands."""
    expert = check_env(TextCraftEnv(), commands=lambda t: [s.action.command for s, _ in solve(env, t.id)],
                       max_steps=40)
    assert {"step-after-done", "snapshot-not-aliased", "snapshot-equals-replay", "close"} <= set(expert)
    sample = random.Random(7).sample(_all_tasks(env), 40)
    check_env(TextCraftEnv(), commands=lambda t: _random_commands(env, t.id, random.Random(t.id), 30),
              task_ids=[t.id for t in sample], max_steps=30)


def test_a_snapshot_restores_into_any_instance(env: TextCraftEnv) -> None:
    rng = random.Random(7)
    for task in rng.sample(_all_tasks(env), 10):
        commands = _random_commands(env, task.id, rng, 30)
        cut = rng.randrange(len(commands))
        env.reset(task.id)
        _play(env, commands[:cut])
        state = env.snapshot()
        first = _play(env, commands[cut:])
        other = TextCraftEnv()  # like a replay from reset, in a fresh instance
        other.restore(state)
        assert _play(other, commands[cut:]) == first, task.id


def test_progress_is_latched(env: TextCraftEnv) -> None:
    env.reset(_task_for(env, "minecraft:stone_pickaxe"))
    env.step("get 1 oak logs")
    env.step("craft 4 oak planks using 1 oak logs")
    gained = env.step("craft 4 stick using 2 planks").progress
    assert gained == pytest.approx(1 / 4)
    # use the sticks up on something else: they are gone, the progress stays
    env.step("get 4 coal")
    assert env.step("craft 16 torch using 4 stick, 4 coal").info["ok"]
    assert "minecraft:stick" not in env.inventory
    assert env.step("inventory").progress == gained


# -- expert --------------------------------------------------------------------------------------------


def test_noiseless_expert_solves_every_task(env: TextCraftEnv) -> None:
    lengths = collections.Counter()
    for task in _all_tasks(env):
        trajectory = solve(env, task.id)
        steps = [s for _, s in trajectory]
        assert steps[-1].reward == 1.0 and steps[-1].done, task.id
        assert all(s.info["ok"] for s in steps) and all(s.reward == 0.0 for s in steps[:-1]), task.id
        progress = [s.progress for s in steps]
        assert progress == sorted(progress) and progress[-1] == 1.0, task.id
        assert all(p < 1.0 for p in progress[:-1]), task.id  # every ingredient held is not yet success
        assert len(steps) == len(plan(task.meta["goal_item"], {})) <= 10, task.id
        assert not any(e.is_mistake for e, _ in trajectory)
        lengths[len(steps)] += 1
    assert sum(lengths.values()) == 546, lengths


def test_expert_actions_are_composite_actions(env: TextCraftEnv) -> None:
    trajectory = solve(env, "test-50")
    first, *rest = (e.action for e, _ in trajectory)
    assert first.plan and first.plan.startswith("1. ") and first.plan.count("\n") == len(trajectory) - 1
    assert all(a.plan is None for a in rest)
    for action in (first, *rest):
        assert action.status == "CONTINUE" and action.thought and action.explanation
        assert parse(render(action)) == action


def test_noisy_expert_still_solves_every_task_and_labels_its_mistakes(env: TextCraftEnv) -> None:
    kinds = collections.Counter()
    for task in _all_tasks(env):
        clean = len(solve(env, task.id))
        trajectory = solve(env, task.id, noise=0.3, seed=1, max_steps=60)
        assert trajectory[-1][1].reward == 1.0, task.id
        mistakes = [(e, s) for e, s in trajectory if e.is_mistake]
        # a mistake wastes its step and nothing else: the expert re-plans from the current inventory
        assert len(trajectory) == clean + len(mistakes), task.id
        for e, s in trajectory:
            if not e.is_mistake:
                assert s.info["ok"], (task.id, e.action.command, s.observation)
        for e, s in mistakes:
            kinds[e.mistake] += 1
            assert s.info["ok"] == (e.mistake in ("get_distractor", "inventory")), (
                e.action.command,
                s.observation,
            )
    assert set(kinds) == set(MISTAKE_KINDS), kinds


def test_expert_recovers_from_another_policys_mess(env: TextCraftEnv) -> None:
    rng = random.Random(3)
    for task in rng.sample(_all_tasks(env), 120):
        env.reset(task.id)
        steps = _play(env, _random_commands(env, task.id, rng, 15))
        if steps[-1][2]:
            continue  # the random commands crafted the goal
        expert = TextCraftExpert(env)
        for i in range(30):
            step = env.step(expert.act(first_step=i == 0).action.command)
            assert step.info["ok"], (task.id, step.observation)
            if step.done:
                break
        assert step.reward == 1.0, task.id


def test_val_and_fit_carve_the_train_split_as_the_tiny_model_holds_out() -> None:
    from engine.envs.textcraft import VAL_EVERY
    from engine.llm.tiny_config import TinyConfig
    from engine.llm.tiny_data import validation_tasks

    env = TextCraftEnv()
    train, val, fit = env.tasks("train"), env.tasks("val"), env.tasks("fit")
    assert val == validation_tasks(TinyConfig().val_every) and TinyConfig().val_every == VAL_EVERY
    assert len(val) == 43 and {t.id for t in val} | {t.id for t in fit} == {t.id for t in train}
    assert not {t.id for t in val} & {t.id for t in fit} and all(t.split == "train" for t in val + fit)
    assert env.task(val[0].id) is val[0]
