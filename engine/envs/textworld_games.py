"""TextWorld games as an env: `--env textworld:cooking[?n=10&recipe=1&go=1&restore=replay]`.

Games are generated offline by TextWorld's own challenge makers from a FIXED seed set (train seeds
1..n, test seeds TEST_SEED0+1..), once, at first use, into the cache (`engine.paths.cache_dir`), written
atomically so parallel processes can share it; nothing is downloaded. A task is one game. The
admissible commands are `valid_commands()` and are listed in each observation (option valid=0 turns
that off); the game's walkthrough is the expert. Reward 1.0 when the game is won, done with 0.0 when
lost; progress is the latched share of the game's max score.

Restore: replay from reset (default) or `env.copy()` (restore=copy). Measured here (bench/envs.py):
reset ~15 ms and a step ~6 ms, while one copy costs ~170 ms, so replay wins below depth ~25.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import textworld
import textworld.challenges
from textworld import EnvInfos, GameOptions

from engine.envs.base import EnvBase, EnvError, Step, TaskSpec
from engine.envs.registry import split_options
from engine.paths import cache_dir

SPLITS = ("train", "test")
TEST_SEED0 = 10_000
CHALLENGES = {
    "cooking": ("tw-cooking", {"recipe": 1, "take": 1, "go": 1, "open": True, "cook": False, "cut": False,
                               "drop": False}),
    "treasure_hunter": ("tw-treasure_hunter", {"level": 1}),
    "coin_collector": ("tw-coin_collector", {"level": 1}),
}
OPTIONS = {"n": int, "recipe": int, "take": int, "go": int, "open": bool, "cook": bool, "cut": bool,
           "drop": bool, "level": int, "valid": bool, "restore": str}
INFOS = EnvInfos(admissible_commands=True, objective=True, max_score=True, score=True, won=True, lost=True,
                 description=True)
# jericho warns that TextWorld's games are "not fully supported": TextWorld tracks the score itself.
warnings.filterwarnings("ignore", message=".*is not fully supported.*")
_STATUS = re.compile(r"^>.*$", re.MULTILINE)

DESCRIPTION = """TextWorld: a text adventure. Explore, take and use objects to reach the objective.
Type commands as in a classic text adventure, e.g. "look", "inventory", "go north", "open fridge",
"take apple from counter", "examine cookbook". The commands that are valid now are listed after each
observation; use one of them exactly."""


@dataclass(frozen=True)
class Game:
    """One generated game and what the maker says about it."""

    path: str
    objective: str
    walkthrough: tuple[str, ...]
    max_score: float


def _clean(text: str) -> str:
    """Feedback without the status line ("> -= Kitchen =-0/3") and surrounding blank lines."""
    return re.sub(r"\n{3,}", "\n\n", _STATUS.sub("", text)).strip()


def _generate(challenge: str, settings: dict[str, Any], seed: int, target: Path) -> Game:
    """Make and compile one game into `target` (.z8, with TextWorld's own .json beside it, which it
    needs to load the game) plus our `.meta.json`, moved in atomically; returns its metadata."""
    maker = textworld.challenges.CHALLENGES[challenge][1]
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".gen-") as tmp:
        options = GameOptions()
        options.seeds = seed
        options.path = str(Path(tmp) / target.name)
        options.file_ext = ".z8"
        options.force_recompile = True
        game = maker(dict(settings), options)
        compiled = Path(textworld.generator.compile_game(game, options))
        walkthrough = list(game.metadata.get("walkthrough") or [])
        if not walkthrough and game.main_quest is not None:
            walkthrough = list(game.main_quest.commands)
        meta = {"objective": game.objective, "walkthrough": walkthrough, "max_score": float(game.max_score),
                "seed": seed, "settings": settings}
        (Path(tmp) / "meta").write_text(json.dumps(meta))
        os.replace(compiled.with_suffix(".json"), target.with_suffix(".json"))
        os.replace(compiled, target)
        os.replace(Path(tmp) / "meta", _meta_path(target))  # last: its presence means "complete"
    return Game(str(target), meta["objective"], tuple(walkthrough), meta["max_score"])


def _meta_path(game: Path) -> Path:
    return game.with_suffix(".meta.json")


@lru_cache(maxsize=256)
def game_for(challenge: str, base_json: str, settings_json: str, seed: int) -> Game:
    """The cached game for (challenge, settings, seed), generated on first use. `base_json` (the
    user's settings) names the folder; `settings_json` adds per-game settings such as the recipe seed."""
    base = json.loads(base_json)
    key = "-".join(f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in sorted(base.items()))
    folder = cache_dir("textworld", f"tw{textworld.__version__}", challenge.removeprefix("tw-"), key)
    target = folder / f"seed{seed}.z8"
    meta = _meta_path(target)
    if meta.exists() and target.exists():
        data = json.loads(meta.read_text())
        return Game(str(target), data["objective"], tuple(data["walkthrough"]), float(data["max_score"]))
    return _generate(challenge, json.loads(settings_json), seed, target)


class TextWorldEnv(EnvBase):
    """Generated TextWorld games; restore by replay. See TextWorldCopyEnv for copy-based snapshots."""

    name = "textworld"

    def __init__(self, arg: str = "cooking") -> None:
        main, opts = split_options(arg or "cooking", OPTIONS, "textworld")
        kind = main or "cooking"
        if kind not in CHALLENGES:
            raise EnvError(f"unknown TextWorld challenge {kind!r} (known: {', '.join(CHALLENGES)})")
        if opts.get("restore", "replay") not in ("replay", "copy"):
            raise EnvError("textworld: option restore must be 'replay' or 'copy'")
        self.kind = kind
        self.challenge, defaults = CHALLENGES[kind]
        self.settings = {k: opts.get(k, v) for k, v in defaults.items()}
        self.n = int(opts.get("n", 10))
        if self.n < 1:
            raise EnvError("textworld: option n must be at least 1")
        self.show_valid = bool(opts.get("valid", True))
        self._env: Any = None
        self._path = ""
        self._task: TaskSpec | None = None
        self._state: Any = None
        self._best = 0.0
        self._done = False

    # -- tasks ------------------------------------------------------------------------------------

    def _settings_for(self, split: str, seed: int) -> str:
        settings = dict(self.settings)
        if self.challenge == "tw-cooking":
            settings.update(recipe_seed=seed, split="train" if split == "train" else "test")
        return json.dumps(settings, sort_keys=True)

    def _game(self, split: str, index: int) -> Game:
        seed = 1 + index + (0 if split == "train" else TEST_SEED0)
        base = json.dumps(self.settings, sort_keys=True)
        return game_for(self.challenge, base, self._settings_for(split, seed), seed)

    def _spec(self, split: str, index: int) -> TaskSpec:
        game = self._game(split, index)
        return TaskSpec(id=f"{split}-{index}", goal=game.objective, split=split,
                        meta={"game": game.path, "max_score": game.max_score, "challenge": self.kind})

    def describe(self) -> str:
        return DESCRIPTION

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        if split not in SPLITS:
            raise EnvError(f"unknown TextWorld split {split!r} (known: {', '.join(SPLITS)})")
        return [self._spec(split, i) for i in range(self.n)]

    def task(self, task_id: str) -> TaskSpec:
        split, _, index = task_id.rpartition("-")
        if split not in SPLITS or not index.isdigit() or int(index) >= self.n:
            raise EnvError(f"unknown TextWorld task id {task_id!r} (ids are train-0..train-{self.n - 1}, "
                           f"test-0..test-{self.n - 1})")
        return self._spec(split, int(index))

    def expert(self, task_id: str) -> list[str]:
        """The game's walkthrough: the commands that win it from reset."""
        split, _, index = task_id.rpartition("-")
        self.task(task_id)
        return list(self._game(split, int(index)).walkthrough)

    # -- episode ----------------------------------------------------------------------------------

    def reset(self, task_id: str) -> str:
        task = self.task(task_id)
        if self._env is None or self._path != task.meta["game"]:
            if self._env is not None:
                self._env.close()
            self._env = textworld.start(task.meta["game"], request_infos=INFOS)
            self._path = task.meta["game"]
        self._state = self._env.reset()
        self._task, self._best, self._done = task, 0.0, False
        return self._observation(self._state.description or _clean(self._state.feedback))

    def step(self, command: str) -> Step:
        if self._task is None:
            raise EnvError("step() before reset(): call reset(task_id) first")
        if self._done:
            return Step("The game is over.", 0.0, True, self._best, {"ok": False})
        state, score, done = self._env.step(" ".join(command.split()))
        self._state = state
        max_score = float(state.max_score or 1.0)
        self._best = max(self._best, min(max(float(score) / max_score, 0.0), 1.0))
        won, lost = bool(state.won), bool(state.lost)
        self._done = bool(done or won or lost)
        if won:
            self._best = 1.0
        text = _clean(state.feedback)
        if won:
            text += "\nYou won the game."
        elif self._done:
            text += "\nYou lost the game."
        else:
            text = self._observation(text)
        return Step(text, 1.0 if won else 0.0, self._done, self._best, {"score": float(score)})

    def _observation(self, text: str) -> str:
        if not self.show_valid:
            return text
        return f"{text}\nValid commands: {', '.join(self.valid_commands())}"

    def valid_commands(self) -> list[str]:
        if self._state is None:
            raise EnvError("valid_commands() before reset(): call reset(task_id) first")
        return list(self._state.admissible_commands or [])

    def close(self) -> None:
        """Stop the game's interpreter process; reset() starts a new one."""
        if self._env is not None:
            self._env.close()
        self._env, self._path, self._task, self._state = None, "", None, None


class TextWorldCopyEnv(TextWorldEnv):
    """Same games, restore through `env.copy()` snapshots (measured slower than replay here)."""

    def snapshot(self) -> Any:
        if self._task is None:
            raise EnvError("snapshot() before reset(): nothing to snapshot")
        return (self._env.copy(), self._path, self._task, self._state, self._best, self._done)

    def restore(self, state: Any) -> None:
        env, self._path, self._task, self._state, self._best, self._done = state
        self._env = env.copy()  # the snapshot must survive later steps of the restored env


def make_env(arg: str = "cooking") -> TextWorldEnv:
    """The registry's constructor: restore=copy picks the copy-snapshot variant."""
    copy = split_options(arg or "cooking", OPTIONS, "textworld")[1].get("restore") == "copy"
    return (TextWorldCopyEnv if copy else TextWorldEnv)(arg)


def clear_cache() -> None:
    """Remove every generated game (they are regenerated on next use)."""
    shutil.rmtree(cache_dir("textworld"), ignore_errors=True)
