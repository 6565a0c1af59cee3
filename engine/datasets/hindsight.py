"""Hindsight relabelling: the goals a search reached on its way, as demonstrations of those goals.

WHY: expert iteration distils only the trees whose own goal search reached (111 of 256 on the
embedded default, one- and two-craft goals almost all), yet a failed tree still crafts things: a
tree for a three-craft goal that never finishes may hold a two-craft intermediate that is itself a
training task's goal. Every such state is a success for THAT task (hindsight experience replay,
Andrychowicz et al. 2017, applied to the stored trees). Three steps make it a clean demonstration:

1. `reached_goals`: each tree is replayed in its env (snapshots, one step per node, rollouts too),
   and the first state on each path that achieves a target task (`env.achieves(task)`) gives that
   task the path's commands;
2. `shortest_solution`: the commands are replayed in the TARGET task, refused ones dropped, then
   each command dropped while the goal is still reached without it, and the last replay gives the
   target task's own observations; every command must be one the target's grammar allows;
3. `rationalize`: the texts around each command are the policy's own, asked greedily under the
   target's prompt with the ACTION forced to the command (a one-command grammar): STaR-style
   rationalisation, so the THOUGHT names the relabelled goal and no expert writes anything.

The search's actions are all that is kept of the tree; the env checks every relabelled success.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import regex

from engine.actions import FormatError, normalize_command, parse
from engine.config import ConfigError
from engine.datasets.samples import Sample, Task, TreeRef, Turn, stable_id, system_prompt
from engine.envs.base import SupportsHindsight, TaskSpec
from engine.grammar import ActionGrammar, literal
from engine.llm.base import Generator, SampleRequest, SamplingParams
from engine.prompts import HistoryStep, actor_prompt


@dataclass(frozen=True)
class HindsightConfig:
    """`per_goal`: demonstrations kept per relabelled task (shortest first); `max_tokens`: the
    rationalisation's completion limit (a text cut by it is dropped, not kept cut)."""

    per_goal: int = 1
    max_tokens: int = 160

    def __post_init__(self) -> None:
        for name in ("per_goal", "max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"HindsightConfig.{name}: must be >= 1, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Relabelled:
    """One relabelled success: the target task, its commands and the target env's observations."""

    task: TaskSpec
    first_observation: str  # the target task's reset observation
    steps: tuple[tuple[str, str], ...]  # (command, observation) in the target task
    source: dict[str, Any]


def _command(tree: Any, node_id: int) -> str | None:
    action = tree.nodes[node_id].action
    return None if action is None or tree.nodes[node_id].format_error else action.command


def reached_goals(ref: TreeRef, env: Any, targets: Sequence[TaskSpec]) -> list[tuple[TaskSpec, tuple[str, ...]]]:
    """(target, the commands of a path up to the first state achieving it) for every path of the tree
    (nodes, then each simulation's rollout beyond its node) where a target's goal was first reached."""
    if not isinstance(env, SupportsHindsight):
        raise ConfigError(f"env {type(env).__name__} cannot relabel goals (it has no achieves(task))")
    tree, found = ref.tree, list[tuple[TaskSpec, tuple[str, ...]]]()
    env = cast(Any, env)  # an Env with snapshots (engine/envs/base.py) that also achieves()
    env.reset(tree.task.id)

    def held() -> frozenset[str]:
        return frozenset(t.id for t in targets if env.achieves(t))

    states: dict[int, tuple[Any, frozenset[str], tuple[str, ...]]] = {0: (env.snapshot(), held(), ())}
    for node in tree.nodes[1:]:  # ids grow down the tree: a parent comes before its children
        if node.parent not in states:
            continue
        state, before, commands = states[node.parent]
        command = _command(tree, node.id)
        if command is None:
            continue
        env.restore(state)
        env.step(command)
        now, path = held(), (*commands, command)
        found += [(t, path) for t in targets if t.id in now - before]
        states[node.id] = (env.snapshot(), now, path)
    for sim in tree.simulations:
        if not sim.rollout or not sim.path or sim.path[-1] not in states:
            continue
        state, before, commands = states[sim.path[-1]]
        env.restore(state)
        for command in sim.rollout:
            env.step(command)
            now, commands = held(), (*commands, command)
            found += [(t, commands) for t in targets if t.id in now - before]
            before = before | now
    return found


def _accepted(env: Any, task: TaskSpec, commands: Sequence[str]) -> tuple[list[tuple[str, str]], bool]:
    """The (command, observation) steps `task` accepts of `commands` (refused ones left out), up to its
    end, and whether that end is success."""
    env.reset(task.id)
    steps = []
    for command in commands:
        step = env.step(command)
        if step.info.get("ok", True):
            steps.append((command, step.observation))
        if step.done:
            return steps, step.reward > 0
    return steps, False


def shortest_solution(env: Any, task: TaskSpec, commands: Sequence[str]) -> list[tuple[str, str]] | None:
    """`commands` cut to what `task` needs: refused commands dropped, then each command dropped (with
    any later one refused without it) while the task is still solved; the replayed steps, or None when
    the commands do not solve it or one is outside the task's grammar."""
    steps, solved = _accepted(env, task, commands)
    if not solved:
        return None
    i = 0
    while i < len(steps):
        kept = [c for c, _ in steps]
        trial, solved = _accepted(env, task, kept[:i] + kept[i + 1:])
        if solved:
            steps = trial
        else:
            i += 1
    pattern = getattr(env, "command_pattern", None)
    if callable(pattern):
        allowed = regex.compile(pattern(task))
        if any(allowed.fullmatch(c) is None for c, _ in steps):
            return None
    return steps


def relabel(refs: Sequence[TreeRef], make_env: Callable[[], Any], targets: Sequence[TaskSpec],
            config: HindsightConfig = HindsightConfig()) -> list[Relabelled]:
    """Every target some tree reached, with its `per_goal` shortest distinct solutions (ties by
    commands), in target order."""
    env = make_env()
    by_target: dict[str, dict[tuple[str, ...], Relabelled]] = {}
    try:
        for ref in refs:
            for task, commands in reached_goals(ref, env, targets):
                steps = shortest_solution(env, task, commands)
                if steps is None:
                    continue
                key = tuple(normalize_command(c) for c, _ in steps)
                solutions = by_target.setdefault(task.id, {})
                if key not in solutions:  # the first tree to reach it names the source
                    source = {"task_id": task.id, "from_task": ref.tree.task.id, "tree_id": ref.tree_id,
                              "searched": len(commands), "steps": len(steps), "own_goal": task.id == ref.tree.task.id}
                    solutions[key] = Relabelled(task, env.reset(task.id), tuple(steps), source)
    finally:
        if hasattr(env, "close"):
            env.close()
    out = []
    for task in targets:
        found = sorted(by_target.get(task.id, {}).values(), key=lambda r: (len(r.steps), [c for c, _ in r.steps]))
        out += found[: config.per_goal]
    return out


def rationalize(generator: Generator, found: Sequence[Relabelled], env_description: str,
                config: HindsightConfig = HindsightConfig(), kind: str = "hindsight",
                run_id: str | None = None) -> list[Sample]:
    """Each relabelled success as a trajectory whose texts the policy writes itself: at each step,
    greedily, under the target task's prompt with the earlier rationalised actions as history, the
    ACTION forced to the step's command. One batched call per step index; an episode whose text is
    cut by `max_tokens` or does not parse is dropped."""
    system = system_prompt(env_description)
    texts: list[list[str] | None] = [[] for _ in found]
    histories: list[list[HistoryStep]] = [[] for _ in found]
    for t in range(max((len(r.steps) for r in found), default=0)):
        live = [i for i, r in enumerate(found) if texts[i] is not None and t < len(r.steps)]
        requests = []
        for i in live:
            r = found[i]
            observation = r.steps[t - 1][1] if t else r.first_observation
            prompt = actor_prompt(env_description, r.task.goal, r.task.context, histories[i], observation)
            grammar = ActionGrammar(literal(r.steps[t][0]))
            requests.append(SampleRequest(prompt, 1, SamplingParams(temperature=0.0, max_tokens=config.max_tokens,
                                                                  grammar=grammar)))
        for i, completions in zip(live, generator.sample(requests), strict=True):
            text = completions[0].text if completions else ""
            parsed = parse(text)
            done = texts[i]
            if (done is None or isinstance(parsed, FormatError) or completions[0].finish_reason == "length"
                    or normalize_command(parsed.command) != normalize_command(found[i].steps[t][0])
                    or (t < len(found[i].steps) - 1 and parsed.status != "CONTINUE")):  # a step that ends the episode
                # before its last would teach stopping (search and evaluation end on any other STATUS)
                texts[i] = None
                continue
            done.append(text)
            histories[i].append(HistoryStep(parsed, found[i].steps[t][1]))
    out = []
    for r, done in zip(found, texts, strict=True):
        if done is None:
            continue
        turns = [Turn(text=text, observation=obs, loss=True, segment="good")
                 for text, (_, obs) in zip(done, r.steps, strict=True)]
        turns[-1] = Turn(text=turns[-1].text, observation=None, loss=True, segment="good")
        task = Task(id=r.task.id, goal=r.task.goal, context=r.task.context, first_observation=r.first_observation,
                    system=system)
        out.append(Sample(id=stable_id(kind, run_id, r.task.id, *(c for c, _ in r.steps)), kind=kind, task=task,
                          turns=tuple(turns), run_id=run_id,
                          source={**r.source, "target": "hindsight: a goal the search reached, relabelled"}))
    return out
