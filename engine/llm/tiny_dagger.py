"""DAgger rounds for the tiny policy: the model's own states, labelled by the expert.

WHY: behaviour cloning trains only on states the expert visits, so the cloned model, once it makes
a mistake the expert never makes (crafting before an intermediate is held, the wrong count), lands
in a state it has never seen and repeats the failing command until the step limit (measured: 39 of
43 validation episodes of the 4000-step build end that way). The TextCraft expert re-plans from the
env's CURRENT inventory, so it can label any state: DAgger (Ross et al., 2011) rolls the current
model out on the train tasks, labels every state from its first departure from the expert on with
the expert's next composite action, adds those rows to the data and trains on. Train tasks only
(`tiny_data.fit_tasks`: the validation tasks are held out here too), deterministic per
config: greedy rounds replay exactly, sampled ones are seeded.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.actions import FormatError, parse, render
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import TextCraftExpert
from engine.envs.textcraft_names import item_names, renamer
from engine.grammar import grammar_for
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.tiny_data import Row, fit_tasks, rename_row
from engine.prompts import HistoryStep, actor_prompt

if TYPE_CHECKING:
    from engine.llm.base import Generator
    from engine.llm.tiny_config import TinyConfig


def dagger_rows(generator: Generator, cfg: TinyConfig, round_index: int,
                log: Callable[[str], None] = print) -> list[Row]:
    """Actor rows from one rollout of `generator` on every train task (see the module docstring)."""
    tasks = fit_tasks(cfg)
    rng = random.Random(f"tiny-dagger/{cfg.seed}/{round_index}")
    envs = {t.id: TextCraftEnv() for t in tasks}
    specs = {t.id: t for t in tasks}
    obs = {tid: env.reset(tid) for tid, env in envs.items()}
    history: dict[str, list[HistoryStep]] = {tid: [] for tid in envs}
    departed = dict.fromkeys(envs, False)
    rows: dict[str, list[Row]] = {tid: [] for tid in envs}
    description = TextCraftEnv().describe()
    active = list(envs)
    for t in range(cfg.dagger_max_steps):
        if not active:
            break
        requests, labels = [], []
        for tid in active:
            env, task = envs[tid], specs[tid]
            expert = TextCraftExpert(env, 0.0, 0, compact=cfg.compact, chain=cfg.chain)
            labels.append(expert.act(first_step=t == 0).action)
            grammar = grammar_for(env, task) if cfg.dagger_constrained else None
            params = SamplingParams(temperature=cfg.dagger_temperature, max_tokens=cfg.dagger_max_tokens,
                                    seed=rng.randrange(2**31), grammar=grammar)
            prompt = actor_prompt(description, task.goal, task.context, history[tid], obs[tid])
            requests.append(SampleRequest(prompt, n=1, params=params))
        still = []
        for tid, label, request, (completion,) in zip(
            active, labels, requests, generator.sample(requests), strict=True
        ):
            action = parse(completion.text)
            wrong = isinstance(action, FormatError) or action.command != label.command
            departed[tid] = departed[tid] or wrong
            if departed[tid]:
                rows[tid].append(Row(request.prompt, render(label), "actor", tid))
            if isinstance(action, FormatError):
                continue
            step = envs[tid].step(action.command)
            history[tid].append(HistoryStep(action, step.observation))
            obs[tid] = step.observation
            if not step.done and action.status == "CONTINUE":
                still.append(tid)
        active = still
    names = item_names()
    out: list[Row] = []
    for tid in envs:  # the same consistent renaming as the expert episodes (tiny_data.build_rows)
        episode = rows[tid]
        if episode and rng.random() < cfg.rename_fraction:
            rename = renamer(rng, names)
            episode = [rename_row(row, rename) for row in episode]
        out.extend(episode)
    solved = sum(envs[tid].inventory.get(specs[tid].meta["goal_item"], 0) > 0 for tid in envs)
    log(f"tiny model: DAgger round {round_index + 1}: {sum(departed.values())}/{len(envs)} rollouts left "
        f"the expert's path, {len(out)} relabelled states; {solved} goals held")
    return out
