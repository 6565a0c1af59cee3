"""AI process supervision (Agent Q, arXiv 2408.07199; docs/algorithms.md §2.3): a critic LLM ranks
sibling candidates iteratively.

The critic is asked for the single most promising of the remaining candidates; that one is removed
and the question repeats until a full ranking exists. Each question is one request that the MCTS
scheduler batches with every other tree's requests, so ranking is written as a coroutine that
yields requests and receives completions.
"""

from __future__ import annotations

from collections.abc import Generator as Coroutine
from collections.abc import Sequence
from dataclasses import dataclass

from engine.actions import CompositeAction
from engine.llm.base import Completion, SampleRequest, SamplingParams
from engine.prompts import HistoryStep, critic_prompt, parse_critic_choice

FALLBACK_NOTE = "[critic answer named no valid candidate: fell back to sampling order]"


def rank_to_score(rank: int, k: int, mapping: str = "linear") -> float:
    """Rank r (0 = best) of k ranked candidates -> Q^. linear: 1 - r/(k-1) (k=1: 1.0);
    reciprocal: 1/(r+1)."""
    if not 0 <= rank < max(k, 1):
        raise ValueError(f"rank {rank} out of range for {k} candidates")
    if mapping == "linear":
        return 1.0 if k <= 1 else 1.0 - rank / (k - 1)
    if mapping == "reciprocal":
        return 1.0 / (rank + 1)
    raise ValueError(f"unknown critic mapping {mapping!r} (linear | reciprocal)")


@dataclass(frozen=True)
class Ranking:
    """order[r] = index (into the candidates) of the rank-r candidate; reasons[i] = the critic
    text that placed candidate i."""

    order: tuple[int, ...]
    reasons: tuple[str, ...]
    fallbacks: int = 0  # answers that could not be read


def rank_candidates(
    goal: str,
    context: str,
    history: Sequence[HistoryStep],
    observation: str,
    candidates: Sequence[CompositeAction],
    params: SamplingParams,
) -> Coroutine[list[SampleRequest], list[list[Completion]], Ranking]:
    """Coroutine: yields one critic request per round (k-1 rounds), returns the full ranking."""
    remaining = list(range(len(candidates)))
    order: list[int] = []
    reasons = [""] * len(candidates)
    fallbacks = 0
    while len(remaining) > 1:
        prompt = critic_prompt(goal, context, history, observation, [candidates[i] for i in remaining])
        (answer,) = (yield [SampleRequest(prompt, 1, params)])[0]
        choice = parse_critic_choice(answer.text, len(remaining))
        text = answer.text.strip()
        if choice is None:
            fallbacks += 1
            choice = 0
            text = f"{text}\n{FALLBACK_NOTE}".strip()
        picked = remaining.pop(choice)
        order.append(picked)
        reasons[picked] = text
    if remaining:
        order.append(remaining[0])
        reasons[remaining[0]] = "(last remaining candidate)" if len(candidates) > 1 else "(only candidate)"
    return Ranking(tuple(order), tuple(reasons), fallbacks)
