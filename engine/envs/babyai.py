"""BabyAI (minigrid's BabyAI-* levels) as a text env: `--env babyai:GoToLocal[?n=50]`.

minigrid has no text observation, so we describe the agent's 7x7 egocentric view ourselves from
minigrid's own name tables: every visible object with its colour, state and position relative to
the agent ("2 steps forward and 1 step to the left"), what is directly ahead, the walls around, and
what the agent carries. Commands are the standard BabyAI actions in words (turn left, turn right,
go forward, pick up, drop, toggle). A task is one level seed (train seeds 0.., test seeds
TEST_SEED0..), so it is deterministic; snapshots deepcopy the unwrapped minigrid env (~1 ms).
Reward is 1.0 when the mission is completed (minigrid's own time-discounted reward is kept in
`info["env_reward"]`); running out of steps ends the episode with 0. The level's BabyAIBot is the
expert (`expert(task_id)` -> commands).
"""

from __future__ import annotations

import contextlib
import copy
import io
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* levels with gymnasium)
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, STATE_TO_IDX

from engine.envs.base import EnvBase, EnvError, Step, TaskSpec
from engine.envs.registry import split_options

if TYPE_CHECKING:
    from minigrid.minigrid_env import MiniGridEnv

SPLITS = ("train", "test")
TEST_SEED0 = 1_000_000  # test seeds never overlap train seeds
COMMANDS = {"turn left": 0, "turn right": 1, "go forward": 2, "pick up": 3, "drop": 4, "toggle": 5}
ALIASES = {"left": "turn left", "right": "turn right", "forward": "go forward", "move forward": "go forward",
           "pickup": "pick up", "open": "toggle"}
IDX_TO_STATE = {v: k for k, v in STATE_TO_IDX.items()}
FACING = ("east", "south", "west", "north")  # minigrid's agent_dir 0..3
_SCENERY = {"unseen", "empty", "floor", "wall", "agent"}

DESCRIPTION = """BabyAI: a grid world seen from the agent's point of view (7x7 cells ahead and around).
Commands (one per step): turn left, turn right, go forward, pick up, drop, toggle.
- "go forward" moves one cell in the facing direction (blocked by walls, closed doors and objects).
- "pick up" takes the object directly in front of you (you carry at most one); "drop" puts it there.
- "toggle" opens or closes the door directly in front of you (a locked door needs the key of its colour).
Positions are given relative to you: "N steps forward" and "N steps to the left/right"."""


def level_id(name: str) -> str:
    """'GoToLocal' or 'BabyAI-GoToLocal-v0' -> the registered gymnasium id (EnvError if unknown)."""
    known = sorted(e for e in gym.registry if e.startswith("BabyAI-"))
    for candidate in (name, f"BabyAI-{name}-v0", f"BabyAI-{name}-v1", f"BabyAI-{name}"):
        if candidate in gym.registry and candidate.startswith("BabyAI-"):
            return candidate
    short = ", ".join(k.removeprefix("BabyAI-").rsplit("-", 1)[0] for k in known[:12])
    raise EnvError(f"unknown BabyAI level {name!r} (e.g. {short}, ... {len(known)} levels)")


