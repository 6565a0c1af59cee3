"""Renamed copies of trajectories (engine/datasets/renamed.py), on a real TextCraft win: train-267,
"craft 1 polished blackstone slab" = get 4 blackstone, craft 4 polished blackstone, craft the slab."""

from __future__ import annotations

import pytest

from engine.actions import CompositeAction, render
from engine.config import ConfigError
from engine.datasets.distill import episode_samples
from engine.datasets.renamed import renamed_samples
from engine.datasets.samples import Sample, to_step_rows
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_names import _name_pattern
from engine.evaluate import Episode

TASK = "train-267"
WIN = ["get 4 blackstone", "craft 4 polished blackstone using 4 blackstone",
       "craft 6 polished blackstone slab using 3 polished blackstone"]


def win() -> Sample:
    env = TextCraftEnv()
    first = env.reset(TASK)
    turns = []
    for c in WIN:
        thought = f"I need {c.split(' ', 2)[2]}."
        turns.append((render(CompositeAction(thought=thought, command=c)), env.step(c).observation))
    e = Episode(task_id=TASK, seed=0, success=True, steps=3, commands=WIN, turns=turns, first_observation=first)
    (sample,) = episode_samples([e], [env.task(TASK)], env.describe())
    return sample


def texts(s: Sample) -> list[str]:
    return [s.task.goal, s.task.context, s.task.first_observation] + [
        x for t in s.turns for x in (t.text, t.observation or "")]


def test_a_copy_is_the_same_episode_under_one_consistent_swap_of_item_names() -> None:
    original = win()
    (copy,) = renamed_samples([original], TextCraftEnv(), 1, seed=0)
    names = _name_pattern()
    # everything but the item names is unchanged, text by text
    assert [names.sub("<item>", t) for t in texts(copy)] == [names.sub("<item>", t) for t in texts(original)]
    old = [m.group(0).lower() for t in texts(original) for m in names.finditer(t)]
    new = [m.group(0).lower() for t in texts(copy) for m in names.finditer(t)]
    assert len(old) == len(new) and len(old) > 20
    forward, backward = dict(zip(old, new, strict=True)), dict(zip(new, old, strict=True))
    assert all(forward[o] == n and backward[n] == o for o, n in zip(old, new, strict=True))  # a bijection
    assert "polished blackstone slab" in old and forward["polished blackstone slab"] != "polished blackstone slab"
    assert sum(forward[o] != o for o in set(old)) >= len(set(old)) - 1
    # the goal's item is the last command's product, in the copy as in the original
    assert copy.task.goal.endswith(forward["polished blackstone slab"])
    assert copy.task.system == original.task.system  # the env's description keeps its words
    assert [t.loss for t in copy.turns] == [t.loss for t in original.turns]
    assert copy.turns[-1].observation is None


def test_copies_are_deterministic_distinct_and_name_their_original() -> None:
    original = win()
    a = renamed_samples([original], TextCraftEnv(), 3, seed=0)
    assert a == renamed_samples([original], TextCraftEnv(), 3, seed=0)
    assert len({s.id for s in a} | {original.id}) == 4
    assert len({s.task.goal for s in a}) == 3  # each copy its own swap
    assert all(s.source["renamed_from"] == original.id and s.kind == original.kind for s in a)
    assert [s.source["copy"] for s in a] == [0, 1, 2]
    assert renamed_samples([original], TextCraftEnv(), 1, seed=1)[0].task.goal != a[0].task.goal
    rows = [r for s in a for r in to_step_rows(s)]
    assert len(rows) == 9 and all(r["completion"] for r in rows)


def test_zero_copies_none_and_envs_that_cannot_rename_are_refused() -> None:
    assert renamed_samples([win()], object(), 0, seed=0) == []
    with pytest.raises(ConfigError, match="cannot"):
        renamed_samples([win()], object(), 1, seed=0)
    with pytest.raises(ConfigError, match=">= 0"):
        renamed_samples([win()], TextCraftEnv(), -1, seed=0)
