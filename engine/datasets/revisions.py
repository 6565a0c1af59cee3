"""Revision trajectories from search trees (Agent-R, arXiv 2501.11425; docs/algorithms.md §4), and the
recovery test set.

1. Leaf pairs: a good leaf has final reward > alpha_good; a bad leaf is paired with a good one when
   reward(good) - reward(bad) > beta_gap. Each bad leaf is used once, with the good leaf that shares
   the LONGEST prefix with it (the deepest common ancestor: the shortest correction), ties going to
   the higher reward then the lower node id.
2. First-error detection: a model judges the bad path's steps after the common ancestor in order,
   with `judge_prompt` (task, the log so far with observations, the current action and what the env
   answered) and `parse_judgement`. All pairs of all trees advance together: ONE batched
   `Generator.sample` call per step index; a step shared by several bad paths is asked once. A
   garbled answer is recorded and counts as Uncertain; a format-error step is Bad without asking
   (it is not an action the model could judge). The first Bad step is t'; none: the last step.
3. Splice: shared prefix + bad steps up to and including t' (no loss) + a revision turn (one of
   `REVISION_PHRASES`, a no-op command, loss) + the good path after the ancestor (loss). The
   revision turn is answered by the ancestor's observation: the state the good suffix starts from.

Also built: the good trajectories (all turns trained) for the SFT mix, and the recovery set — the
erroneous prefixes (through t'), with the env commands that replay them, from which a model must
finish the task.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.actions import CompositeAction, render
from engine.config import ConfigError
from engine.datasets.samples import (
    Sample,
    TreeRef,
    Turn,
    path_turns,
    rollout_samples,
    stable_id,
    trajectory_sample,
    tree_task,
)
from engine.llm.base import Generator, GeneratorError, SampleRequest, SamplingParams
from engine.prompts import judge_prompt, parse_judgement

EPS = 1e-9

# Reflection thoughts for the revision turn (Agent-R style); one is chosen per sample from its id.
REVISION_PHRASES = (
    "My last steps were wrong; I should go back and try another way.",
    "I made a mistake in the previous actions. Let me return to where things were fine and take a different path.",
    "These actions are not leading to the goal. I will undo my approach and try something else.",
    "Looking back, the recent steps were a wrong turn. I need to reconsider and choose another action.",
    "That did not work as intended. I should step back to the last good point and revise my plan.",
    "I went down the wrong path. Let me reflect: a different action from the earlier state is needed.",
    "The observations show my recent choices were mistaken. I will correct course now.",
    "I realize my previous steps were errors. Going back to try a better approach.",
    "This line of actions is a dead end. I should revise and continue from the last correct state.",
    "On reflection, I took a wrong action earlier. Let me fix it by taking another route.",
    "My plan went off track a few steps ago. I will backtrack and proceed differently.",
    "The last actions did not help with the task. I should drop them and try the alternative.",
)
REVISION_EXPLANATION = "Abandon the mistaken steps and continue from the last correct state."


@dataclass(frozen=True)
class RevisionConfig:
    """alpha_good / beta_gap on final rewards in [0, 1] (strict); max_per_task caps the revision
    trajectories of one tree; noop_command is the revision turn's command."""

    alpha_good: float = field(default=0.5, metadata={"help": "a good leaf has reward above this"})
    beta_gap: float = field(default=0.5, metadata={
        "help": "pair a bad leaf when the good one's reward is higher by more than this"})
    max_per_task: int = field(default=16, metadata={"help": "revision trajectories per task at most"})
    noop_command: str = field(default="noop", metadata={"help": "the revision turn's command"})
    judge_max_tokens: int = field(default=128, metadata={"help": "tokens per first-error judgement"})
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {
            "alpha_good": 0.0 <= self.alpha_good <= 1.0,
            "beta_gap": 0.0 <= self.beta_gap <= 1.0,
            "max_per_task": self.max_per_task >= 1,
            "noop_command": bool(self.noop_command.strip()) and "\n" not in self.noop_command,
            "judge_max_tokens": self.judge_max_tokens >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"revisions {name}: invalid value {getattr(self, name)!r}")


