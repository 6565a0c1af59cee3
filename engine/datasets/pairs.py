"""Preference pairs from search trees (Agent Q, arXiv 2408.07199; docs/algorithms.md §3) and the two
baselines' data.

- Step pairs: at EVERY node, every two explored children (N > 0) whose eq. 10 values differ by more
  than theta give (prompt = the agent input at the node, chosen, rejected), with the generation
  log-probs stored on the children (the replay buffer).
- Trajectory pairs (trajectory-level DPO baseline): a successful whole trajectory against a failed
  one of the same task.
- RFT rows (rejection-sampling fine-tuning baseline): the successful trajectories.

Builders are pure functions of trees. Ids are derived from (run, task, kind, node ids), so the same
tree gives the same ids and curation decisions survive a rebuild; alpha and theta decide which pairs
exist, not what a pair is called, so retuning them keeps the decisions on pairs that remain.

Provenance and hygiene (docs/decisions.md "Pairs carry their sources"): every pair carries its
source — run, task, node, both sides' nodes with their Q~ / Q^ / Q and visits, the margin, the model
and seed that proposed each side and whether a person authored it. Two sides that ask the env for
the same command (`command_key`) are never a pair (counted as refused), and pairs with the same
prompt and the same two commands are one pair with several sources (`merge_key`; the store merges
them across runs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.actions import normalize_command
from engine.config import ConfigError
from engine.datasets.distill import best_path_samples
from engine.datasets.samples import (
    Sample,
    TreeRef,
    action_text,
    rollout_samples,
    stable_id,
    to_messages,
    trajectory_sample,
)
from engine.prompts import actor_prompt
from engine.tree_nodes import Node, SearchTree

# Q values are means of rewards mixed with rank scores: 0.4 - 0.3 must not pass theta = 0.1 when
# 0.6 - 0.5 does not, so differences within EPS of theta count as equal to it (not kept).
EPS = 1e-9
PAIR_KINDS = ("step", "trajectory")


@dataclass(frozen=True)
class PairsConfig:
    """alpha: eq. 10 weight of the MCTS value; theta: the minimum value gap (strict);
    trajectory_pairs: at most this many success-vs-failure pairs per task; min_visits: a child is
    compared only when at least this many simulations went through it, so that its Q~ is a mean of
    that many rollouts (with alpha 1 and a margin theta: pairs only at decisive nodes, valued by
    rollouts instead of the critic)."""

    alpha: float = 0.5
    theta: float = field(default=0.1, metadata={"help": "minimum Q gap, strict"})
    trajectory_pairs: int = field(default=4, metadata={"help": "success-vs-failure trajectory pairs per task"})
    min_visits: int = field(default=1, metadata={"help": "simulations through each compared child, at least"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"pairs alpha: must be in [0, 1], got {self.alpha!r}")
        if self.theta < 0:
            raise ConfigError(f"pairs theta: must be >= 0, got {self.theta!r}")
        if self.trajectory_pairs < 0:
            raise ConfigError(f"pairs trajectory_pairs: must be >= 0, got {self.trajectory_pairs!r}")
        if self.min_visits < 1:
            raise ConfigError(f"pairs min_visits: must be >= 1, got {self.min_visits!r}")


@dataclass(frozen=True)
class Pair:
    """One preference pair. Step pairs hold composite action texts in `chosen`/`rejected`;
    trajectory pairs hold JSON-encoded message lists (the turns after the task prompt).
    The curation fields (`status` .. `updated_by`) are filled by the store."""

    id: str
    kind: str
    run_id: str
    tree_id: int | None
    task_id: str
    node_id: int
    chosen_node: int
    rejected_node: int
    prompt: list[dict[str, Any]]
    chosen: str
    rejected: str
    q_chosen: float
    q_rejected: float
    logprob_chosen: float | None
    logprob_rejected: float | None
    depth: int
    merge_key: str = ""  # same prompt and same two commands: the same pair (empty: never merged)
    sources: tuple[dict[str, Any], ...] = ()  # provenance of every build that made it (`source`), its own first
    status: str = "pending"
    version: int = 0
    updated_at: float | None = None
    updated_by: str | None = None

    @property
    def gap(self) -> float:
        return self.q_chosen - self.q_rejected

    @property
    def provenance(self) -> dict[str, Any]:
        """The first source (the build that made the stored row), or {} for a pair stored without one."""
        return self.sources[0] if self.sources else {}

    def messages(self, which: str) -> list[dict[str, str]]:
        """`chosen` or `rejected` as assistant message lists (TRL's conversational form)."""
        text = self.chosen if which == "chosen" else self.rejected
        if self.kind == "trajectory":
            return json.loads(text)
        return [{"role": "assistant", "content": text}]


@dataclass
class PairsBuild:
    """What one build of a run's trees makes: step and trajectory pairs, RFT rows (every successful
    trajectory) and expert-iteration rows (each solved tree's shortest one, engine.datasets.distill)."""

    step: list[Pair] = field(default_factory=list)
    trajectory: list[Pair] = field(default_factory=list)
    rft: list[Sample] = field(default_factory=list)
    exit: list[Sample] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)  # same-command pairs, never built
    merged: int = 0  # duplicates folded into another pair of this build (as its extra sources)

    @property
    def pairs(self) -> int:
        """Step and trajectory pairs (what `save` stores as pairs)."""
        return len(self.step) + len(self.trajectory)

    def counts(self) -> dict[str, int]:
        """What the build made and refused, for a job's progress and the Preference pairs page."""
        return {"step_pairs": len(self.step), "trajectory_pairs": len(self.trajectory),
                "refused_same_command": len(self.refused), "merged_duplicates": self.merged}

    def save(self, store: Any, run_id: str, who: str | None = None) -> tuple[Any, Any]:
        """Pairs and samples in one transaction (both saved or neither); a rebuild replaces the run's
        uncurated rows of these kinds. Returns the two save reports."""
        extra = {"who": who} if who else {}
        with store.transaction():
            pairs = store.save_pairs(run_id, [*self.step, *self.trajectory], **extra)
            samples = store.save_samples([*self.rft, *self.exit], prune_run=run_id, prune_kinds=("rft", "exit"),
                                         **extra)
        return pairs, samples


