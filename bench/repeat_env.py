"""TextCraft with its tasks repeated (ids `train-3~1`), for benches that need more trees than the 546
tasks: `--env textcraft-repeat` once `register()` ran (bench/scale.py calls it at import; the worker
processes of a local-shard search get the parent's env table, engine/search/local_shards.py)."""

from __future__ import annotations

from dataclasses import replace

from engine.envs import registry
from engine.envs.base import TaskSpec
from engine.envs.textcraft import TextCraftEnv

REPEATS = 4
NAME = "textcraft-repeat"


class RepeatedTextCraft(TextCraftEnv):
    name = NAME

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        base = super().tasks(split)
        return [replace(t, id=f"{t.id}~{r}") for r in range(REPEATS) for t in base]

    def task(self, task_id: str) -> TaskSpec:
        return replace(super().task(task_id.partition("~")[0]), id=task_id)


def register() -> None:
    registry.BUILTIN.setdefault(NAME, f"{__name__}:RepeatedTextCraft")
