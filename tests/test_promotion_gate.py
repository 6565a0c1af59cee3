"""The loop's promotion gate on hand-made episodes: a paired interval above 0 promotes, one task does not."""

from __future__ import annotations

import pytest

from engine.config import ConfigError
from engine.loop import IterateConfig, gate_tasks, loop_tasks
from engine.train.gate import decide


def _episodes(solved: set[int], n: int = 43) -> list[dict[str, object]]:
    return [{"task_id": f"t{i}", "label": "", "success": i in solved, "progress": 0.0, "commands": []}
            for i in range(n)]


def test_one_more_task_of_43_is_not_promoted() -> None:
    base = set(range(8))
    d = decide(_episodes(base), _episodes(base | {20}))
    assert not d.promoted and d.diff["low"] == 0 and "kept the current policy" in d.why


def test_three_more_tasks_and_none_lost_are_promoted() -> None:
    base = set(range(8))
    d = decide(_episodes(base), _episodes(base | {20, 21, 22}))
    assert d.promoted and d.diff["low"] > 0 and d.candidate > d.current and d.tasks == 43


def test_a_worse_candidate_is_not_promoted() -> None:
    d = decide(_episodes(set(range(8))), _episodes(set(range(4))))
    assert not d.promoted and d.diff["mean"] < 0


def test_the_gate_is_held_out_of_the_loops_searches() -> None:
    from engine.envs.textcraft import TextCraftEnv

    env = TextCraftEnv()
    split, gates = gate_tasks(IterateConfig(), env)
    train, _ = loop_tasks(IterateConfig(), env)
    assert split == "val" and len(gates) == 43 and not {t.id for t in gates} & {t.id for t in train}
    assert gate_tasks(IterateConfig(gate_split=""), env) == ("", [])
    with pytest.raises(ConfigError, match="shares tasks with the evaluation"):
        loop_tasks(IterateConfig(eval_split="val"), env)
    with pytest.raises(ConfigError, match="accumulate"):
        IterateConfig(method="agentq", accumulate=True)


def test_no_interval_no_promotion_whatever_the_resample_count_or_a_tiny_gate() -> None:
    base = set(range(8))
    d = decide(_episodes(base), _episodes(base | {20}), bootstrap=0)  # an eval config with no resamples
    assert not d.promoted and d.diff["low"] == 0  # the gate resamples anyway: one task of 43 does not pass
    d = decide(_episodes(set(), n=3), _episodes({0, 1, 2}, n=3))  # 3 of 3 gained, but 3 tasks are no interval
    assert not d.promoted and "too few for an interval" in d.why


def test_an_empty_gate_split_is_the_fallback_or_an_error_never_no_gate() -> None:
    from engine.envs.textcraft import TextCraftEnv

    class NoVal(TextCraftEnv):  # a server env answers an unknown split with no tasks, not an error
        def tasks(self, split: str):  # type: ignore[no-untyped-def]
            return [] if split in ("val", "dev") else super().tasks(split)

    split, gates = gate_tasks(IterateConfig(), NoVal())
    assert split == "train" and len(gates) > 10
    with pytest.raises(ConfigError, match="no 'dev' tasks"):
        gate_tasks(IterateConfig(gate_split="dev"), NoVal())
