"""Training rows for the tiny model: noisy-expert TextCraft episodes in the real prompts.

Three kinds of rows, all from TRAIN-split tasks only (the test split is held out for evaluation):
- actor: `actor_prompt(...)` at each step -> the expert's composite action. Deliberate mistakes are
  never targets, but they stay in the history of later steps, so the model learns to recover;
- critic: `critic_prompt(...)` with the expert's action shuffled among 1-3 mistakes -> which is best;
- judge: `judge_prompt(...)` on a step -> `Judgement: Bad` for a deliberate mistake, else `Good`.

Most episodes are shown with their item names consistently swapped for other item names (the
same swap in the task, crafting commands, history, observations and answers). A small model would
otherwise memorise the ~440 training recipes and fail on every held-out goal; with the names
shuffled, the only way to predict the next command is to read it from the task's crafting commands,
which is what transfers to new tasks.

Answers keep the expert's STATUS (always CONTINUE: the env ends the episode when the goal is held).
Labelling the final craft SUCCESS was tried: the weak model then also says SUCCESS after a craft that
FAILS, which ends its episode where it could have read the error and retried.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.actions import CompositeAction, render
from engine.envs.base import TaskSpec
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import ExpertStep, TextCraftExpert
from engine.envs.textcraft_names import item_names, renamer
from engine.llm.base import Prompt
from engine.prompts import (
    HistoryStep,
    actor_prompt,
    critic_answer,
    critic_prompt,
    judge_answer,
    judge_prompt,
)

if TYPE_CHECKING:
    from engine.llm.tiny_config import TinyConfig

MAX_EPISODE_STEPS = 30
# Why each kind of deliberate mistake is wrong, in the words of the critic and judge answers.
WHY_WRONG = {
    "get_craftable": "it tries to get an item that has a recipe and must be crafted",
    "get_distractor": "it fetches an item the goal does not need",
    "wrong_count": "its ingredient counts do not match the recipe",
    "wrong_ingredient": "it names an ingredient that is not in the recipe",
    "inventory": "checking the inventory makes no progress",
}


@dataclass(frozen=True)
class Row:
    """One supervised example: the prompt a model sees and the answer it should give."""

    prompt: Prompt
    answer: str
    kind: str  # "actor" | "critic" | "judge"
    task_id: str


def validation_tasks(every: int) -> list[TaskSpec]:
    """Train tasks held out of the rows when `TinyConfig.val_every` is `every` (every `every`-th train
    task, from the last of each block): recipes and builds are compared on these, never on test."""
    if every <= 0:
        return []
    return [t for i, t in enumerate(TextCraftEnv().tasks("train")) if i % every == every - 1]


def fit_tasks(cfg: TinyConfig) -> list[TaskSpec]:
    """The train tasks `cfg` learns from: all but its validation tasks, the first `cfg.max_tasks`."""
    held_out = {t.id for t in validation_tasks(cfg.val_every)}
    return [t for t in TextCraftEnv().tasks("train") if t.id not in held_out][: cfg.max_tasks]


def build_rows(cfg: TinyConfig, tasks: Sequence[TaskSpec] | None = None) -> list[Row]:
    """All rows for `cfg`, deterministic given `cfg.seed`; with `tasks`, the rows the same recipe makes for
    those goals instead of its own (an oracle: the expert's episodes of goals the build left out)."""
    env = TextCraftEnv()
    tasks = fit_tasks(cfg) if tasks is None else tasks
    rng = random.Random(f"tiny-data/{cfg.seed}")
    rows: list[Row] = []
    names = item_names()
    for episode in range(cfg.episodes_per_task):
        for task in tasks:
            episode_rows = _episode_rows(env, task, cfg, rng, f"{task.id}/{cfg.seed}/{episode}")
            if rng.random() < cfg.rename_fraction:
                rename = renamer(rng, names)
                episode_rows = [rename_row(row, rename) for row in episode_rows]
            rows.extend(episode_rows)
    return rows


def rename_row(row: Row, rename: Callable[[str], str]) -> Row:
    """The row with item names swapped everywhere but in the (constant) system message."""
    prompt = [m if m["role"] == "system" else {**m, "content": rename(m["content"])} for m in row.prompt]
    return replace(row, prompt=prompt, answer=rename(row.answer))


def _episode_rows(
    env: TextCraftEnv, task: TaskSpec, cfg: TinyConfig, rng: random.Random, seed: str
) -> list[Row]:
    description = env.describe()
    observation = env.reset(task.id)
    style = {"compact": cfg.compact, "chain": cfg.chain}
    noisy = TextCraftExpert(env, cfg.noise, seed, **style)
    clean = TextCraftExpert(env, 0.0, seed, **style)
    mistaker = TextCraftExpert(env, 1.0, f"{seed}/mistakes", **style)
    history: list[HistoryStep] = []
    rows: list[Row] = []
    for t in range(MAX_EPISODE_STEPS):
        first = t == 0
        step = noisy.act(first_step=first)
        correct = step if not step.is_mistake else clean.act(first_step=first)
        result = env.step(step.action.command)
        if not step.is_mistake:
            prompt = actor_prompt(description, task.goal, task.context, history, observation)
            rows.append(Row(prompt, render(step.action), "actor", task.id))
        if rng.random() < cfg.critic_fraction:
            rows.extend(_critic_row(task, history, observation, correct, mistaker, rng, first))
        if rng.random() < cfg.judge_fraction:
            rows.append(_judge_row(task, history, step, result.observation))
        history.append(HistoryStep(step.action, result.observation))
        observation = result.observation
        if result.done:
            break
    return rows


def _critic_row(
    task: TaskSpec,
    history: list[HistoryStep],
    observation: str,
    correct: ExpertStep,
    mistaker: TextCraftExpert,
    rng: random.Random,
    first: bool,
) -> list[Row]:
    """The correct action among 1-3 distinct mistakes (none when no mistake applies here)."""
    wrong: dict[str, ExpertStep] = {}
    want = rng.randint(1, 3)
    for _ in range(4 * want):
        candidate = mistaker.act(first_step=first)
        command = candidate.action.command
        if candidate.is_mistake and command != correct.action.command and command not in wrong:
            wrong[command] = candidate
            if len(wrong) == want:
                break
    if not wrong:
        return []
    options: list[tuple[CompositeAction, str]] = [(correct.action, "")]
    options += [(m.action, m.mistake) for m in wrong.values()]
    rng.shuffle(options)
    best = next(i for i, (_, kind) in enumerate(options, 1) if not kind)
    reasons = [
        f"{i} is wrong: {WHY_WRONG.get(kind, 'it does not advance the plan')}"
        for i, (_, kind) in enumerate(options, 1)
        if kind
    ]
    reason = f"{best} is the next step of the recipe plan. " + "; ".join(reasons) + "."
    prompt = critic_prompt(task.goal, task.context, history, observation, [a for a, _ in options])
    return [Row(prompt, critic_answer(reason, best), "critic", task.id)]


def _judge_row(task: TaskSpec, history: list[HistoryStep], step: ExpertStep, observation: str) -> Row:
    if step.is_mistake:
        reason = f"The step is a mistake: {WHY_WRONG.get(step.mistake, 'it does not advance the plan')}."
        verdict = "Bad"
    else:
        reason = "The step follows the recipe plan and brings the goal closer."
        verdict = "Good"
    prompt = judge_prompt(task.goal, task.context, history, step.action, observation)
    return Row(prompt, judge_answer(reason, verdict), "judge", task.id)
