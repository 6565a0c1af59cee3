"""Prompt templates and answer parsers for the three roles a model plays.

- actor (Agent Q, arXiv 2408.07199; docs/algorithms.md §1): system prompt + history of composite
  actions + current observation + task;
- critic (Agent Q; docs/algorithms.md §2.3): pick the single most promising of the remaining candidates;
- first-error judge (Agent-R, arXiv 2501.11425; docs/algorithms.md §4.1): reasons, then
  `Judgement: Good | Bad | Uncertain`.

These are the SAME prompts the tiny offline model is trained on and a real LLM receives, so the
templates are plain instructions any instruction-tuned model can follow. Parsers never raise:
a garbled answer yields None and the caller records its fallback.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from engine.actions import CompositeAction, render
from engine.llm.base import Prompt

ACTOR_SYSTEM = (
    "You are an agent that completes tasks in an environment, one command at a time.\n"
    "{env_description}\n"
    "Answer every step with ONE composite action in exactly this format:\n"
    "PLAN: (first step only) a numbered list of high-level steps for the whole task\n"
    "THOUGHT: your reasoning about the current state and what to do now\n"
    "ACTION: exactly one environment command\n"
    "EXPLANATION: what the action is meant to achieve\n"
    "STATUS: CONTINUE, SUCCESS, FAILURE or ASK_USER"
)

CRITIC_SYSTEM = (
    "You are a critic. An agent is working on a task and has proposed candidate actions for its "
    "next step. Judge which single candidate is most likely to lead to completing the task. "
    "Give brief reasons, then end with a line 'BEST: <number>'."
)

JUDGE_SYSTEM = (
    "You review an agent's trajectory one step at a time. Decide whether the current action, "
    "given what the agent knew, was a good step towards the task. Give brief reasons, then end "
    "with a line 'Judgement: Good', 'Judgement: Bad' or 'Judgement: Uncertain'."
)


@dataclass(frozen=True)
class HistoryStep:
    """One earlier step as the prompts show it: the action and what the env answered."""

    action: CompositeAction
    observation: str = ""


@lru_cache(maxsize=1024)
def _task_block(goal: str, context: str) -> str:
    """Cached: every prompt of a task repeats it (TextCraft's context, its recipes, is ~500 characters)."""
    block = f"TASK: {goal}"
    if context.strip():
        block += f"\n{context.strip()}"
    return block


def _history_block(history: Sequence[HistoryStep], with_observations: bool) -> str:
    if not history:
        return "HISTORY: none yet"
    lines = ["HISTORY:"]
    for i, step in enumerate(history, 1):
        lines.append(f"Step {i}:\n{render(step.action)}")
        if with_observations:
            lines.append(f"Observation {i}: {step.observation.strip()}")
    return "\n".join(lines)


@lru_cache(maxsize=256)
def _actor_system(env_description: str) -> str:
    return ACTOR_SYSTEM.format(env_description=env_description.strip())


def actor_prompt(
    env_description: str, goal: str, context: str, history: Sequence[HistoryStep], observation: str
) -> Prompt:
    """The agent input at step t (docs/algorithms.md §1): earlier composite actions as the inner monologue,
    the current observation only."""
    user = (
        f"{_task_block(goal, context)}\n\n{_history_block(history, with_observations=False)}\n\n"
        f"OBSERVATION: {observation.strip()}\n\n"
        f"Step {len(history) + 1}: give your composite action."
    )
    return [
        {"role": "system", "content": _actor_system(env_description)},
        {"role": "user", "content": user},
    ]


def critic_prompt(
    goal: str,
    context: str,
    history: Sequence[HistoryStep],
    observation: str,
    candidates: Sequence[CompositeAction],
) -> Prompt:
    """Ask for the single most promising of `candidates` (numbered from 1)."""
    listed = "\n".join(
        f"[{i}] ACTION: {c.command} | EXPLANATION: {c.explanation.strip() or '-'}"
        for i, c in enumerate(candidates, 1)
    )
    user = (
        f"{_task_block(goal, context)}\n\n{_history_block(history, with_observations=False)}\n\n"
        f"OBSERVATION: {observation.strip()}\n\nCANDIDATES:\n{listed}\n\n"
        f"Which candidate (1-{len(candidates)}) is most promising?"
    )
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}]


def judge_prompt(
    goal: str, context: str, log: Sequence[HistoryStep], action: CompositeAction, observation: str
) -> Prompt:
    """First-error detection: judge `action` (with its `observation`) after the steps in `log`."""
    user = (
        f"{_task_block(goal, context)}\n\n{_history_block(log, with_observations=True)}\n\n"
        f"CURRENT ACTION:\n{render(action)}\nOBSERVATION: {observation.strip()}\n\n"
        "Was the current action good?"
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def critic_answer(reason: str, best: int) -> str:
    """The canonical critic answer (used to train the tiny model; real models may vary)."""
    return f"REASON: {reason.strip()}\nBEST: {best}"


def judge_answer(reason: str, judgement: str) -> str:
    return f"REASON: {reason.strip()}\nJudgement: {judgement}"


# At most 6 digits: a longer number names no candidate, and int() refuses over 4300 digits (a
# ValueError that a hostile critic answer would turn into a crashed search).
_BEST = re.compile(r"BEST\s*[:=]?\s*\[?\s*(\d{1,6})(?!\d)", re.IGNORECASE)
_NUMBER = re.compile(r"\[?\b(\d{1,6})\b\]?")
_JUDGEMENT = re.compile(r"judg(?:e)?ment[\s*_]*[:=]?[\s*_]*(good|bad|uncertain)", re.IGNORECASE)


def parse_critic_choice(text: str, n_candidates: int) -> int | None:
    """0-based index of the chosen candidate, or None when the answer names no valid one.

    Prefers an explicit 'BEST: k' (the last one); else the last number in range in the text.
    """
    if not isinstance(text, str) or n_candidates < 1:
        return None
    for m in reversed(list(_BEST.finditer(text))):
        k = int(m.group(1))
        if 1 <= k <= n_candidates:
            return k - 1
    for m in reversed(list(_NUMBER.finditer(text[-2000:]))):
        k = int(m.group(1))
        if 1 <= k <= n_candidates:
            return k - 1
    return None


def parse_judgement(text: str) -> str | None:
    """'Good' | 'Bad' | 'Uncertain' from a judge answer (either spelling), or None."""
    if not isinstance(text, str):
        return None
    found = _JUDGEMENT.findall(text)
    return found[-1].capitalize() if found else None
