"""The shared model of an SFT sample: one task and the agent's turns, each with its own loss flag.

WHY one model: Agent-R revision trajectories, good trajectories, RFT rows, recovery prefixes,
AgentRefine refinement chats and imported AgentGym files are all "a task, then assistant turns each
followed by what the world answered", differing only in which turns carry loss. One model means one
store table, one curation UI (per-turn loss toggles) and one set of renderers:

- `to_messages`: multi-turn chat with a per-message `train` flag (docs/algorithms.md §6);
- `to_conversations`: AgentGym style `{from, value, loss}` (human turns `loss: null`);
- `to_step_rows`: one prompt/completion row per trainable turn, in the exact `actor_prompt` format
  the policy sees at inference, where older observations are dropped (docs/algorithms.md §1).

User messages are the observation texts verbatim, so imported chats render back unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.actions import FormatError, parse
from engine.prompts import HistoryStep, actor_prompt
from engine.tree_nodes import SearchTree

KINDS = ("revision", "good", "rft", "recovery", "refine", "imported", "exit", "visits", "correction", "hindsight")
STATUSES = ("pending", "approved", "rejected", "edited")


class DatasetError(ValueError):
    """A user-facing problem with dataset input or output (printed by the CLI as one line)."""


def stable_id(*parts: object) -> str:
    """A content-derived id (20 hex chars of sha1) so rebuilding the same data yields the same ids
    and curation decisions stay attached to their rows."""
    text = "\x1f".join(repr(p) for p in parts)
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


@dataclass(frozen=True)
class TreeRef:
    """A tree with the labels builders need but the tree does not carry: which run and store row it
    belongs to, the env description that was in the actor's system prompt, and the run's model and
    seed (from its settings)."""

    tree: SearchTree
    run_id: str
    tree_id: int | None = None
    env_description: str = ""
    model: str | None = None  # the run's model and seed: who proposed the tree's policy nodes (pair provenance)
    seed: int | None = None


def tree_refs(store: Any, run_id: str, description: str) -> list[TreeRef]:
    """The run's committed trees as TreeRefs (what the pairs and revisions builders read), with
    `description`, the env description their prompts used."""
    refs = []
    info = store.run(run_id)
    seed = info.config.get("seed")
    for tree_id, _ in store.tree_ids(run_id):
        tree = store.load_tree(tree_id)
        if tree is not None:
            refs.append(TreeRef(tree=tree, run_id=run_id, tree_id=tree_id, env_description=description,
                                model=info.model, seed=seed if isinstance(seed, int) else None))
    return refs


@dataclass(frozen=True)
class Task:
    """What the agent was given. `system` is the full system message; `first_observation` is the
    env's first answer (for an imported chat: the whole first user message, with `goal` empty)."""

    id: str = ""
    goal: str = ""
    context: str = ""
    first_observation: str = ""
    system: str = ""

    def first_user_message(self) -> str:
        if not self.goal:
            return self.first_observation
        block = f"TASK: {self.goal}"
        if self.context.strip():
            block += f"\n{self.context.strip()}"
        return f"{block}\n\n{self.first_observation}"


@dataclass(frozen=True)
class Turn:
    """One assistant turn and the answer that followed it (None: no message followed).

    `loss`: True = train on it, False = never (an erroneous turn), None = not specified (trained,
    as AgentGym does for its `gpt` turns). `node` is the tree node it came from, `segment` the part
    of a revision trajectory it belongs to ("prefix", "bad", "revision", "good"), for display."""

    text: str
    observation: str | None = None
    loss: bool | None = True
    node: int | None = None
    segment: str = ""

    @property
    def trains(self) -> bool:
        return self.loss is not False


@dataclass(frozen=True)
class Sample:
    id: str
    kind: str
    task: Task
    turns: tuple[Turn, ...]
    run_id: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"  # curation fields, filled by the store
    version: int = 0
    updated_at: float | None = None
    updated_by: str | None = None

    def data(self) -> dict[str, Any]:
        """The JSON-able trajectory (what the store keeps in `samples.data`)."""
        return {
            "task": self.task.__dict__.copy(),
            "turns": [t.__dict__.copy() for t in self.turns],
        }

    @classmethod
    def from_data(cls, id: str, kind: str, data: dict[str, Any], **fields: Any) -> Sample:
        return cls(id=id, kind=kind, task=Task(**data["task"]), turns=tuple(Turn(**t) for t in data["turns"]),
                   **fields)


# --- renderers ---------------------------------------------------------------------------------


def to_messages(sample: Sample) -> list[dict[str, Any]]:
    """Chat messages with `train` on assistant messages (bool) and None on the others."""
    out: list[dict[str, Any]] = []
    if sample.task.system:
        out.append({"role": "system", "content": sample.task.system, "train": None})
    out.append({"role": "user", "content": sample.task.first_user_message(), "train": None})
    for turn in sample.turns:
        out.append({"role": "assistant", "content": turn.text, "train": turn.trains})
        if turn.observation is not None:
            out.append({"role": "user", "content": turn.observation, "train": None})
    return out