@dataclass(frozen=True)
class LeafPair:
    """A (good, bad) leaf pair of tree `refs[ref]`. Paths run from the root's child to the leaf;
    their first `split` steps (down to the common ancestor) are shared."""

    ref: int
    good: int
    bad: int
    ancestor: int
    split: int
    good_path: tuple[int, ...]
    bad_path: tuple[int, ...]

    @property
    def bad_segment(self) -> tuple[int, ...]:
        """The bad path's steps after the common ancestor (what first-error detection walks)."""
        return self.bad_path[self.split :]

    @property
    def good_suffix(self) -> tuple[int, ...]:
        return self.good_path[self.split :]


@dataclass(frozen=True)
class Detection:
    """Where the bad path first went wrong: index t' into the bad segment, and every judgement."""

    t_prime: int
    error_found: bool
    judgements: tuple[dict[str, Any], ...]


@dataclass
class RevisionBuild:
    revision: list[Sample] = field(default_factory=list)
    good: list[Sample] = field(default_factory=list)
    recovery: list[Sample] = field(default_factory=list)
    pairs: int = 0
    judge_calls: int = 0
    judge_requests: int = 0
    garbled: int = 0

    @property
    def samples(self) -> list[Sample]:
        return [*self.revision, *self.good, *self.recovery]


def _reward(ref: TreeRef, node_id: int) -> float:
    return ref.tree.nodes[node_id].reward or 0.0


def _path(ref: TreeRef, node_id: int) -> tuple[int, ...]:
    return tuple(n.id for n in ref.tree.path(ref.tree.nodes[node_id]))


def good_leaves(ref: TreeRef, config: RevisionConfig) -> list[int]:
    return [
        n.id for n in ref.tree.nodes
        if n.terminal is not None and n.parent is not None and _reward(ref, n.id) > config.alpha_good + EPS
    ]


def select_pairs(ref: TreeRef, index: int, config: RevisionConfig) -> list[LeafPair]:
    """Leaf pairs of one tree (see the module doc), deepest common ancestors first, capped."""
    nodes = ref.tree.nodes
    best: list[int | None] = [None] * len(nodes)  # highest-reward good leaf in each subtree
    for leaf in good_leaves(ref, config):
        best[leaf] = leaf
    for n in reversed(nodes):  # children have larger ids than their parents
        new = best[n.id]
        if n.parent is not None and new is not None:
            cur = best[n.parent]
            if cur is None or (_reward(ref, new), -new) > (_reward(ref, cur), -cur):
                best[n.parent] = new
    found = []
    for n in nodes:
        if n.terminal is None or n.parent is None:
            continue
        floor = _reward(ref, n.id) + config.beta_gap + EPS
        anc: int | None = n.parent
        while anc is not None:
            g = best[anc]
            if g is not None and _reward(ref, g) > floor:
                depth = nodes[anc].depth
                found.append((depth, LeafPair(index, g, n.id, anc, depth, _path(ref, g), _path(ref, n.id))))
                break
            anc = nodes[anc].parent
    found.sort(key=lambda item: (-item[0], item[1].bad))
    return [pair for _, pair in found[: config.max_per_task]]


