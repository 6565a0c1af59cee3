"""The data-build stages of a run: pairs, revisions and refinement data; their job specs and bodies.

The CLI's `orchard pairs build` / `revisions build` / `refine generate`, the Data pages' forms and
the job worker all run a build through these bodies with one of these specs. A job's JSON is a
spec's fields (left-out fields take their defaults), read by the one config loader
(engine.config.from_dict). Each body reports its units (trees, trees, personas) with an ETA through
its Reporter and stops at the next unit when a cancel is requested (`Cancelled`).
"""

from __future__ import annotations

import getpass
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError
from engine.datasets.pairs import PairsConfig
from engine.datasets.refine import RefineConfig
from engine.datasets.revisions import RevisionConfig
from engine.progress import Reporter, StageResult, Units

if TYPE_CHECKING:
    from engine.datasets.samples import TreeRef
    from engine.llm.base import Generator
    from engine.store import Store

REVISION_CHUNK = 8  # trees judged together: one batch of judge requests per step index across them


def who_am_i() -> str:
    """The curator name a build from this machine's user records (`orchard` where there is none)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "orchard"


def _required_text(kind: str, name: str, value: str) -> None:
    if not value.strip():
        raise ConfigError(f"{kind} job: field {name!r} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class PairsJob:
    """Step pairs, trajectory pairs and RFT rows of `run`; a setting left None takes PairsConfig's
    default (`alpha`: the run's own)."""

    run: str
    alpha: float | None = None
    theta: float | None = None
    trajectory_pairs: int | None = None
    min_visits: int | None = None

    def __post_init__(self) -> None:
        _required_text("pairs", "run", self.run)
        self.settings(0.5)  # the ranges: a bad theta is refused when the job is made

    def settings(self, run_alpha: float) -> PairsConfig:
        given = {k: getattr(self, k) for k in ("alpha", "theta", "trajectory_pairs", "min_visits")
                 if getattr(self, k) is not None}
        return PairsConfig(**{"alpha": run_alpha, **given})


@dataclass(frozen=True, kw_only=True)
class RevisionsJob(RevisionConfig):
    """Revision, good and recovery samples of `run`, first errors judged by `model`; the other
    fields are RevisionConfig's (a revisions job's JSON is flat)."""

    run: str
    model: str

    def __post_init__(self) -> None:
        super().__post_init__()
        _required_text("revisions", "run", self.run)
        _required_text("revisions", "model", self.model)

    @property
    def settings(self) -> RevisionConfig:
        return RevisionConfig(**{f.name: getattr(self, f.name) for f in fields(RevisionConfig)})


@dataclass(frozen=True)
class RefineJob:
    """`n` AgentRefine personas verified into a JSONL file `out` (default: a dated file under the
    runs folder) by `model`; `seed` (when set) overrides `refine.seed`."""

    model: str
    n: int = 30
    out: str | None = None
    personas: str | None = None
    seed: int | None = None
    refine: RefineConfig = field(default_factory=RefineConfig)

    def __post_init__(self) -> None:
        _required_text("refine", "model", self.model)
        if self.n < 1:
            raise ConfigError(f"refine job: field 'n' must be an integer >= 1, got {self.n!r}")

    def check(self) -> None:
        if self.out is not None and Path(self.out).is_dir():
            raise ConfigError(f"refine job: field 'out' must be a file name, got {self.out!r}")
        if self.personas is not None and not Path(self.personas).expanduser().is_file():
            raise ConfigError(f"refine job: field 'personas' must name a JSONL file, got {self.personas!r}")

    @property
    def offline(self) -> bool:
        """`model` is `offline`: the scripted synthesizer (engine/datasets/refine_offline.py), no LLM."""
        from engine.datasets.refine_offline import is_offline

        return is_offline(self.model)

    @property
    def settings(self) -> RefineConfig:
        from dataclasses import replace

        return self.refine if self.seed is None else replace(self.refine, seed=self.seed)


# ------------------------------------------------------------------ bodies


def run_trees(store: Store, run_id: str) -> list[TreeRef]:
    """The run's committed trees as TreeRefs, with the env description their prompts used."""
    from engine.datasets.samples import tree_refs
    from engine.envs.base import close_env
    from engine.envs.registry import env_factory

    env = env_factory(store.run(run_id).env)()
    try:
        description = env.describe()
    finally:
        close_env(env)
    return tree_refs(store, run_id, description)


def rollout_only_hint(refs: list[Any], threshold: float) -> str | None:
    """Why whole-trajectory data came out empty when the search did succeed: runs stored before
    rollout steps were kept have, for a success that happened in a rollout, only its commands."""
    wins = sum(1 for ref in refs for sim in ref.tree.simulations
               if sim.reward >= threshold and sim.rollout and not sim.turns)
    leaves = sum(1 for ref in refs for n in ref.tree.nodes if n.terminal is not None and (n.reward or 0) >= threshold)
    if wins and not leaves:
        return (f"note: {wins} simulations succeeded in rollouts stored without their steps (a run from an "
                "older Orchard), and no tree leaf is a success, so no whole successful trajectory exists "
                "here; search again to keep the rollouts' steps")
    return None


def run_pairs(store: Store, spec: PairsJob, reporter: Reporter, who: str | None = None) -> StageResult:
    """Step pairs, trajectory pairs and RFT rows of a run (docs/algorithms.md §3); unit: one tree.
    Saved in one transaction at the end (a build replaces the run's uncurated pairs as a whole)."""
    from engine.datasets.pairs import build_pairs

    run_id = store.find_run(spec.run)
    config = spec.settings(store.run(run_id).config.get("alpha", 0.5))
    refs = run_trees(store, run_id)
    units = Units(reporter, "pairs", len(refs), run_id=run_id)
    built = build_pairs(refs, config, on_tree=lambda so_far: units.step(pairs=so_far.pairs))
    pairs, rft = built.save(store, run_id, who=who or who_am_i())
    lines = [(f"run {run_id}: {len(refs)} trees -> {len(built.step)} step pairs, {len(built.trajectory)} trajectory "
             f"pairs (alpha={config.alpha}, theta={config.theta}), {len(built.rft)} RFT rows, "
             f"{len(built.exit)} expert-iteration rows"),
             f"pairs: {pairs}; RFT and expert-iteration rows: {rft}; db {store.path}"]
    if built.refused or built.merged or pairs.merged:
        lines.append(f"hygiene: {len(built.refused)} pairs refused (both sides the same command), "
                     f"{built.merged} duplicates merged within the run, {pairs.merged} merged into other runs' "
                     "same pairs (as more sources)")
    hint = None if built.rft else rollout_only_hint(refs, 1.0)
    lines += [hint] if hint else []
    # the Preference pairs page says what the build refused and merged (dashboard.builders.build_outcome)
    units.extra.update(counts={**built.counts(), "merged_into_other_runs": pairs.merged})
    units.finish()
    return StageResult(run_id, lines)


def run_revisions(store: Store, spec: RevisionsJob, reporter: Reporter, who: str | None = None,
                  judge: Generator | None = None) -> StageResult:
    """Revision, good and recovery samples of a run, first errors judged by `spec.model`
    (docs/algorithms.md §4); unit: one tree. Rows are saved per chunk of `REVISION_CHUNK` trees
    as they are judged (the Trajectories page fills while it runs); the last save prunes the
    uncurated rows of an earlier build that this one no longer makes."""
    from engine.datasets.revisions import RevisionBuild, build_counts, build_revisions, why_little
    from engine.llm.registry import load_generator

    run_id = store.find_run(spec.run)
    config = spec.settings
    refs = run_trees(store, run_id)
    judge = judge or load_generator(spec.model, log=reporter.log)
    who = who or who_am_i()
    units = Units(reporter, "revisions", len(refs), run_id=run_id)
    total = RevisionBuild()
    for start in range(0, len(refs), REVISION_CHUNK):
        units.check()
        chunk = refs[start:start + REVISION_CHUNK]
        built = build_revisions(chunk, judge, config)
        store.save_samples(built.samples, who=who)
        for name in ("revision", "good", "recovery"):
            getattr(total, name).extend(getattr(built, name))
        for name in ("pairs", "judge_calls", "judge_requests", "garbled"):
            setattr(total, name, getattr(total, name) + getattr(built, name))
        units.step(len(chunk), samples=len(total.samples))
    report = store.save_samples(total.samples, prune_run=run_id, prune_kinds=("revision", "good", "recovery"), who=who)
    found = sum(1 for s in total.revision if s.source["error_found"])
    lines = [(f"run {run_id}: {len(refs)} trees -> {len(total.revision)} revision trajectories ({found} with a "
             f"judged error), {len(total.good)} good trajectories, {len(total.recovery)} recovery prefixes; "
             f"judge {judge.name}: {total.judge_calls} batched calls, {total.judge_requests} judgements, "
             f"{total.garbled} garbled"),
             f"samples: {report}; db {store.path}"]
    hint = None if total.good else rollout_only_hint(refs, 1.0)
    lines += [hint] if hint else []
    counts = build_counts(refs, config, total)
    note = why_little(counts, config)
    lines += [note] if note else []
    units.extra.update(counts=counts, note=note)  # the Trajectories page says why a build made nothing
    units.finish()
    return StageResult(run_id, lines)


def refine_generator(spec: RefineJob, personas: list[Any], log: Any = print) -> Generator:
    """The generator a refine build asks: the offline synthesizer for `offline`, else the model the
    spec names, refused BEFORE its weights load when the pipeline's prompts cannot fit its positions
    (a GeneratorError naming the prompt's tokens and the model's positions: one line)."""
    from engine.datasets.refine import EXAMPLE_SCRIPT, Script, check_script, script_prompt, trajectory_prompt
    from engine.llm.base import GeneratorError
    from engine.llm.registry import load_generator, local_model_dir

    if spec.offline:
        from engine.datasets.refine_offline import OfflineRefineGenerator

        return OfflineRefineGenerator()
    folder = local_model_dir(spec.model, log=log)
    if folder is not None:
        from engine.llm.hf import prompt_fit

        c = spec.settings
        example = check_script(EXAMPLE_SCRIPT, c)
        prompts = [(script_prompt(p, c), c.script_max_tokens) for p in {p.persona: p for p in personas}.values()]
        if isinstance(example, Script):  # the shortest trajectory prompt a model's script can make, about
            prompts.append((trajectory_prompt(example, c), c.trajectory_max_tokens))
        misfit = prompt_fit(folder, prompts)
        if misfit is not None:
            n, new, positions = misfit
            raise GeneratorError(
                f"model {spec.model.strip()!r}: a refine prompt of {n} tokens + {new} new tokens exceeds the model's "
                f"{positions} positions; use a model with a longer context (or smaller script_max_tokens / "
                f"trajectory_max_tokens), or --model offline (TextCraft's scripted synthesizer, no LLM)")
    return load_generator(spec.model, log=log)


def run_refine(spec: RefineJob, reporter: Reporter, generator: Generator | None = None, store: Store | None = None,
               who: str | None = None) -> StageResult:
    """AgentRefine refinement data (docs/algorithms.md §5) into a JSONL file and, with `store`, the
    store's samples (kind "refine", saved after every batch as they are verified: the Refinement page
    fills while it runs; curated rows are kept); unit: one persona (verified or dropped). Rows stream
    to `OUT.partial`, renamed into place when complete, so a cancel keeps what was verified there and
    never touches an existing OUT."""
    from engine.datasets.refine import (
        DEFAULT_PERSONAS,
        generate,
        load_personas,
        sample_personas,
        summary,
        to_row,
    )
    from engine.paths import runs_dir
    from engine.store import SaveReport

    settings = spec.settings
    personas = sample_personas(load_personas(spec.personas or DEFAULT_PERSONAS), spec.n, settings.seed)
    out = Path(spec.out) if spec.out else runs_dir() / f"refine-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name")
    generator = generator or refine_generator(spec, personas, log=reporter.log)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.partial")
    written = 0
    unsaved: list[Any] = []
    saved = SaveReport()  # the batches' saves added up
    who = who or who_am_i()
    units = Units(reporter, "refine", len(personas))

    def save() -> None:
        if store is not None and unsaved:
            # one row per id: two personas may yield the same chat (ids hash the content, engine.datasets.samples)
            report = store.save_samples(list({s.id: s for s in unsaved}.values()), who=who)
            for name, value in vars(report).items():
                setattr(saved, name, getattr(saved, name) + value)
        unsaved.clear()

    try:
        with partial.open("w", encoding="utf-8") as f:

            def write(sample: Any) -> None:
                nonlocal written
                f.write(json.dumps(to_row(sample), ensure_ascii=False) + "\n")
                f.flush()
                written += 1
                unsaved.append(sample)

            def on_batch(stats: Any) -> None:
                save()
                units.step(stats.rows + stats.failed - units.done, rows=stats.rows, failed=stats.failed)

            result = generate(generator, personas, settings, on_sample=write, on_batch=on_batch)
        save()
        units.finish()
    except BaseException:
        if written:
            reporter.log(f"refine: stopped; the {written} verified rows so far are in {partial}"
                         + (" and the store" if store is not None else ""))
        else:
            partial.unlink(missing_ok=True)
        raise
    os.replace(partial, out)
    stats = result.stats.to_dict()
    stats_path = out.with_name(out.name.removesuffix(".jsonl") + ".stats.json")
    stats_path.write_text(
        json.dumps({"model": generator.name, "personas": [p.id for p in personas], "config": asdict(settings),
                    "stats": stats, "failures": result.failures}, indent=1, ensure_ascii=False),
        encoding="utf-8",
    )
    lines = [*summary(stats), f"wrote {out} ({stats['rows']} rows) and {stats_path}"]
    if store is not None:
        lines.append(f"samples: {saved}; db {store.path}")
    return StageResult(str(out), lines)