def to_conversations(sample: Sample) -> list[dict[str, Any]]:
    """AgentGym `conversations`. AgentGym has no system role: the system text opens the first
    human message, as AgentGym's own instruction turns do."""
    first = sample.task.first_user_message()
    if sample.task.system:
        first = f"{sample.task.system}\n\n{first}"
    out: list[dict[str, Any]] = [{"from": "human", "value": first, "loss": None}]
    for turn in sample.turns:
        out.append({"from": "gpt", "value": turn.text, "loss": turn.loss})
        if turn.observation is not None:
            out.append({"from": "human", "value": turn.observation, "loss": None})
    return out


def to_step_rows(sample: Sample) -> list[dict[str, Any]]:
    """One conversational prompt/completion row per trainable turn, the prompt built by
    `actor_prompt` from the earlier turns (actions only) and the latest observation.

    Turns whose text is not a composite action (format errors) are left out of later histories,
    exactly as search left them out; such a turn may not itself be trainable here."""
    history: list[HistoryStep] = []
    observation = sample.task.first_observation
    rows = []
    for i, turn in enumerate(sample.turns):
        parsed = parse(turn.text)
        if turn.trains:
            if isinstance(parsed, FormatError):
                raise DatasetError(
                    f"sample {sample.id} turn {i} is not a composite action ({parsed.reason}); "
                    "per-step rows need Orchard's action format: export it as messages instead"
                )
            prompt = actor_prompt("", sample.task.goal, sample.task.context, history, observation)
            prompt[0] = {"role": "system", "content": sample.task.system}
            rows.append(
                {
                    "id": f"{sample.id}:{i}",
                    "sample_id": sample.id,
                    "kind": sample.kind,
                    "step": i,
                    "prompt": prompt,
                    "completion": [{"role": "assistant", "content": turn.text}],
                }
            )
        if not isinstance(parsed, FormatError):
            history.append(HistoryStep(parsed, turn.observation or ""))
        observation = turn.observation or ""
    return rows


# --- from trees --------------------------------------------------------------------------------


def system_prompt(env_description: str) -> str:
    """The actor's system message for an env (the same text search used)."""
    return actor_prompt(env_description, "", "", [], "")[0]["content"]


def tree_task(ref: TreeRef) -> Task:
    tree = ref.tree
    return Task(
        id=tree.task.id,
        goal=tree.task.goal,
        context=tree.task.context,
        first_observation=tree.root.observation,
        system=system_prompt(ref.env_description),
    )


def action_text(tree: SearchTree, node_id: int) -> str:
    """`SearchTree.action_text`, or a DatasetError naming the node that has neither text nor action."""
    text = tree.action_text(node_id)
    if text is None:
        raise DatasetError(f"task {tree.task.id} node {node_id}: neither a completion nor an action")
    return text


def path_turns(tree: SearchTree, path: Sequence[int], loss: bool | None, segment: str) -> list[Turn]:
    """Turns for consecutive tree nodes (each with the observation the env gave after it)."""
    return [
        Turn(text=action_text(tree, nid), observation=tree.nodes[nid].observation, loss=loss, node=nid,
             segment=segment)
        for nid in path
    ]


def rollout_samples(ref: TreeRef, kind: str) -> list[Sample]:
    """Whole trajectories of the simulations whose ROLLOUT succeeded: the tree path, then the
    rollout's own steps (kept with the simulation, as they are not tree nodes), loss on every
    turn. One per distinct trajectory (a repeated rollout is one row)."""
    tree, out, seen = ref.tree, [], set()
    for index, sim in enumerate(ref.tree.simulations):
        if not sim.turns:
            continue
        path = list(sim.path)
        turns = path_turns(tree, path, True, "good")
        turns += [Turn(text=text, observation=obs, loss=True, segment="good") for text, obs in sim.turns]
        turns[-1] = replace(turns[-1], observation=None)
        key = (tuple(path), tuple(t.text for t in turns))
        if key in seen:
            continue
        seen.add(key)
        out.append(Sample(
            id=stable_id(kind, ref.run_id, tree.task.id, "rollout", *path, *(t.text for t in turns[len(path):])),
            kind=kind,
            task=tree_task(ref),
            turns=tuple(turns),
            run_id=ref.run_id,
            source={"tree_id": ref.tree_id, "task_id": tree.task.id, "path": path, "simulation": index,
                    "rollout": list(sim.rollout), "reward": sim.reward, "terminal": "success"},
        ))
    return out


def trajectory_sample(ref: TreeRef, leaf: int, kind: str) -> Sample:
    """A whole root-to-`leaf` trajectory with loss on every turn (RFT rows, Agent-R good ones).
    The last observation is dropped so the chat ends on the assistant."""
    tree = ref.tree
    path = [n.id for n in tree.path(tree.nodes[leaf])]
    turns = path_turns(tree, path, True, "good")
    turns[-1] = replace(turns[-1], observation=None)
    node = tree.nodes[leaf]
    return Sample(
        id=stable_id(kind, ref.run_id, tree.task.id, leaf),
        kind=kind,
        task=tree_task(ref),
        turns=tuple(turns),
        run_id=ref.run_id,
        source={"tree_id": ref.tree_id, "task_id": tree.task.id, "path": path, "reward": node.reward,
                "terminal": node.terminal},
    )