def _steps(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


def _where(forward: int, right: int) -> str:
    parts = []
    if forward:
        parts.append(_steps(forward, "forward"))
    if right:
        parts.append(_steps(abs(right), "to the right" if right > 0 else "to the left"))
    return " and ".join(parts) or "here"


def _name(cell: Any) -> str:
    obj, color, state = (int(v) for v in cell)
    kind = IDX_TO_OBJECT[obj]
    if kind == "door":
        return f"a {IDX_TO_STATE[state]} {IDX_TO_COLOR[color]} door"
    if kind in ("wall", "lava", "goal"):
        return f"a {kind}" if kind != "goal" else "the goal square"
    return f"a {IDX_TO_COLOR[color]} {kind}"


def _quiet():
    """minigrid prints "Sampling rejected: ..." while generating some levels: keep stdout clean."""
    return contextlib.redirect_stdout(io.StringIO())


def _world(env: Any) -> tuple[Any, ...]:
    """What a minigrid env's state is, as comparable values (see BabyAIEnv.same_state)."""
    u = env.unwrapped
    carrying = None if u.carrying is None else tuple(int(x) for x in u.carrying.encode())
    return tuple(int(x) for x in u.agent_pos), int(u.agent_dir), carrying, u.grid.encode().tobytes()


def describe_view(image: Any, carrying: Any, direction: int | None = None) -> str:
    """The text for minigrid's egocentric (7, 7, 3) image: the agent sits at column 3 of the last row,
    facing 'up' (decreasing row); image[col][row] = (object, colour, state)."""
    width, height = image.shape[0], image.shape[1]
    me_x, me_y = width // 2, height - 1
    seen = []
    for y in range(height):
        for x in range(width):
            kind = IDX_TO_OBJECT[int(image[x][y][0])]
            if kind not in _SCENERY:
                seen.append((me_y - y, x - me_x, _name(image[x][y])))
    seen.sort(key=lambda s: (s[0] + abs(s[1]), s[0], s[1]))
    lines = [] if direction is None else [f"You are facing {FACING[int(direction)]}."]
    ahead = image[me_x][me_y - 1]
    ahead_kind = IDX_TO_OBJECT[int(ahead[0])]
    front = "nothing (empty floor)" if ahead_kind in ("empty", "floor") else _name(ahead)
    lines.append(f"Directly in front of you: {front}.")
    wall_ahead = next((me_y - y for y in range(me_y - 1, -1, -1)
                       if IDX_TO_OBJECT[int(image[me_x][y][0])] in ("wall", "unseen")), None)
    if wall_ahead is not None and IDX_TO_OBJECT[int(image[me_x][me_y - wall_ahead][0])] == "wall":
        lines.append(f"There is a wall {_steps(wall_ahead, 'forward')}.")
    sides = [side for side, dx in (("left", -1), ("right", 1))
             if IDX_TO_OBJECT[int(image[me_x + dx][me_y][0])] == "wall"]
    if sides:
        lines.append(f"There is a wall right next to you on your {' and '.join(sides)}.")
    if seen:
        lines.append("You see: " + "; ".join(f"{name} {_where(f, r)}" for f, r, name in seen) + ".")
    else:
        lines.append("You see no objects.")
    lines.append(f"You are carrying {f'a {carrying.color} {carrying.type}' if carrying else 'nothing'}.")
    return "\n".join(lines)


def _make(level: str) -> MiniGridEnv:
    """The bare level: gymnasium types `unwrapped` as a plain Env; BabyAI levels are MiniGridEnvs."""
    return cast("MiniGridEnv", gym.make(level).unwrapped)


@lru_cache(maxsize=64)
def _mission(level: str, seed: int) -> str:
    env = _make(level)
    with _quiet():
        env.reset(seed=seed)
    return env.mission


class BabyAIEnv(EnvBase):
    """One BabyAI level; tasks are seeds. Options: n (tasks per split, default 50)."""

    name = "babyai"

    def __init__(self, arg: str = "GoToLocal") -> None:
        main, opts = split_options(arg or "GoToLocal", {"n": int}, "babyai")
        self.level = level_id(main or "GoToLocal")
        self.short = self.level.removeprefix("BabyAI-").rsplit("-", 1)[0]
        self.n = int(opts.get("n", 50))
        if self.n < 1:
            raise EnvError("babyai: option n must be at least 1")
        self._env = _make(self.level)
        self._task: TaskSpec | None = None
        self._done = False
        self._steps = 0

    # -- Env protocol ---------------------------------------------------------------------------

    def describe(self) -> str:
        return DESCRIPTION

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        if split not in SPLITS:
            raise EnvError(f"unknown BabyAI split {split!r} (known: {', '.join(SPLITS)})")
        return [self._spec(split, i) for i in range(self.n)]

    def task(self, task_id: str) -> TaskSpec:
        split, _, index = task_id.rpartition("-")
        if split not in SPLITS or not index.isdigit() or int(index) >= self.n:
            raise EnvError(f"unknown BabyAI task id {task_id!r} (ids are train-0..train-{self.n - 1}, "
                           f"test-0..test-{self.n - 1})")
        return self._spec(split, int(index))

    def _spec(self, split: str, index: int) -> TaskSpec:
        seed = index if split == "train" else TEST_SEED0 + index
        return TaskSpec(id=f"{split}-{index}", goal=_mission(self.level, seed), split=split,
                        meta={"level": self.level, "seed": seed})

    def reset(self, task_id: str) -> str:
        task = self.task(task_id)
        with _quiet():
            obs, _ = self._env.reset(seed=task.meta["seed"])
        self._task, self._done, self._steps = task, False, 0
        return describe_view(obs["image"], self._env.carrying, obs["direction"])

    def step(self, command: str) -> Step:
        if self._task is None:
            raise EnvError("step() before reset(): call reset(task_id) first")
        if self._done:
            return Step("The episode is over.", 0.0, True, None, {"ok": False})
        text = " ".join(command.lower().replace("_", " ").split()).rstrip(".")
        text = ALIASES.get(text, text)
        action = COMMANDS.get(text)
        if action is None:
            return Step(f"Unknown command {command.strip()!r}: valid commands are {', '.join(COMMANDS)}.",
                        0.0, False, None, {"ok": False})
        obs, reward, terminated, truncated, _ = self._env.step(action)
        self._steps += 1
        success = bool(terminated and float(reward) > 0)
        self._done = bool(terminated or truncated)
        text = describe_view(obs["image"], self._env.carrying, obs["direction"])
        if success:
            text = "Mission complete! " + text
        elif self._done:
            text = "Out of steps: the episode is over. " + text
        return Step(text, 1.0 if success else 0.0, self._done, 1.0 if success else None,
                    {"ok": True, "env_reward": float(reward)})

    # -- optional protocols -----------------------------------------------------------------------

    def valid_commands(self) -> list[str]:
        return list(COMMANDS)

    def snapshot(self) -> Any:
        if self._task is None:
            raise EnvError("snapshot() before reset(): nothing to snapshot")
        return copy.deepcopy((self._env, self._task, self._done, self._steps))

    def restore(self, state: Any) -> None:
        self._env, self._task, self._done, self._steps = copy.deepcopy(state)

    def same_state(self, a: Any, b: Any) -> bool:
        """Do snapshots `a` and `b` hold the same world: the task, the agent's cell, direction and load, and
        the grid? Their step counters are left out, so a command that changed nothing (a move into a wall, a
        drop with empty hands) is a no-op although it used a step; the snapshots themselves (deep copies of
        the gym env) never compare equal."""
        return a[1] == b[1] and a[2] == b[2] and _world(a[0]) == _world(b[0])

    def close(self) -> None:
        """Close the gymnasium env (its renderer, if one was opened); reset() starts it again."""
        self._env.close()
        self._task, self._done = None, False

    def expert(self, task_id: str) -> list[str]:
        """The level's BabyAIBot, run on a private copy from reset: its commands solve the task."""
        from minigrid.utils.baby_ai_bot import BabyAIBot

        env = _make(self.level)
        with _quiet():
            env.reset(seed=self.task(task_id).meta["seed"])
        bot, names, commands = BabyAIBot(env), {v: k for k, v in COMMANDS.items()}, []
        for _ in range(env.max_steps):
            action = int(bot.replan())
            if action not in names:  # 'done' is not a BabyAI command we offer
                break
            commands.append(names[action])
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        return commands
