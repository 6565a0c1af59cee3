"""`check_env`: test an env against the contract search relies on (engine/envs/base.py).

Modelled on Gymnasium's `gymnasium.utils.env_checker.check_env`: it drives a freshly made env through
reset/step/snapshot/restore/close with a small budget and raises `EnvCheckError` naming the first
broken rule. Search stands on these rules: it restores a node's state by snapshot or by replaying the
commands from reset, so a reset that is not deterministic, a replay that differs, or a snapshot that
changes later silently builds trees whose nodes do not match their observations.

    from engine.envs.check import check_env
    check_env(MyEnv())                          # commands from env.expert(task_id) if it has one
    check_env(MyEnv(), commands=["look", "go north", "take key"])
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

from engine.envs.base import EnvError, Step, SupportsSnapshot, SupportsValidCommands, TaskSpec

# rule -> what it requires (one line each; README's "Registering your own env" points here)
RULES = {
    "describe": "describe() returns a non-empty str and env.name is a non-empty str",
    "step-before-reset": "step() on a fresh env (before any reset) raises EnvError",
    "tasks-non-empty": "tasks('train') is a non-empty list of TaskSpec; other splits are lists of TaskSpec",
    "task-ids-unique": "task ids are unique within each split",
    "task-round-trip": "task(t.id) == t for the tasks of tasks(split)",
    "unknown-task": "task() and reset() with an unknown task id raise EnvError",
    "reset-deterministic": "reset(id) returns the same first observation every time, also after other tasks",
    "step-returns-step": "step() returns a Step (str observation, bool done, dict info) and does not raise "
                         "on a command it does not understand",
    "reward-in-range": "Step.reward is a finite number in [0, 1]",
    "progress-in-range": "Step.progress is None or a finite number in [0, 1]",
    "progress-latched": "Step.progress never decreases within an episode",
    "step-after-done": "a step after done=True returns done=True and reward 0 (the reward is paid once)",
    "replay-deterministic": "the same commands from reset give the same observations, rewards, done and "
                            "progress, also after other tasks",
    "snapshot-not-aliased": "a snapshot does not change when the env steps on (it is a copy, not a view)",
    "snapshot-equals-replay": "restore(snapshot) followed by the remaining commands gives what the replay "
                              "gives, also after the env stepped on and was reset to another task",
    "close": "close() exists, works, and may be called twice",
}

UNKNOWN_TASK = "orchard-check-no-such-task"
UNKNOWN_COMMAND = "xyzzy orchard-check-unknown-command"

Commands = Sequence[str] | Callable[[TaskSpec], Sequence[str]]


class EnvCheckError(AssertionError):
    """An env breaks rule `rule` (a key of RULES); the message names the env, the rule and what happened."""

    def __init__(self, env_name: str, rule: str, detail: str) -> None:
        super().__init__(f"env {env_name!r} breaks rule '{rule}' ({RULES[rule]}): {detail}")
        self.rule = rule


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _outcome(step: Step) -> tuple[str, float, bool, float | None]:
    """What a replay must reproduce (info may hold screenshots or timings, so it is not compared)."""
    return (step.observation, step.reward, step.done, step.progress)


def _diff(a: list[tuple], b: list[tuple], offset: int = 0) -> str:
    """Where two played outcomes first differ (steps counted from reset)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False), start=offset):
        if x != y:
            field = next(n for n, p, q in zip(("observation", "reward", "done", "progress"), x, y, strict=True)
                         if p != q)
            k = ("observation", "reward", "done", "progress").index(field)
            return f"step {i + 1} {field}: {_short(x[k])} vs {_short(y[k])}"
    return f"{len(a)} vs {len(b)} steps"


