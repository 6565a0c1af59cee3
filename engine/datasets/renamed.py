"""Renamed copies of trajectories: the same episode in a world whose entity names are swapped.

WHY: SFT on search's wins shows the policy a few dozen tasks under their real names, and a small
policy learns those recipes by name instead of reading each task's crafting commands, which is what
carries to held-out tasks (measured on the tiny model: SFT on 60 wins barely fits them and does not
move held-out success). The tiny model itself was trained on expert episodes 80% renamed for that
reason (`engine.envs.textcraft_names`). Here each win also appears `copies` more times, each copy
with one consistent swap (`SupportsRenaming.renamer`) applied to the task, every observation and
every turn; the system message (the env's description) keeps its words. Deterministic per seed.
Measured on the tiny policy (docs/experiments.md 2026-12-06): +0.022 on a 181-task selection set, not
past its interval, and -0.009 on test, so the loop leaves it off by default.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from engine.config import ConfigError
from engine.datasets.samples import Sample, stable_id
from engine.envs.base import SupportsRenaming


def renamed_samples(samples: Sequence[Sample], env: object, copies: int, seed: int) -> list[Sample]:
    """`copies` renamed copies of each sample (in sample order, each copy after its original's others),
    one fresh swap per copy; ids derived from the original's id, `source.renamed_from` names it."""
    if copies < 0:
        raise ConfigError(f"renamed copies must be >= 0, got {copies}")
    if copies == 0:
        return []
    if not isinstance(env, SupportsRenaming):
        raise ConfigError(f"renamed copies need an env that can rename its entities; {type(env).__name__} cannot")
    out = []
    for sample in samples:
        for copy in range(copies):
            rename = env.renamer(random.Random(f"renamed/{seed}/{sample.id}/{copy}"))
            task = replace(sample.task, goal=rename(sample.task.goal), context=rename(sample.task.context),
                           first_observation=rename(sample.task.first_observation))
            turns = tuple(replace(t, text=rename(t.text),
                                  observation=None if t.observation is None else rename(t.observation))
                          for t in sample.turns)
            out.append(replace(sample, id=stable_id(sample.id, "renamed", seed, copy), task=task, turns=turns,
                               source={**sample.source, "renamed_from": sample.id, "copy": copy}))
    return out