@dataclass(frozen=True)
class Refusal:
    """A pair that was not built: its two sides ask the env for the same command (`command_key`)."""

    kind: str
    run_id: str
    task_id: str
    node_id: int
    chosen_node: int
    rejected_node: int
    command: str


def command_key(tree: SearchTree, node_id: int) -> str:
    """What the edge into `node_id` asks the env to do: its command after parsing, in the form the
    search's sibling dedupe compares (engine.actions.normalize_command). A format error steps nothing,
    so its key is its text (two different unreadable texts are two different things to learn from)."""
    node = tree.nodes[node_id]
    if node.action is not None and not node.format_error:
        return "command:" + normalize_command(node.action.command)
    return "text:" + (node.raw or "")


def merge_key(kind: str, prompt: list[dict[str, Any]], chosen: object, rejected: object) -> str:
    """The identity of a pair's content: its prompt and the command keys of its two sides."""
    return merge_key_of(kind, prompt_digest(prompt), chosen, rejected)


def prompt_digest(prompt: list[dict[str, Any]]) -> str:
    """The prompt's JSON, hashed once per node (its pairs share it)."""
    return hashlib.sha1(json.dumps(prompt).encode("utf-8", "surrogatepass")).hexdigest()


def merge_key_of(kind: str, digest: str, chosen: object, rejected: object) -> str:
    """`merge_key` from the prompt's digest (20 hex chars, as ids)."""
    text = "\x1f".join((kind, digest, repr(chosen), repr(rejected)))
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def _side(ref: TreeRef, node: Node, q: float, human: bool, name: str) -> dict[str, Any]:
    """One side's provenance fields, named for its role (`name`: chosen or rejected)."""
    return {f"q_{name}": q, f"q_mcts_{name}": node.Q_mcts, f"q_critic_{name}": node.Q_critic,
            f"visits_{name}": node.N, f"model_{name}": None if human else ref.model,
            f"seed_{name}": None if human else ref.seed, f"author_{name}": "human" if human else "policy"}


def source(ref: TreeRef, pair_id: str, node_id: int, chosen: Node, rejected: Node,
           sides: tuple[dict[str, Any], dict[str, Any]], alpha: float) -> dict[str, Any]:
    """One pair's provenance as flat JSON-able fields (the export's provenance columns): where it was
    built, both sides' values, visits, model, seed and author (`human` or `policy`; `_side`), and the margin."""
    return {"pair_id": pair_id, "run_id": ref.run_id, "tree_id": ref.tree_id, "task_id": ref.tree.task.id,
            "node_id": node_id, "chosen_node": chosen.id, "rejected_node": rejected.id, "alpha": alpha,
            "margin": sides[0]["q_chosen"] - sides[1]["q_rejected"], **sides[0], **sides[1]}


