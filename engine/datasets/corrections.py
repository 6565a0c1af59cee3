"""Search-labelled corrections: the policy's own failing states, labelled with a step of a win search found.

WHY: expert iteration (distill.py) trains on the successful trajectories search found, so the policy
sees only the states of a win. Greedy decoding then drifts off them (crafts the goal before its
intermediate, repeats the refused command) into states no training row shows, and loops there. The
tiny policy's largest measured gain came from DAgger: rows at the states the policy itself reaches,
labelled by an expert. Here the expert is search, checked by the env, with no expert planner:

- for a task, the wins are the successful episodes search played (sampled episodes, MCTS at
  inference); the failure is the policy's own failed episode of the same task;
- at each state the failure passes through, the env (restored to that state) replays every suffix of
  every win; the shortest suffix that still wins is the state's distance to a win and its first
  command's turn the label (verified, not judged: nothing here asks a model);
- a failing step is one the env refused (the state did not change: a craft without its ingredients,
  repeated), one after which no suffix wins, or one that brings no win closer and is no command of
  the remaining win (a distractor, an extra fetch); the row is the failure's own prompt before that step
  (its history, as the policy saw it) and the win's turn as the target. The first `per_episode`
  failing steps of each episode are kept: a looping episode would otherwise give the same
  correction a dozen times.

Needs an env that can snapshot and restore (TextCraft, the repeat env); replaying a suffix costs env
steps only (microseconds in TextCraft), so a few hundred tasks take seconds.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.actions import FormatError, parse
from engine.config import ConfigError
from engine.datasets.samples import Sample, Task, Turn, stable_id, system_prompt


@dataclass(frozen=True)
class CorrectionConfig:
    """`per_episode`: failing steps corrected per failed episode (the first ones); `success_threshold`:
    the reward that counts as a win (the evaluation's)."""

    per_episode: int = 3
    success_threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.per_episode < 1:
            raise ConfigError(f"CorrectionConfig.per_episode: must be >= 1, got {self.per_episode!r}")


@dataclass(frozen=True)
class Win:
    """One successful episode: its commands and the turn text that issued each."""

    commands: tuple[str, ...]
    texts: tuple[str, ...]


def _commands(turns: Sequence[tuple[str, str]]) -> list[tuple[int, str | None]]:
    """(turn index, command or None for a format error) of each turn."""
    out = []
    for i, (text, _) in enumerate(turns):
        parsed = parse(text)
        out.append((i, None if isinstance(parsed, FormatError) else parsed.command))
    return out


def same_state(env: Any) -> Callable[[Any, Any], bool]:
    """How two of `env`'s snapshots are compared: its own `same_state` where it has one (an env whose
    snapshots are objects without equality, or hold a step counter), else ==."""
    same = getattr(env, "same_state", None)
    return same if callable(same) else operator.eq


def refused_turns(env: Any, e: Any) -> set[int]:
    """Indices of the turns of episode `e` (from the task start) that did not move the env: refused
    commands (the state the same after the step, as `_fails` reads it) and format errors. Found by
    replaying the episode's commands in `env` (one that can snapshot)."""
    same = same_state(env)
    env.reset(e.task_id)
    state = env.snapshot()
    out: set[int] = set()
    for i, command in _commands(e.turns):
        if command is None:
            out.add(i)
            continue
        step = env.step(command)
        after = env.snapshot()
        if same(after, state):
            out.add(i)
        state = after
        if step.done:
            break
    return out


def wins_of(episodes: Sequence[Any]) -> dict[str, list[Win]]:
    """The distinct successful episodes of each task as Wins (format-error turns dropped: the env never
    saw them), shortest first."""
    out: dict[str, list[Win]] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for e in sorted(episodes, key=lambda e: (len(e.turns), e.seed)):
        if not e.success or not e.turns or e.prefix_steps:
            continue
        steps = [(e.turns[i][0], c) for i, c in _commands(e.turns) if c is not None]
        win = Win(tuple(c for _, c in steps), tuple(t for t, _ in steps))
        if (e.task_id, win.commands) not in seen:
            seen.add((e.task_id, win.commands))
            out.setdefault(e.task_id, []).append(win)
    return out


def distance(env: Any, state: Any, wins: Sequence[Win], threshold: float) -> tuple[int, Win, int] | None:
    """(commands left, the win, the index of its first command left) of the shortest suffix of any win
    that wins from `state`; None when none does. Ties: the earlier win (shortest first)."""
    best: tuple[int, Win, int] | None = None
    for win in wins:
        n = len(win.commands)
        for i in range(n - 1, -1, -1):  # shortest suffix first
            if best is not None and n - i >= best[0]:
                break
            env.restore(state)
            if _replays_to_win(env, win.commands[i:], threshold):
                best = (n - i, win, i)
                break
    return best


def _replays_to_win(env: Any, commands: Sequence[str], threshold: float) -> bool:
    for command in commands:
        step = env.step(command)
        if step.reward >= threshold:
            return True
        if step.done:
            return False
    return False


def _fails(command: str, unmoved: bool, here: tuple[int, Win, int], there: tuple[int, Win, int] | None) -> bool:
    """Is a step from a state `here` away from a win (to one `there` away) a failing step? It is when
    the env refused it (the state did not change), when no win is reachable after it, or when it
    brought no win closer and is no command of the remaining win (a distractor, an extra fetch); a
    command of the remaining win taken in another order is not."""
    if there is None or unmoved:
        return True
    _, win, i = here
    return there[0] >= here[0] and command not in win.commands[i:]


def correction_samples(failed: Sequence[Any], successes: Sequence[Any], tasks: Sequence[Any],
                       make_env: Callable[[], Any], env_description: str,
                       config: CorrectionConfig = CorrectionConfig(), kind: str = "correction",
                       run_id: str | None = None) -> list[Sample]:
    """Correction rows for each failed episode (`failed`: Episodes with turns and first_observation,
    from the task start) whose task has a win among `successes`. Each row is the failure's turns up to
    a failing step (untrained context) and the winning turn that the env verified from there (trained)."""
    by_id = {t.id: t for t in tasks}
    wins = wins_of(successes)
    system = system_prompt(env_description)
    env = make_env()
    if not (hasattr(env, "snapshot") and hasattr(env, "restore")):
        raise ConfigError(f"{type(env).__name__}: corrections need an env that can snapshot and restore")
    out: list[Sample] = []
    try:
        for e in failed:
            if e.success or not e.turns or e.prefix_steps or e.task_id not in wins or e.task_id not in by_id:
                continue
            spec = by_id[e.task_id]
            task = Task(id=spec.id, goal=spec.goal, context=spec.context, first_observation=e.first_observation,
                        system=system)
            out.extend(_episode_corrections(env, e, task, wins[e.task_id], config, kind, run_id))
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    return out


def _episode_corrections(env: Any, e: Any, task: Task, wins: Sequence[Win], config: CorrectionConfig,
                         kind: str, run_id: str | None) -> list[Sample]:
    same = same_state(env)
    env.reset(e.task_id)
    state = env.snapshot()
    here = distance(env, state, wins, config.success_threshold)
    rows: list[Sample] = []
    for j, command in _commands(e.turns):
        if command is None:  # a format error: the env did not move
            continue
        env.restore(state)
        step = env.step(command)
        after = env.snapshot()
        if step.reward >= config.success_threshold:
            break
        there = None if step.done else distance(env, after, wins, config.success_threshold)
        if here is not None and command != here[1].commands[here[2]] and _fails(command, same(after, state), here,
                                                                                 there):
            left, win, i = here
            context = [Turn(text=text, observation=obs, loss=False, segment="prefix") for text, obs in e.turns[:j]]
            rows.append(Sample(
                id=stable_id(kind, run_id, e.task_id, e.seed, j, *win.commands),
                kind=kind, task=task, turns=(*context, Turn(text=win.texts[i], observation=None, segment="good")),
                run_id=run_id,
                source={"task_id": e.task_id, "seed": e.seed, "step": j, "failed_command": command,
                        "label_command": win.commands[i], "distance": left,
                        "target": "a verified win's step at the policy's failing state"}))
            if len(rows) >= config.per_episode:
                break
        if step.done:
            break
        state, here = after, there
    return rows
