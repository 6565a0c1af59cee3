"""bench/pair_check.py: a step pair is judged right / inverted / tied by the TextCraft expert."""

from __future__ import annotations

from collections import Counter

from bench.pair_check import choices_summary, command_helps, greedy_choices, summary, verdict
from engine.datasets.pairs import Pair
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import TextCraftExpert
from engine.llm.base import Completion


def _expert_commands(env: TextCraftEnv, task_id: str) -> list[str]:
    env.reset(task_id)
    expert, out = TextCraftExpert(env), []
    while True:
        command = expert.act().action.command
        out.append(command)
        if env.step(command).done:
            return out


def test_the_expert_move_is_right_and_a_wasted_one_inverted_or_tied() -> None:
    env = TextCraftEnv()
    task = next(t for t in env.tasks("train") if t.meta["depth"] == 2)
    moves = _expert_commands(env, task.id)
    assert len(moves) >= 2
    assert verdict(env, task.id, [], moves[0], "inventory") == "right"
    assert verdict(env, task.id, [], "inventory", moves[0]) == "inverted"
    assert verdict(env, task.id, [], "inventory", "craft 1 stick using 2 planks") == "tied"
    # From the state after the first move, repeating it is wasted; the expert's next move is not.
    assert verdict(env, task.id, moves[:1], moves[1], moves[0]) == "right"
    # The last move wins the task.
    assert verdict(env, task.id, moves[:-1], moves[-1], "inventory") == "right"


def test_command_helps_leaves_the_state_as_it_was() -> None:
    env = TextCraftEnv()
    task = env.tasks("train")[3]
    first = _expert_commands(env, task.id)[0]
    env.reset(task.id)
    before = env.snapshot()
    assert command_helps(env, first)
    assert env.snapshot() == before


def test_summary_gives_shares() -> None:
    line = summary(Counter(right=3, inverted=1, tied=4))
    assert line.startswith("8 step pairs") and "right 3 (0.38)" in line and "inverted 1 (0.12)" in line


class _Answers:
    """A test double for the policy: answers each prompt's user text with a fixed composite action."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers, self.requests = answers, []

    def sample(self, requests):
        self.requests += requests
        return [[Completion(text=self.answers[r.prompt[-1]["content"]], logprob=0.0, n_tokens=1)] for r in requests]


def _pair(i: int, chosen: str, rejected: str, task_id: str) -> Pair:
    return Pair(id=f"p{i}", kind="step", run_id="r", tree_id=i, task_id=task_id, node_id=0, chosen_node=1,
                rejected_node=2, prompt=[{"role": "user", "content": f"state {i}"}],
                chosen=f"THOUGHT: t\nACTION: {chosen}\nSTATUS: CONTINUE", q_chosen=1.0, q_rejected=0.0,
                rejected=f"THOUGHT: t\nACTION: {rejected}\nSTATUS: CONTINUE", logprob_chosen=None,
                logprob_rejected=None, depth=0)


def test_greedy_choices_says_which_command_the_policy_picks_at_each_pairs_state() -> None:
    task = TextCraftEnv().tasks("fit")[0].id
    pairs = [_pair(0, "get 1 oak log", "inventory", task), _pair(1, "get 1 oak log", "inventory", task),
             _pair(2, "get 2 stick", "inventory", task)]
    policy = _Answers({"state 0": "THOUGHT: x\nACTION: Get  1 Oak Log\nSTATUS: CONTINUE",  # normalized alike
                       "state 1": "THOUGHT: x\nACTION: inventory\nSTATUS: CONTINUE",
                       "state 2": "not a composite action"})
    counts = greedy_choices(policy, pairs, constrained=True, batch=2)
    assert counts == Counter(chosen=1, rejected=1, other=1)
    assert len(policy.requests) == 3 and all(r.params.temperature == 0.0 and r.params.grammar for r in policy.requests)
    assert choices_summary(counts) == ("greedy at the 3 pairs' states: the chosen command 1, the rejected 1, "
                                       "another 1")
