"""Search-labelled corrections (engine/datasets/corrections.py), hand-worked on a real TextCraft task:
train-267, "craft 1 polished blackstone slab" = get 4 blackstone, craft 4 polished blackstone, craft 6
polished blackstone slab (the slab from 3 polished blackstone)."""

from __future__ import annotations

import pytest

from engine.actions import CompositeAction, render
from engine.config import ConfigError
from engine.datasets.corrections import CorrectionConfig, correction_samples, distance, wins_of
from engine.datasets.samples import to_step_rows
from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import Episode

TASK = "train-267"
GET = "get 4 blackstone"
POLISH = "craft 4 polished blackstone using 4 blackstone"
SLAB = "craft 6 polished blackstone slab using 3 polished blackstone"
BUTTON = "craft 1 polished blackstone button using 1 polished blackstone"
DESC = TextCraftEnv().describe()


def text(command: str, why: str = "") -> str:
    return render(CompositeAction(thought=why or f"do {command}", command=command))


def episode(commands: list[str], seed: int = 0, why: str = "") -> Episode:
    """The episode as evaluate() records it: each command played in the real env."""
    env = TextCraftEnv()
    first = env.reset(TASK)
    turns, success = [], False
    for c in commands:
        step = env.step(c)
        turns.append((text(c, why), step.observation))
        success = step.reward >= 1.0
    return Episode(task_id=TASK, seed=seed, success=success, steps=len(turns), commands=list(commands),
                   turns=turns, first_observation=first)


def test_the_win_replays_and_the_refused_craft_is_a_no_op() -> None:
    assert episode([GET, POLISH, SLAB]).success
    env = TextCraftEnv()
    env.reset(TASK)
    env.step(GET)
    before = env.snapshot()
    assert "Could not" in env.step(SLAB).observation and env.snapshot() == before


def test_distance_is_the_shortest_winning_suffix() -> None:
    env = TextCraftEnv()
    env.reset(TASK)
    wins = wins_of([episode([GET, POLISH, SLAB], why="win")])[TASK]
    assert distance(env, env.snapshot(), wins, 1.0)[0::2] == (3, 0)
    env.restore(env.snapshot())
    env.reset(TASK)
    env.step(GET)
    left, win, i = distance(env, env.snapshot(), wins, 1.0)
    assert (left, win.commands[i]) == (2, POLISH)


def test_a_looping_failure_is_corrected_at_its_first_refused_steps_with_the_wins_turn() -> None:
    win = episode([GET, POLISH, SLAB], seed=1, why="from the win")
    loop = episode([GET, SLAB, SLAB, SLAB, SLAB], seed=0)
    assert not loop.success
    task = TextCraftEnv().task(TASK)
    rows = correction_samples([loop], [win], [task], TextCraftEnv, DESC, CorrectionConfig(per_episode=3))
    # step 0 (the get) agrees with the win; steps 1, 2, 3 are refused crafts: the first three failing steps
    assert [r.source["step"] for r in rows] == [1, 2, 3]
    assert {r.source["label_command"] for r in rows} == {POLISH}
    assert {r.source["failed_command"] for r in rows} == {SLAB}
    for r in rows:
        j = r.source["step"]
        assert [t.text for t in r.turns[:-1]] == [t for t, _ in loop.turns[:j]]  # the policy's own history
        assert not any(t.trains for t in r.turns[:-1]) and r.turns[-1].trains
        assert r.turns[-1].text == win.turns[1][0]  # the win's own turn, as the search wrote it
        (row,) = to_step_rows(r)  # one trained step, prompted as the policy was at that state
        prompt = row["prompt"][1]["content"]
        assert f"Step {j + 1}: give your composite action." in prompt
        assert loop.turns[j - 1][1].strip() in prompt  # the refusal it just saw
    assert len(correction_samples([loop], [win], [task], TextCraftEnv, DESC, CorrectionConfig(per_episode=1))) == 1


def test_a_distractor_is_a_failing_step_and_the_wins_own_commands_in_another_order_are_not() -> None:
    task = TextCraftEnv().task(TASK)
    win = episode([GET, POLISH, SLAB], seed=1)
    distracted = episode([GET, POLISH, BUTTON, BUTTON], seed=0)
    rows = correction_samples([distracted], [win], [task], TextCraftEnv, DESC)
    # the first button leaves 3 polished (the slab still wins next: distance 1, no closer: failing), the
    # second leaves 2 (only a fresh get wins: distance 3); both are labelled with the slab
    assert [(r.source["step"], r.source["failed_command"], r.source["label_command"], r.source["distance"])
            for r in rows] == [(2, BUTTON, SLAB, 1), (3, BUTTON, SLAB, 1)]
    two_gets = "get 2 blackstone"
    slow = episode([two_gets, two_gets, POLISH], seed=0)  # not a win: it ran out of steps, no step failed
    win2 = episode([two_gets, two_gets, POLISH, SLAB], seed=2)
    assert correction_samples([slow], [win2], [task], TextCraftEnv, DESC) == []


def test_only_failures_with_a_win_of_their_task_are_corrected() -> None:
    task = TextCraftEnv().task(TASK)
    loop = episode([GET, SLAB, SLAB])
    assert correction_samples([loop], [loop], [task], TextCraftEnv, DESC) == []  # no win to label with
    assert correction_samples([episode([GET, POLISH, SLAB])], [episode([GET, POLISH, SLAB])], [task],
                              TextCraftEnv, DESC) == []  # a success needs no correction
    with pytest.raises(ConfigError, match="per_episode"):
        CorrectionConfig(per_episode=0)


def test_a_win_with_a_refused_craft_trains_the_recovery_not_the_refusal() -> None:
    from engine.datasets.corrections import refused_turns
    from engine.datasets.distill import episode_samples

    win = episode([GET, SLAB, POLISH, SLAB])  # the first slab craft is refused: no polished blackstone yet
    assert win.success
    assert refused_turns(TextCraftEnv(), win) == {1}
    task = TextCraftEnv().task(TASK)
    (plain,) = episode_samples([win], [task], DESC)
    (masked,) = episode_samples([win], [task], DESC, make_env=TextCraftEnv)
    assert plain.id == masked.id and all(t.trains for t in plain.turns)
    assert [t.trains for t in masked.turns] == [True, False, True, True]
    assert masked.source["refused_untrained"] == 1
    rows = to_step_rows(masked)
    assert [r["completion"][0]["content"] for r in rows] == [win.turns[i][0] for i in (0, 2, 3)]
    # the refusal stays in the recovery's history: the polish is learnt right after it
    assert "Could not" in rows[1]["prompt"][1]["content"]
