"""A store where every text that can come from a model, an env, a server, a job or an imported file
carries a Markdown/HTML payload (image link, <img>, link, bold, <script>), one tag per field, for
tests/dashboard/test_markup.py."""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from doubles import ScriptedGenerator, SnapshotLineEnv, action_text

from engine.config import SearchConfig
from engine.datasets.pairs import PairsConfig, build_pairs
from engine.datasets.refine import EXAMPLE_SCRIPT, EXAMPLE_TRAJECTORY, Persona, Script, check_script, generate
from engine.datasets.revisions import RevisionConfig, build_revisions
from engine.datasets.samples import TreeRef
from engine.envs.base import Step, TaskSpec
from engine.llm.base import Completion, SampleRequest
from engine.search.runner import new_run
from engine.store import Store

# One tag per untrusted field; each payload is unique to its field.
FIELDS = tuple(f"zq{name}" for name in (
    "runname", "goal", "obs", "thought", "raw", "critic", "judge", "judgemodel", "persona", "dmobs", "player",
    "jobname", "joberr", "jobphase", "joblog", "evalmodel", "imported"))


def payload(tag: str) -> str:
    return (f"![{tag}img](http://127.0.0.1:9/{tag}.png) <img src=http://127.0.0.1:9/{tag}i.png> "
            f"[{tag}link](http://127.0.0.1:9/{tag}) **{tag}bold** <script>{tag}js</script>")


P = {tag.removeprefix("zq").upper(): payload(tag) for tag in FIELDS}


class MarkupEnv(SnapshotLineEnv):
    """The line env with a payload in its task goals and in the observation after 'wait'."""

    def __init__(self, n_tasks: int = 4) -> None:
        super().__init__(n_tasks)
        self._tasks = [TaskSpec(id=t.id, goal=f"{P['GOAL']} {t.goal}", context=t.context) for t in self._tasks]

    def step(self, command: str) -> Step:
        step = super().step(command)
        if command.strip().lower() == "wait":
            return Step(f"{P['OBS']} You wait at {self.pos}.", step.reward, step.done, step.progress)
        return step


class MarkupModel(ScriptedGenerator):
    """Actor thoughts, unreadable completions and critic reasons carry payloads."""

    def _actor(self, rng: random.Random) -> Completion:
        if rng.random() < 0.2:
            return Completion(text=f"{P['RAW']} no action here", logprob=-9.0, n_tokens=3)
        command = "right" if rng.random() < self.p_right else rng.choice(["left", "wait"])
        text = action_text(command).replace("THOUGHT: ", f"THOUGHT: {P['THOUGHT']} ", 1)
        return Completion(text=text, logprob=-1.0 - rng.random(), n_tokens=12)

    def _critic(self, prompt: Any) -> Completion:
        c = super()._critic(prompt)
        return Completion(text=c.text.replace("REASON: ", f"REASON: {P['CRITIC']} ", 1), logprob=c.logprob,
                          n_tokens=c.n_tokens)


class MarkupJudge:
    name = P["JUDGEMODEL"]  # a judge's model name can come from a server spec

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        out = []
        for req in requests:
            found = re.search(r"CURRENT ACTION:\n.*?^ACTION: ([^\n]*)", req.prompt[-1]["content"],
                              re.DOTALL | re.MULTILINE)
            bad = found is not None and found.group(1).strip() == "left"
            out.append([Completion(f"REASON: {P['JUDGE']}\nJudgement: {'Bad' if bad else 'Good'}")] * req.n)
        return out


class MarkupRefiner:
    name = "refine-markup"

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        turns = copy.deepcopy(EXAMPLE_TRAJECTORY)
        turns[0]["observation"] = f"{P['DMOBS']} {turns[0]['observation']}"
        turns[2]["observation"] = f"{P['DMOBS']} {turns[2]['observation']}"
        turns[1]["thought"] = f"{P['PLAYER']} {turns[1]['thought']}"
        return [[Completion(json.dumps(turns), n_tokens=50)] * req.n for req in requests]

    def logprobs(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[None]:
        return [None] * len(completions)


def _failed_job(store: Store, kind: str, config: dict[str, Any]) -> None:
    """A failed job of `kind` with payloads in its name, phase, error and log."""
    job = store.create_job(kind, config, "cpu", name=P["JOBNAME"])
    store.claim_next_job("cpu")
    store.update_job_progress(job.id, {"step": 1, "total": 2, "phase": P["JOBPHASE"]})
    store.finish_job(job.id, "failed", error=f"{P['JOBERR']}\nsecond line")
    Path(job.log_path).parent.mkdir(parents=True, exist_ok=True)
    Path(job.log_path).write_text(f"starting\n{P['JOBLOG']}\n", encoding="utf-8")


def build_markup_store(path: Path) -> dict[str, str]:
    """One search run (named with a payload) and everything built from it, a failed job with payloads
    in its name, error and log, and an evaluation of a model named with a payload."""
    with Store(path) as store:
        env = MarkupEnv()
        run_id, _ = new_run(store, "line", env.tasks()[1:4], MarkupModel(p_right=0.5),
                            SearchConfig(simulations=10, k=3, depth_limit=4), P["RUNNAME"], make_env=MarkupEnv)
        refs = [TreeRef(store.load_tree(tid), run_id, tid, env.describe()) for tid, _ in store.tree_ids(run_id)]
        built = build_pairs(refs, PairsConfig())
        store.save_pairs(run_id, [*built.step, *built.trajectory])
        revisions = build_revisions(refs, MarkupJudge(), RevisionConfig()).samples
        for sample in revisions:  # what an imported file may hold where the engine writes numbers
            sample.source.update(ancestor=P["IMPORTED"], good_reward=P["IMPORTED"])
        store.save_samples(revisions)
        script = check_script(EXAMPLE_SCRIPT)
        assert isinstance(script, Script)
        result = generate(MarkupRefiner(), [Persona("p", f"{P['PERSONA']} A baker.")], scripts=[script])
        assert result.samples, result.failures
        verification = result.samples[0].source["verification"]
        verification.update(corrections=P["IMPORTED"], continuations=P["IMPORTED"])
        verification["evaluations"][0]["error"] = P["IMPORTED"]
        store.save_samples(result.samples)
        job = store.create_job("probe", {"steps": 1}, "cpu", name=P["JOBNAME"])
        store.claim_next_job("cpu")
        store.update_job_progress(job.id, {"step": 1, "total": 2, "phase": P["JOBPHASE"]})
        store.finish_job(job.id, "failed", error=f"{P['JOBERR']}\nsecond line")
        Path(job.log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(job.log_path).write_text(f"starting\n{P['JOBLOG']}\n", encoding="utf-8")
        for kind, config in (("search", {"env": "line", "name": P["RUNNAME"]}), ("pairs", {"run": run_id}),
                             ("revisions", {"run": run_id, "model": "tiny"}), ("eval", {"model": P["EVALMODEL"]})):
            _failed_job(store, kind, config)  # what the Runs, Data and Evaluation pages' job panels show
        store.save_evaluation(P["EVALMODEL"], "line", "test", ["goal-1"], "greedy", {},
                              {"success": {"mean": 0.5, "low": 0.0, "high": 1.0}, "episodes": 1}, [])
        return {"run": run_id, "job": job.id}