class _Checker:
    def __init__(self, env: Any, commands: Commands | None, max_tasks: int, max_steps: int,
                 splits: Sequence[str], task_ids: Sequence[str]) -> None:
        self.env = env
        self.name = str(getattr(env, "name", type(env).__name__))
        self.commands = commands
        self.max_tasks, self.max_steps, self.splits, self.task_ids = max_tasks, max_steps, splits, task_ids
        self.checked: list[str] = []
        self.first: dict[str, str] = {}  # task id -> its first observation

    def fail(self, rule: str, detail: str) -> EnvCheckError:
        return EnvCheckError(self.name, rule, detail)

    def passed(self, rule: str) -> None:
        if rule not in self.checked:
            self.checked.append(rule)

    @contextmanager
    def rule(self, rule: str, doing: str = ""):
        """Run one rule's checks: an unexpected exception from the env breaks that rule too."""
        try:
            yield
        except EnvCheckError:
            raise
        except Exception as e:
            raise self.fail(rule, f"{doing or 'the env'} raised {type(e).__name__}: {_short(str(e), 200)}") from e
        self.passed(rule)

    # -- the rules -------------------------------------------------------------------------------------

    def run(self, close: bool) -> list[str]:
        env = self.env
        with self.rule("describe", "describe()"):
            text = env.describe()
            if not isinstance(text, str) or not text.strip():
                raise self.fail("describe", f"describe() returned {_short(text)}")
            if not isinstance(getattr(env, "name", None), str) or not env.name:
                raise self.fail("describe", f"env.name is {_short(getattr(env, 'name', None))}")
        self.step_before_reset()
        tasks = self.task_catalogue()
        self.unknown_task()
        chosen = [self.env.task(i) for i in self.task_ids] if self.task_ids else tasks[: self.max_tasks]
        self.reset_determinism(chosen)
        plays = {t.id: self.episode(t) for t in chosen}
        self.replay(chosen, plays)
        if isinstance(env, SupportsSnapshot):
            for t in chosen:
                self.snapshots(t, plays[t.id], chosen)
        if close:
            self.close()
        return list(self.checked)

    def step_before_reset(self) -> None:
        try:
            self.env.step("look")
        except EnvError:
            self.passed("step-before-reset")
            return
        except Exception as e:
            raise self.fail("step-before-reset", f"step() before reset() raised {type(e).__name__}, not EnvError "
                                                 "(pass a freshly made env to check_env)") from e
        raise self.fail("step-before-reset", "step() before reset() did not raise (pass a freshly made env)")

    def task_catalogue(self) -> list[TaskSpec]:
        train: list[TaskSpec] = []
        for split in self.splits:
            with self.rule("tasks-non-empty", f"tasks({split!r})"):
                try:
                    tasks = self.env.tasks(split)
                except EnvError:
                    if split == "train":
                        raise
                    continue  # the env has no such split
                if not isinstance(tasks, list) or not all(isinstance(t, TaskSpec) for t in tasks):
                    raise self.fail("tasks-non-empty", f"tasks({split!r}) returned {_short(tasks)}")
                if split == "train":
                    if not tasks:
                        raise self.fail("tasks-non-empty", "tasks('train') is empty")
                    train = tasks
            with self.rule("task-ids-unique"):
                ids = [t.id for t in tasks]
                dups = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
                if dups:
                    raise self.fail("task-ids-unique", f"split {split!r} repeats ids {_short(dups)}")
            sample = tasks[: self.max_tasks] + tasks[-1:]
            for t in sample:
                with self.rule("task-round-trip", f"task({t.id!r})"):
                    back = self.env.task(t.id)
                    if back != t:
                        raise self.fail("task-round-trip", f"task({t.id!r}) returned {_short(back)}, "
                                                           f"tasks({split!r}) listed {_short(t)}")
        return train

    def unknown_task(self) -> None:
        for call in ("task", "reset"):
            try:
                answer = getattr(self.env, call)(UNKNOWN_TASK)
            except EnvError:
                continue
            except Exception as e:
                raise self.fail("unknown-task", f"{call}({UNKNOWN_TASK!r}) raised {type(e).__name__}, "
                                                "not EnvError") from e
            raise self.fail("unknown-task", f"{call}({UNKNOWN_TASK!r}) was accepted: {_short(answer)}")
        self.passed("unknown-task")

    def reset(self, task_id: str) -> str:
        """reset(), checked against the task's first observation once there is one."""
        with self.rule("reset-deterministic", f"reset({task_id!r})"):
            obs = self.env.reset(task_id)
        if not isinstance(obs, str):
            raise self.fail("reset-deterministic", f"reset({task_id!r}) returned {_short(obs)}, not a str")
        first = self.first.setdefault(task_id, obs)
        if obs != first:
            raise self.fail("reset-deterministic", f"reset({task_id!r}) gave {_short(first)} at first, later "
                                                   f"{_short(obs)} (after other resets and steps)")
        return obs

    def reset_determinism(self, tasks: list[TaskSpec]) -> None:
        for t in tasks:
            self.reset(t.id)
            self.reset(t.id)  # twice in a row
        for t in tasks:  # again, after the other tasks
            self.reset(t.id)

    def commands_for(self, task: TaskSpec) -> list[str]:
        if callable(self.commands):
            cmds = list(self.commands(task))
        elif self.commands is not None:
            cmds = list(self.commands)
        elif callable(getattr(self.env, "expert", None)):
            cmds = list(self.env.expert(task.id))
        elif isinstance(valid := self.env, SupportsValidCommands):  # narrows `valid`, not self.env
            self.env.reset(task.id)
            cmds = list(valid.valid_commands())
        else:
            raise TypeError(f"check_env: env {self.name!r} has no expert() and no valid_commands(); "
                            "pass commands=[...] (or a function task -> commands)")
        if not cmds or not all(isinstance(c, str) for c in cmds):
            raise TypeError(f"check_env: no commands to check task {task.id!r} with (got {_short(cmds)})")
        return cmds[: self.max_steps]

    def step(self, command: str) -> Step:
        with self.rule("step-returns-step", f"step({command!r})"):
            step = self.env.step(command)
        if not isinstance(step, Step):
            raise self.fail("step-returns-step", f"step({command!r}) returned {_short(step)}, not a Step")
        if not isinstance(step.observation, str) or not isinstance(step.done, bool) \
                or not isinstance(step.info, dict):
            raise self.fail("step-returns-step", f"step({command!r}) returned {_short(step)}")
        reward = step.reward
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward) \
                or not 0.0 <= reward <= 1.0:
            raise self.fail("reward-in-range", f"step({command!r}) returned reward {_short(reward)}")
        self.passed("reward-in-range")
        p = step.progress
        if p is not None and (isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p)
                              or not 0.0 <= p <= 1.0):
            raise self.fail("progress-in-range", f"step({command!r}) returned progress {_short(p)}")
        self.passed("progress-in-range")
        return step

    def play(self, task_id: str, commands: list[str]) -> list[tuple]:
        """Reset and step `commands`, stopping one step after done; checks each step on the way."""
        self.reset(task_id)
        out: list[tuple] = []
        best: float | None = None
        done_at: int | None = None
        for i, command in enumerate(commands):
            step = self.step(command)
            out.append(_outcome(step))
            if step.progress is not None:
                if best is not None and step.progress < best:
                    raise self.fail("progress-latched", f"task {task_id!r}: progress fell from {best} to "
                                                        f"{step.progress} at step {i + 1} ({command!r})")
                best = step.progress
            if done_at is not None:
                if not step.done or step.reward != 0.0:
                    raise self.fail("step-after-done", f"task {task_id!r}: the step after done returned done="
                                                       f"{step.done}, reward={step.reward}")
                self.passed("step-after-done")
                break
            if step.done:
                done_at = i
        self.passed("progress-latched")
        return out

    def episode(self, task: TaskSpec) -> tuple[list[str], list[tuple]]:
        commands = self.commands_for(task)
        commands.append(commands[-1])  # one step past the end: past done, where the commands reach it
        self.reset(task.id)
        self.step(UNKNOWN_COMMAND)  # must be an observation, not an exception
        outcome = self.play(task.id, commands)
        return commands[: len(outcome)], outcome

    def replay(self, tasks: list[TaskSpec], plays: dict[str, tuple[list[str], list[tuple]]]) -> None:
        for t in tasks:  # every task was played (and reset) since its first play: replay after other tasks
            commands, first = plays[t.id]
            again = self.play(t.id, commands)
            if again != first:
                raise self.fail("replay-deterministic", f"task {t.id!r} replayed differently: {_diff(first, again)}")
        self.passed("replay-deterministic")

    def snapshots(self, task: TaskSpec, played: tuple[list[str], list[tuple]], tasks: list[TaskSpec]) -> None:
        commands, reference = played
        if len(commands) < 2:
            return
        cut = max(1, len(commands) // 3)
        self.reset(task.id)
        for command in commands[:cut]:
            self.step(command)
        with self.rule("snapshot-equals-replay", "snapshot()"):
            state = self.env.snapshot()
        frozen = _pickled(state)
        for command in commands[cut:]:  # the env steps on past the snapshot...
            self.step(command)
        other = next((t for t in tasks if t.id != task.id), task)
        self.reset(other.id)  # ...and is reset to another task
        if frozen is not None and _pickled(state) != frozen:
            raise self.fail("snapshot-not-aliased", f"task {task.id!r}: the snapshot taken after {cut} steps changed "
                                                    "when the env stepped on and was reset")
        with self.rule("snapshot-equals-replay", "restore()"):
            self.env.restore(state)
        restored = [_outcome(self.step(c)) for c in commands[cut:]]
        if restored != reference[cut:]:
            maybe = "" if frozen is not None else " (or the snapshot aliases the live state: it is not picklable, " \
                                                  "so that could not be told apart)"
            raise self.fail("snapshot-equals-replay", f"task {task.id!r}, restored after {cut} steps: "
                                                      f"{_diff(reference[cut:], restored, cut)}{maybe}")
        if frozen is not None:
            self.passed("snapshot-not-aliased")
        self.passed("snapshot-equals-replay")

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if not callable(close):
            raise self.fail("close", "the env has no close() (subclass engine.envs.base.EnvBase for a no-op one)")
        with self.rule("close", "close()"):
            close()
        with self.rule("close", "a second close()"):
            close()


def _pickled(state: Any) -> bytes | None:
    """The snapshot's content as bytes, to see whether it changes later (None: not picklable)."""
    try:
        return pickle.dumps(state)
    except Exception:  # noqa: BLE001 - e.g. a snapshot holding a process handle: compared by behaviour only
        return None


def check_env(env: Any, *, commands: Commands | None = None, max_tasks: int = 3, max_steps: int = 12,
              splits: Sequence[str] = ("train", "test"), task_ids: Sequence[str] = (),
              close: bool = True) -> list[str]:
    """Check a freshly made `env` against the Env contract; raise EnvCheckError naming the first broken
    rule (see RULES). Returns the rules checked (snapshot rules only where the env offers snapshots).

    commands: the commands to play each task with (at most `max_steps` of them): a list, or a function
    task -> list; by default `env.expert(task_id)` where the env has one, else its valid_commands().
    max_tasks: how many train tasks are played (the first ones), unless `task_ids` names the tasks to
    play. splits: the splits whose catalogue is checked (a split the env does not know, other than
    train, is skipped). close: end by closing the env (twice)."""
    if max_tasks < 1 or max_steps < 1:
        raise ValueError("check_env: max_tasks and max_steps must be at least 1")
    return _Checker(env, commands, max_tasks, max_steps, splits, task_ids).run(close)