def detect_first_errors(
    refs: Sequence[TreeRef], pairs: Sequence[LeafPair], judge: Generator, config: RevisionConfig,
    stats: RevisionBuild | None = None,
) -> list[Detection]:
    """First Bad step of every pair's bad segment, one batched judge call per step index."""
    cache: dict[tuple[int, int], dict[str, Any]] = {}
    logs: list[list[dict[str, Any]]] = [[] for _ in pairs]
    first_bad: list[int | None] = [None] * len(pairs)
    longest = max((len(p.bad_segment) for p in pairs), default=0)
    for step in range(longest):
        active = [i for i, p in enumerate(pairs) if first_bad[i] is None and step < len(p.bad_segment)]
        asks: dict[tuple[int, int], SampleRequest] = {}
        for i in active:
            key = (pairs[i].ref, pairs[i].bad_segment[step])
            if key in cache or key in asks:
                continue
            tree = refs[key[0]].tree
            node = tree.nodes[key[1]]
            if node.action is None:  # a format error: not an action, and wrong by definition
                cache[key] = {"node": node.id, "answer": f"(format error: {node.format_error})", "verdict": "Bad"}
                continue
            assert node.parent is not None  # only the root has no parent, and it has no action
            prompt = judge_prompt(tree.task.goal, tree.task.context, tree.history(tree.nodes[node.parent]),
                                  node.action, node.observation)
            seed = zlib.crc32(repr((config.seed, tree.task.id, node.id)).encode()) & 0x7FFFFFFF
            asks[key] = SampleRequest(prompt, 1, SamplingParams(temperature=0.0, max_tokens=config.judge_max_tokens,
                                                                seed=seed))
        if asks:
            replies = judge.sample(list(asks.values()))
            if len(replies) != len(asks):
                raise GeneratorError(f"judge returned {len(replies)} results for {len(asks)} requests")
            if stats is not None:
                stats.judge_calls += 1
                stats.judge_requests += len(asks)
            for key, completions in zip(asks, replies):
                answer = completions[0].text if completions else ""
                verdict = parse_judgement(answer)
                if verdict is None and stats is not None:
                    stats.garbled += 1
                cache[key] = {"node": key[1], "answer": answer, "verdict": verdict or "garbled"}
        for i in active:
            record = cache[(pairs[i].ref, pairs[i].bad_segment[step])]
            logs[i].append({"step": step, **record})
            if record["verdict"] == "Bad":
                first_bad[i] = step
    return [
        Detection(t_prime=fb if fb is not None else len(p.bad_segment) - 1, error_found=fb is not None,
                  judgements=tuple(log))
        for p, fb, log in zip(pairs, first_bad, logs)
    ]


def revision_turn(sample_id: str, observation: str, config: RevisionConfig) -> Turn:
    """The reflection turn, its phrasing picked by the sample id (stable across rebuilds)."""
    phrase = REVISION_PHRASES[int(sample_id, 16) % len(REVISION_PHRASES)]
    action = CompositeAction(thought=phrase, command=config.noop_command, explanation=REVISION_EXPLANATION)
    return Turn(text=render(action), observation=observation, loss=True, node=None, segment="revision")


def splice(ref: TreeRef, pair: LeafPair, detection: Detection, judge_name: str, config: RevisionConfig) -> Sample:
    """prefix + bad[:t'+1] (no loss) + revision turn + good suffix, as one trajectory."""
    tree = ref.tree
    prefix = pair.good_path[: pair.split]
    bad = pair.bad_segment[: detection.t_prime + 1]
    sid = stable_id("revision", ref.run_id, tree.task.id, pair.good, pair.bad, judge_name)
    turns = [
        *path_turns(tree, prefix, True, "prefix"),
        *path_turns(tree, bad, False, "bad"),
        revision_turn(sid, tree.nodes[pair.ancestor].observation, config),
        *path_turns(tree, pair.good_suffix, True, "good"),
    ]
    turns[-1] = replace(turns[-1], observation=None)
    return Sample(
        id=sid, kind="revision", task=tree_task(ref), turns=tuple(turns), run_id=ref.run_id,
        source={
            "tree_id": ref.tree_id, "task_id": tree.task.id, "good_path": list(pair.good_path),
            "bad_path": list(pair.bad_path), "ancestor": pair.ancestor, "t_prime": detection.t_prime,
            "t_prime_node": pair.bad_segment[detection.t_prime], "error_found": detection.error_found,
            "revision_length": detection.t_prime + 1, "judgements": list(detection.judgements),
            "judge_model": judge_name, "good_reward": _reward(ref, pair.good), "bad_reward": _reward(ref, pair.bad),
        },
    )