SIDE_FIELDS = ("q", "q_mcts", "q_critic", "visits", "model", "seed", "author")
SOURCE_FIELDS = ("pair_id", "run_id", "tree_id", "task_id", "node_id", "chosen_node", "rejected_node", "alpha", "margin",
                 *(f"{k}_{side}" for side in ("chosen", "rejected") for k in SIDE_FIELDS))


def merge_duplicates(pairs: Sequence[Pair]) -> tuple[list[Pair], int]:
    """One pair per `merge_key`, in first-seen order, holding every duplicate's sources after its own;
    and how many were folded in. Pairs without a key are never merged."""
    at: dict[str, int] = {}
    out: list[Pair] = []
    for p in pairs:
        i = at.get(p.merge_key) if p.merge_key else None
        if i is None:
            if p.merge_key:
                at[p.merge_key] = len(out)
            out.append(p)
        else:
            out[i] = replace(out[i], sources=(*out[i].sources, *p.sources))
    return out, len(pairs) - len(out)


def step_pairs(ref: TreeRef, config: PairsConfig, refused: list[Refusal] | None = None) -> list[Pair]:
    """Every (node, winner, loser) with Q(winner) - Q(loser) > theta among children visited at least
    `min_visits` times whose commands differ (a same-command pair goes to `refused`)."""
    tree, alpha, limit = ref.tree, config.alpha, config.theta + EPS
    nodes, task = tree.nodes, tree.task
    out: list[Pair] = []
    for node in nodes:
        explored = [nodes[c] for c in node.children if nodes[c].N >= config.min_visits]
        if len(explored) < 2:
            continue
        values = [c.value(alpha) for c in explored]
        prompt: list[dict[str, Any]] | None = None
        digest = ""
        sides: dict[tuple[int, str], dict[str, Any]] = {}
        texts: dict[int, str] = {}
        commands = {c.id: command_key(tree, c.id) for c in explored}
        for i, a in enumerate(explored):
            for j in range(i + 1, len(explored)):
                if values[i] - values[j] > limit:
                    w, lo, qw, ql = a, explored[j], values[i], values[j]
                elif values[j] - values[i] > limit:
                    w, lo, qw, ql = explored[j], a, values[j], values[i]
                else:
                    continue
                if commands[w.id] == commands[lo.id]:
                    if refused is not None:
                        refused.append(Refusal("step", ref.run_id, task.id, node.id, w.id, lo.id, commands[w.id]))
                    continue
                if prompt is None:
                    prompt = actor_prompt(ref.env_description, task.goal, task.context, tree.history(node),
                                          node.observation)
                    digest = prompt_digest(prompt)
                for n in (w, lo):
                    if n.id not in texts:
                        texts[n.id] = action_text(tree, n.id)
                pid = stable_id("step", ref.run_id, task.id, node.id, w.id, lo.id)
                for n, q, name in ((w, qw, "chosen"), (lo, ql, "rejected")):
                    if (n.id, name) not in sides:
                        sides[n.id, name] = _side(ref, n, q, n.author == "human", name)
                out.append(
                    Pair(
                        id=pid, kind="step", run_id=ref.run_id, tree_id=ref.tree_id, task_id=task.id,
                        node_id=node.id, chosen_node=w.id, rejected_node=lo.id, prompt=prompt,
                        chosen=texts[w.id], rejected=texts[lo.id], q_chosen=qw, q_rejected=ql,
                        logprob_chosen=w.logprob, logprob_rejected=lo.logprob, depth=node.depth,
                        merge_key=merge_key_of("step", digest, commands[w.id], commands[lo.id]),
                        sources=(source(ref, pid, node.id, w, lo, (sides[w.id, "chosen"], sides[lo.id, "rejected"]), alpha),),
                    )
                )
    return out


def _leaves(ref: TreeRef) -> tuple[list[int], list[int]]:
    """(successful, failed) terminal leaves, failed ones lowest reward first."""
    tree = ref.tree
    done = [n for n in tree.nodes if n.terminal is not None and n.parent is not None]
    wins = [n.id for n in done if n.terminal == "success"]
    losses = [n.id for n in sorted(done, key=lambda n: (n.reward or 0.0, n.id)) if n.terminal != "success"]
    return wins, losses


def _path_logprob(ref: TreeRef, leaf: int) -> float | None:
    total = 0.0
    for n in ref.tree.path(ref.tree.nodes[leaf]):
        if n.logprob is None:
            return None
        total += n.logprob
    return total


def _path_keys(tree: SearchTree, leaf: int) -> tuple[str, ...]:
    return tuple(command_key(tree, n.id) for n in tree.path(tree.nodes[leaf]))


def trajectory_pairs(ref: TreeRef, config: PairsConfig, refused: list[Refusal] | None = None) -> list[Pair]:
    """Up to `trajectory_pairs` failed trajectories, each against a successful one (taken in
    turn), both from the task's start: the trajectory-level DPO baseline. A side is human-authored
    when a person added any step of it; two sides with the same commands go to `refused`."""
    wins, losses = _leaves(ref)
    if not wins:
        return []
    tree, out = ref.tree, []
    for i, lose in enumerate(losses[: config.trajectory_pairs]):
        win = wins[i % len(wins)]
        keys = (_path_keys(tree, win), _path_keys(tree, lose))
        if keys[0] == keys[1]:
            if refused is not None:
                refused.append(Refusal("trajectory", ref.run_id, tree.task.id, 0, win, lose, " | ".join(keys[0])))
            continue
        chosen = to_messages(trajectory_sample(ref, win, "rft"))
        rejected = to_messages(trajectory_sample(ref, lose, "rft"))
        n_prompt = 2 if chosen[0]["role"] == "system" else 1
        prompt = [{"role": m["role"], "content": m["content"]} for m in chosen[:n_prompt]]
        pid = stable_id("trajectory", ref.run_id, tree.task.id, win, lose)
        w, lo = tree.nodes[win], tree.nodes[lose]
        qw, ql = w.reward or 0.0, lo.reward or 0.0
        human = [any(n.author == "human" for n in tree.path(leaf)) for leaf in (w, lo)]
        sides = (_side(ref, w, qw, human[0], "chosen"), _side(ref, lo, ql, human[1], "rejected"))
        out.append(
            Pair(
                id=pid, kind="trajectory", run_id=ref.run_id, tree_id=ref.tree_id, task_id=tree.task.id, node_id=0,
                chosen_node=win, rejected_node=lose, prompt=prompt,
                chosen=json.dumps([{"role": m["role"], "content": m["content"]} for m in chosen[n_prompt:]]),
                rejected=json.dumps([{"role": m["role"], "content": m["content"]} for m in rejected[n_prompt:]]),
                q_chosen=qw, q_rejected=ql,
                logprob_chosen=_path_logprob(ref, win), logprob_rejected=_path_logprob(ref, lose), depth=0,
                merge_key=merge_key("trajectory", prompt, keys[0], keys[1]),
                sources=(source(ref, pid, 0, w, lo, sides, config.alpha),),
            )
        )
    return out


def rft_samples(ref: TreeRef) -> list[Sample]:
    """Every successful trajectory, all turns trained (the RFT baseline)."""
    wins, _ = _leaves(ref)
    return [trajectory_sample(ref, leaf, "rft") for leaf in wins] + rollout_samples(ref, "rft")


def build_pairs(refs: Sequence[TreeRef], config: PairsConfig,
                on_tree: Callable[[PairsBuild], None] | None = None) -> PairsBuild:
    """Step pairs, trajectory pairs, RFT and expert-iteration rows for many trees; `on_tree` is told
    the build so far after each tree (a stage's progress). Same-command pairs are refused
    (`PairsBuild.refused`) and duplicates merged into one pair with several sources."""

    out = PairsBuild()
    for ref in refs:
        out.step.extend(step_pairs(ref, config, out.refused))
        out.trajectory.extend(trajectory_pairs(ref, config, out.refused))
        out.rft.extend(rft_samples(ref))
        out.exit.extend(best_path_samples(ref))
        if on_tree is not None:
            on_tree(out)
    out.step, merged_step = merge_duplicates(out.step)
    out.trajectory, merged_trajectory = merge_duplicates(out.trajectory)
    out.merged = merged_step + merged_trajectory
    return out