def recovery_sample(ref: TreeRef, pair: LeafPair, detection: Detection, judge_name: str) -> Sample:
    """The erroneous prefix through t' (a test item, never trained on) with its replay commands."""
    tree = ref.tree
    node = pair.bad_segment[detection.t_prime]
    path = _path(ref, node)
    turns = path_turns(tree, path, False, "bad")
    return Sample(
        id=stable_id("recovery", ref.run_id, tree.task.id, node, judge_name), kind="recovery",
        task=tree_task(ref), turns=tuple(turns), run_id=ref.run_id,
        source={"tree_id": ref.tree_id, "task_id": tree.task.id, "node": node, "path": list(path),
                "commands": tree.commands(tree.nodes[node]), "error_found": detection.error_found,
                "judge_model": judge_name},
    )


def build_revisions(refs: Sequence[TreeRef], judge: Generator, config: RevisionConfig) -> RevisionBuild:
    """Revision, good and recovery samples for many trees (first errors judged by `judge`)."""
    out = RevisionBuild()
    pairs = [p for i, ref in enumerate(refs) for p in select_pairs(ref, i, config)]
    out.pairs = len(pairs)
    detections = detect_first_errors(refs, pairs, judge, config, out)
    recovery: dict[str, Sample] = {}
    for pair, det in zip(pairs, detections):
        out.revision.append(splice(refs[pair.ref], pair, det, judge.name, config))
        rec = recovery_sample(refs[pair.ref], pair, det, judge.name)
        recovery.setdefault(rec.id, rec)
    out.recovery = list(recovery.values())
    for ref in refs:
        out.good.extend(trajectory_sample(ref, leaf, "good") for leaf in good_leaves(ref, config))
        out.good.extend(rollout_samples(ref, "good"))  # successes that happened in rollouts
    return out


def build_counts(refs: Sequence[TreeRef], config: RevisionConfig, built: RevisionBuild) -> dict[str, int]:
    """What a build found on its way (for saying why it made little or nothing): trees, terminal leaves,
    success leaves (reward above alpha_good) and the trees holding one, leaf pairs, judged first errors."""
    leaves = [(i, n) for i, ref in enumerate(refs) for n in ref.tree.nodes if n.terminal is not None and n.parent]
    good = [(i, v) for i, ref in enumerate(refs) for v in good_leaves(ref, config)]
    return {"trees": len(refs), "leaves": len(leaves), "success_leaves": len(good),
            "trees_with_success": len({i for i, _ in good}), "leaf_pairs": built.pairs,
            "judgements": built.judge_requests, "garbled": built.garbled,
            "judged_errors": sum(1 for s in built.revision if s.source["error_found"]),
            "revision": len(built.revision), "good": len(built.good), "recovery": len(built.recovery)}


def why_little(counts: dict[str, int], config: RevisionConfig) -> str | None:
    """One line saying why a build made no revision trajectory with a judged first error (None when it
    made one), with the counts behind it."""
    c = counts
    if c["judged_errors"]:
        return None
    if not c["trees"]:
        return "nothing built: the run has no trees"
    if not c["success_leaves"]:
        return (f"no revision trajectories: none of the {c['trees']} trees has a success leaf (a terminal leaf with "
                f"reward above alpha_good {config.alpha_good}; {c['leaves']} terminal leaves in all), so no failure "
                "can be paired with a success; search more, or with a model that solves some tasks"
                + (f"; {c['good']} good trajectories from rollouts" if c["good"] else ""))
    if not c["leaf_pairs"]:
        return (f"no revision trajectories: {c['success_leaves']} success leaves in {c['trees_with_success']} of "
                f"{c['trees']} trees, but no failure leaf below them with a reward more than beta_gap "
                f"{config.beta_gap} lower ({c['leaves'] - c['success_leaves']} other terminal leaves); "
                f"{c['good']} good trajectories")
    return (f"no judged first error: the judge read the bad paths of {c['leaf_pairs']} leaf pairs "
            f"({c['judgements']} judgements, {c['garbled']} unreadable) and called no step Bad; "
            f"{c['revision']} revision trajectories without a judged transition point, {c['good']} good trajectories")
