"""Iterated training loops: Agent Q's Algorithm 1 (arXiv 2408.07199) and Agent-R's iterative self-training
(arXiv 2501.11425).

Agent Q (docs/algorithms.md §3, Algorithm 1), per iteration: pi_ref <- the current policy; sample B train tasks;
MCTS with the current policy (actor, critic, rollouts); step pairs from the trees (eq. 10, theta);
DPO with the replay buffer's log-probs as the reference (they come from pi_ref, which generated
them); evaluate on held-out tasks; the trained model is the next policy.

Agent-R (docs/algorithms.md §4.3), per iteration: MCTS with the current model; first errors judged by the CURRENT
model; revision trajectories + good trajectories mixed with a rising revision share; SFT; evaluate.

Expert iteration ("exit", docs/algorithms.md §3.5), per iteration: MCTS with the current policy; each
solved tree's shortest successful trajectory becomes SFT rows (search's own choices as targets,
`engine.datasets.distill`); SFT; evaluate. "visits" trains toward the MCTS visit distribution at
every well-visited node instead.

Promotion gate (`engine.train.gate`): a trained candidate becomes the next policy only when it beats the
current one on `gate_split` (val: tasks held out of every search and of the evaluation) by a paired
interval above 0; otherwise the next iteration searches with the current policy again. With
`accumulate` (exit / visits), every candidate trains from the loop's base policy on the rows of all
the loop's iterations so far (ReST-EM), so a gated-out iteration's data is not lost.

Curation gate: a loop trains only on rows with a final label (approved / edited, by the store's
final-label rule) unless `include_pending` is set, in which case rows nobody has decided are used
too (rejected and unsettled rows never are). Every iteration records how many rows it trained on and
how many uncurated rows it included or left out. Every iteration's run, data counts, model folder and
scores are recorded (`Store.save_iteration`), with the model lineage in `models` and the scores in
`evaluations`.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError, SearchConfig, from_dict
from engine.datasets.samples import tree_refs
from engine.progress import Cancelled, MemoryReporter, Reporter, Units, Within
from engine.train.common import default_output_dir

if TYPE_CHECKING:
    from engine.evaluate import EvalConfig
    from engine.store import Store

METHODS = ("exit", "exit-mcts", "exit-sampled", "agentq", "agentr", "visits")
DISTILL_METHODS = ("exit", "exit-mcts", "exit-sampled", "visits")
PLAY_METHODS = ("exit-mcts", "exit-sampled")  # data collection by play_run on the greedy failures


@dataclass(frozen=True)
class IterateConfig:
    """A loop. `search`, `dpo`, `sft`, `eval` hold overrides of SearchConfig, DPOTrainConfig,
    SFTTrainConfig and EvalConfig. `revision_shares[i]` is iteration i's revision share (the last
    one repeats). `eval_tasks`: a range or ids within `eval_split` ("" = the whole split).
    `first_iteration`: the index of the first iteration run (a loop continued under its `name` by
    another job — the dashboard's "Next iteration" — numbers on from its last one)."""

    method: str = field(default="exit", metadata={
        "help": "exit: expert iteration (SFT on each solved tree's shortest successful path; the measured "
                "default), exit-mcts: expert iteration from MCTS at inference played on the tasks greedy fails, "
                "exit-sampled: the same from N sampled episodes of each task greedy fails (a Monte Carlo tree), "
                "agentq: DPO on step pairs, agentr: SFT on revisions, visits: SFT toward MCTS visit counts",
        "choices": METHODS})
    model: str = field(default="tiny", metadata={"help": "starting policy: tiny | PATH | hf:PATH | vllm:PATH[?opts] "
                                                         "(one vLLM engine for the loop, each policy reloaded into it, "
                                                         "asleep while the loop trains unless ?sleep=0)"})
    env: str = field(default="textcraft", metadata={"help": "environment"})
    iterations: int = field(default=1, metadata={"help": "iterations"})
    tasks_per_iteration: int = field(default=8, metadata={"help": "B train tasks per iteration"})
    train_split: str = "train"
    eval_split: str = "test"
    eval_tasks: str = field(default="", metadata={"help": "range/ids in the test split (default all)"})
    seed: int = field(default=0, metadata={"help": "loop seed"})
    theta: float = 0.1
    min_visits: int = 1  # PairsConfig.min_visits (agentq): compare children visited this often only
    include_pending: bool = field(default=False, metadata={
        "help": "also train on rows nobody has curated (by default only approved / edited rows are used)"})
    gate_split: str = field(default="val", metadata={
        "help": "tasks held out of search and evaluation on which a trained policy must beat the current one "
                "before the loop continues with it (an env without this split: every 10th train task); '' promotes "
                "every trained policy, which can make the loop's policy worse"})
    gate_confidence: float = field(default=0.8, metadata={
        "help": "the gate promotes when this paired interval of the success gain lies above 0"})
    accumulate: bool | None = field(default=None, metadata={
        "help": "exit / visits: train each candidate from the loop's base policy on the rows of every iteration so "
                "far (ReST-EM); default on for exit / visits, not offered for agentq / agentr"})
    evaluate_base: bool = True
    revision_shares: tuple[float, ...] = (0.25, 0.5, 0.75)
    output_root: str | None = None
    name: str | None = field(default=None, metadata={"help": "loop id"})
    first_iteration: int = field(default=1, metadata={"help": "number of the first iteration (a continued loop)"})
    search: dict[str, Any] = field(default_factory=dict)
    dpo: dict[str, Any] = field(default_factory=dict)
    sft: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    distill: dict[str, Any] = field(default_factory=dict)
    play: dict[str, Any] = field(default_factory=dict)  # exit-mcts / exit-sampled: EvalConfig overrides of the play
    corrections: int = field(default=0, metadata={
        "help": "exit-mcts / exit-sampled: also train on search-labelled corrections, the first N failing steps of "
                "each greedy failure labelled with a played win's step the env verified (0: off; measured worse than off on "
                "val, docs/experiments.md 2026-12-05)"})

    renamed: int = field(default=0, metadata={
        "help": "distilling methods: also N copies of each trajectory trained on, each with the env's entity names "
                "swapped consistently (envs that can rename: TextCraft), so the policy reads recipes instead of "
                "memorising them by name (0: off; measured: no gain on test, docs/experiments.md 2026-12-06)"})

    def __post_init__(self) -> None:
        checks = {
            "method": self.method in METHODS,
            "iterations": self.iterations >= 1,
            "first_iteration": self.first_iteration >= 1,
            "tasks_per_iteration": self.tasks_per_iteration >= 1,
            "theta": self.theta >= 0,
            "min_visits": self.min_visits >= 1,
            "revision_shares": bool(self.revision_shares) and all(0 < s <= 1 for s in self.revision_shares),
            "gate_confidence": 0 < self.gate_confidence < 1,
            "accumulate": not (self.accumulate and self.method not in DISTILL_METHODS),
            "corrections": self.corrections >= 0 and not (self.corrections and self.method not in PLAY_METHODS),
            "renamed": self.renamed >= 0 and not (self.renamed and self.method not in DISTILL_METHODS),
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"IterateConfig.{name}: invalid value {getattr(self, name)!r}")
        self.search_config()
        self.dpo_config()
        self.sft_config()
        self.eval_config()
        self.distill_config()
        self.play_config()

    def check_env(self, env: Any) -> None:
        """What the config asks of the env it will run on (checked before anything runs, and by the Loop form)."""
        from engine.envs.base import SupportsRenaming

        if self.renamed and not isinstance(env, SupportsRenaming):
            raise ConfigError(f"IterateConfig.renamed: env {self.env!r} cannot rename its entities; use 0")

    @property
    def accumulates(self) -> bool:
        """Whether candidates train from the loop's base on every iteration's rows (see `accumulate`)."""
        return self.method in DISTILL_METHODS if self.accumulate is None else self.accumulate

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "iterate config") -> IterateConfig:
        """engine.config.from_dict for this class (types checked, unknown keys named)."""
        return from_dict(cls, data, where=where)

    def search_config(self) -> SearchConfig:
        return from_dict(SearchConfig, {"seed": self.seed, **self.search}, where="iterate search")

    def dpo_config(self) -> Any:
        from engine.train.dpo import DPOTrainConfig

        return DPOTrainConfig.from_dict({"include_pending": self.include_pending, "seed": self.seed, **self.dpo},
                                        where="iterate dpo")

    def sft_config(self) -> Any:
        from engine.train.sft import SFTTrainConfig

        kinds = {"kinds": (self.row_kind, *(("correction",) if self.corrections else ()))} \
            if self.method in DISTILL_METHODS else {}
        return SFTTrainConfig.from_dict({"include_pending": self.include_pending, "seed": self.seed, **kinds,
                                         **self.sft}, where="iterate sft")

    def distill_config(self) -> Any:
        from engine.datasets.distill import DistillConfig

        return from_dict(DistillConfig, {"seed": self.seed, **self.distill}, where="iterate distill")

    def eval_config(self) -> EvalConfig:
        from engine.evaluate import EvalConfig

        return EvalConfig.from_dict(self.eval)

    @property
    def row_kind(self) -> str:
        """The kind of the rows a distilling method stores and trains on (the play methods' are exit rows)."""
        return "exit" if self.method in PLAY_METHODS else self.method

    def play_config(self) -> EvalConfig:
        """The play methods' data collection: the evaluation's limits and decoding, then for exit-mcts MCTS
        at inference with the measured operator's settings (4 simulations per real step, K=4, reward
        backup), for exit-sampled 8 episodes per task at temperature 1, unless `play` says."""
        from engine.evaluate import EvalConfig

        if self.method == "exit-sampled":
            defaults: dict[str, Any] = {"temperature": 1.0, "seeds": [self.seed * 1000 + j for j in range(8)]}
            mode = "sampled"
        else:
            defaults, mode = {"mcts_simulations": 4, "mcts_k": 4, "mcts_backup": "reward", "seeds": [self.seed]}, "mcts"
        return EvalConfig.from_dict({**self.eval, **defaults, **self.play, "mode": mode}, where="iterate play")


@dataclass(frozen=True)
class IterateJob:
    """An iterate job: the loop `iterate` (its JSON: {"iterate": {IterateConfig fields}})."""

    iterate: IterateConfig = field(default_factory=IterateConfig)

    def check(self) -> None:
        """Every iteration's output folder may be written."""
        from engine.train.common import check_output_folder

        if self.iterate.output_root:
            for i in range(1, self.iterate.iterations + 1):
                check_output_folder(Path(self.iterate.output_root) / f"iter-{i}")


def count_episodes(reporter: Reporter, phase: str, tasks: list[Any], config: EvalConfig) -> Callable[[Any], None]:
    """An evaluation's `on_episode`: one unit per episode that ends, the solved ones as `solved`."""
    from engine.evaluate import episode_count

    units = Units(reporter, phase, episode_count(tasks, config), unit="episodes", solved=0)
    return lambda episode: units.step(solved=units.extra["solved"] + int(episode.success))


def count_rows(units: Units, size: Callable[[Any], int]) -> Callable[[Any], None]:
    """A data build's `on_tree`: one unit per tree, `size(the build so far)` as `rows`."""
    return lambda so_far: units.step(rows=size(so_far))


def _evaluate(store: Store, model_path: Path, config: IterateConfig, eval_tasks: list[Any], make_env: Any,
              reporter: Reporter, job_id: str | None, load: Callable[[Path], Any]) -> dict[str, Any]:
    from engine.evaluate import evaluate_and_store, format_metrics

    generator = load(model_path)
    eval_config = config.eval_config()
    result = evaluate_and_store(store, generator, config.env, config.eval_split, eval_tasks, eval_config,
                                model=str(model_path), job_id=job_id, make_env=make_env,
                                on_episode=count_episodes(reporter, "evaluate", eval_tasks, eval_config))
    reporter.log(f"evaluation {result.eval_id} of {model_path}:\n{format_metrics(result.metrics)}")
    return {"eval_id": result.eval_id, "success": result.metrics["success"], "progress": result.metrics["progress"],
            "loop_rate": result.metrics["loop_rate"]}


def _gpu_memory(readings: dict[str, dict[str, float]]) -> dict[str, Any]:
    """An iteration record's "gpu_memory" (peak per phase, engine.gpu_memory); nothing without CUDA."""
    return {"gpu_memory": readings} if readings else {}


GATE_EVERY = 10  # an env without the gate split: every 10th train task is held out for the gate


def gate_tasks(config: IterateConfig, env: Any) -> tuple[str, list[Any]]:
    """The promotion gate's split name and tasks: `gate_split`, or, for "val" on an env without one,
    every GATE_EVERY-th task of the train split (held out of the loop's searches like a val split)."""
    from engine.envs.base import EnvError

    if not config.gate_split:
        return "", []
    try:
        tasks = list(env.tasks(config.gate_split))
    except EnvError as e:
        if config.gate_split != "val":
            raise ConfigError(f"IterateConfig.gate_split: {e}") from None
        tasks = []
    if tasks:
        return config.gate_split, tasks
    if config.gate_split != "val":  # an empty split is no gate: said, not a silent promotion of every candidate
        raise ConfigError(f"IterateConfig.gate_split: the env has no {config.gate_split!r} tasks")
    return config.train_split, list(env.tasks(config.train_split))[GATE_EVERY - 1::GATE_EVERY]


def loop_tasks(config: IterateConfig, env: Any) -> tuple[list[Any], list[Any]]:
    """The loop's train tasks (without the gate's) and held-out tasks; a selection the env cannot
    serve is an error before anything runs (the CLI checks it before it opens the database)."""
    from engine.envs.registry import select_tasks

    held = {t.id for t in gate_tasks(config, env)[1]}
    train_tasks = [t for t in env.tasks(config.train_split) if t.id not in held]
    eval_tasks = select_tasks(env, config.eval_tasks, config.eval_split) if config.eval_tasks else env.tasks(
        config.eval_split)
    if held & {t.id for t in eval_tasks}:
        raise ConfigError(f"IterateConfig.gate_split: {config.gate_split!r} shares tasks with the evaluation "
                          f"({config.eval_split}); the gate must be held out of it")
    if config.tasks_per_iteration > len(train_tasks):
        raise ConfigError(f"tasks_per_iteration {config.tasks_per_iteration} > the {len(train_tasks)} "
                          f"{config.train_split} tasks" + (" held out of the gate" if held else ""))
    return train_tasks, eval_tasks


def curated(store: Store, train_cfg: Any, runs: list[str],
            select: Callable[..., tuple[list[Any], dict[str, Any]]]) -> tuple[list[Any], dict[str, Any]]:
    """The rows of `runs` a loop's trainer may use (the curation gate: final labels, plus rows
    nobody decided only with `include_pending`), and the counts the loop shows and records. One
    selection with the undecided rows in: those without a final label are the uncurated ones."""
    every, labels = select(store, replace(train_cfg, include_pending=True), runs)
    uncurated = len(every) - len(labels)
    if train_cfg.include_pending:
        return every, {"final": len(labels), "uncurated_used": uncurated, "uncurated_left_out": 0}
    return [r for r in every if r.id in labels], {"final": len(labels), "uncurated_used": 0,
                                                  "uncurated_left_out": uncurated}


def gate_line(i: int, gate: dict[str, Any]) -> str:
    """The log line that says what an iteration trains on, before it trains."""
    return (f"iteration {i}: training on {gate['final'] + gate['uncurated_used']} rows: {gate['final']} with a final "
            f"label, {gate['uncurated_used']} uncurated included, {gate['uncurated_left_out']} uncurated left out")


def skip_reason(gate: dict[str, Any], what: str) -> str:
    return (f"no curated {what}: {gate['uncurated_left_out']} uncurated rows left out (curate them, or include "
            "uncurated rows: --include-pending / the Loop view's checkbox)")


def run_loop(store: Store, config: IterateConfig, reporter: Reporter | None = None, job_id: str | None = None,
             make_env: Callable[[], Any] | None = None, load: Callable[[Path], Any] | None = None) -> str:
    """Run the loop; returns its id (its iterations are in `store.iterations(loop_id)`).
    `make_env` / `load` (model folder -> Generator) replace the env registry and
    `load_generator`, for envs or generators built in code (tests, notebooks)."""
    from engine.datasets.corrections import CorrectionConfig, correction_samples
    from engine.datasets.distill import distill, episode_samples
    from engine.datasets.pairs import PairsConfig, build_pairs
    from engine.datasets.renamed import renamed_samples
    from engine.datasets.revisions import RevisionConfig, build_revisions
    from engine.envs.registry import env_factory
    from engine.evaluate import CountedGenerator
    from engine.gpu_memory import PhasePeaks
    from engine.llm.registry import load_generator, parse_model_spec
    from engine.search.played import play_run
    from engine.search.runner import new_run
    from engine.search.stage import count_simulations
    from engine.store import ModelRecord
    from engine.train.common import resolve_model_path
    from engine.train.dpo import labelled_pairs, run_backends, train_dpo
    from engine.train.gate import decide
    from engine.train.served_precision import VISIBLE_ENOUGH, serves_in_bf16, visible_share
    from engine.train.sft import labelled_samples, mix_revisions, train_sft

    reporter = reporter or MemoryReporter()
    spec = parse_model_spec(config.model)  # a vllm: spec's options are checked here, before anything runs
    on_vllm = spec.kind == "vllm"
    if load is None and on_vllm:  # one engine for the whole loop, each new policy reloaded into it
        from engine.train.vllm_policy import VLLMPolicy

        load = VLLMPolicy(log=reporter.log, options=spec.options)
    load = load or (lambda path: load_generator(str(path), log=reporter.log))
    peaks = PhasePeaks(reporter.log)

    def release_gpu() -> None:
        """Before training in this process: a load that holds the GPU (VLLMPolicy) lets it go."""
        release = getattr(load, "release", None)
        if release is not None:
            release()
    loop_id = config.name or f"{config.method}-{uuid.uuid4().hex[:8]}"
    out_root = Path(config.output_root) if config.output_root else default_output_dir(loop_id)
    make_env = make_env or env_factory(config.env)
    env = make_env()
    description = env.describe()
    config.check_env(env)
    train_tasks, eval_tasks = loop_tasks(config, env)
    first = config.first_iteration
    rng = random.Random(config.seed if first == 1 else f"{config.seed}:{first}")  # a continuation draws new tasks
    # Training needs the weights at hand: a vllm:PATH policy trains from PATH, and is searched and
    # evaluated on vLLM (engine/train/vllm_policy.py).
    policy = resolve_model_path(spec.target if on_vllm else config.model, log=reporter.log)
    search = config.search_config()
    total = config.iterations
    gate_split, gates = gate_tasks(config, env)
    earlier = sorted(store.iterations(loop_id), key=lambda r: r["idx"]) if first > 1 else []
    base = Path(next((str(r["base"]) for r in earlier if r.get("base")), str(policy)))  # what accumulation trains from
    loop_runs = [str(r["run_id"]) for r in earlier if r.get("run_id")]
    current_gate: list[Any] | None = None  # the current policy's gate episodes, scored when first needed

    def gate_episodes(path: Path, within: Reporter, phase: str) -> list[Any]:
        from engine.evaluate import evaluate_and_store

        cfg = config.eval_config()
        result = evaluate_and_store(store, load(path), config.env, gate_split, gates, cfg, model=str(path),
                                    job_id=job_id, make_env=make_env,
                                    on_episode=count_episodes(within, phase, gates, cfg))
        return result.episodes

    def stage(i: int, name: str, unit: str) -> Within:
        """Iteration i's (0: the base's) stage `name` (search, data, train, gate, evaluate): its own units
        in the job's progress under "iteration i", with where it stands for the Loop view."""
        within = Within(reporter, f"iteration {i}" if i else "base", unit=unit, loop_id=loop_id, iteration=i,
                        stage=name, last_iteration=first + total - 1)
        within.begin(name)
        peaks.begin(name, f"iteration {i}" if i else "base")
        return within

    try:
        if config.evaluate_base and first == 1:
            scores = _evaluate(store, policy, config, eval_tasks, make_env, stage(0, "evaluate", "episodes"), job_id, load)
            store.save_iteration(loop_id, 0, config.method, {"model": str(policy), "eval": scores, "config": asdict(config),
                                                             **_gpu_memory(peaks.take())})
        for i in range(first, first + total):
            if reporter.should_stop():
                reporter.log(f"stopped before iteration {i}")
                break
            began, began_cpu = time.perf_counter(), time.process_time()
            batch = rng.sample(train_tasks, config.tasks_per_iteration)
            searching = stage(i, "search", "episodes" if config.method in PLAY_METHODS else "simulations")
            generator = load(policy)
            played: list[Any] = []
            greedy: list[Any] = []
            if config.method in PLAY_METHODS:  # the run's units are its episodes, not each real step's small search
                play = config.play_config()
                shift = i * len(play.seeds)  # each iteration its own episodes
                run_id, play_stats, played, greedy = play_run(store, config.env, batch, generator,
                                                      replace(play, seeds=tuple(s + shift for s in play.seeds)),
                                                      f"{loop_id}-it{i}", make_env=make_env, reporter=searching)
                search_s, extra = play_stats.wall_s, {"play": play_stats.to_dict()}
            else:
                sims = Units(searching, "search", search.simulations * len(batch))
                run_id, stats = new_run(store, config.env, batch, generator, replace(search, seed=search.seed + i),
                                        f"{loop_id}-it{i}", progress=count_simulations(sims, search.success_threshold),
                                        make_env=make_env, created=partial(sims.extra.__setitem__, "run_id"))
                sims.finish()
                search_s, extra = stats.wall_s, {}
            refs = tree_refs(store, run_id, description)
            loop_runs.append(run_id)
            start = base if config.accumulates else policy  # the candidate trains from here
            record: dict[str, Any] = {"run_id": run_id, "parent": str(start), "base": str(base),
                                      "searched_with": str(policy), "tasks": [t.id for t in batch],
                                      "solved_in_search": store.run(run_id).solved, "search_s": search_s,
                                      "config": asdict(config), **extra}  # what a continuation of the loop runs with
            building = stage(i, "data", "trees")
            out_dir = out_root / f"iter-{i}"
            if config.method == "agentq":
                trees = Units(building, "data", len(refs), rows=0)
                built = build_pairs(refs, PairsConfig(alpha=search.alpha, theta=config.theta,
                                                               min_visits=config.min_visits),
                                    on_tree=count_rows(trees, lambda so_far: so_far.pairs))
                built.save(store, run_id)
                train_cfg = config.dpo_config()
                pairs, curation = curated(store, train_cfg, [run_id], labelled_pairs)
                record.update({"pairs": len(pairs), "curation": curation})
                if not pairs:
                    record["skipped"] = (skip_reason(curation, "preference pairs") if curation["uncurated_left_out"] else
                                         "no preference pairs (no node had two explored children differing by theta)")
                else:
                    reporter.log(gate_line(i, curation))
                    training = stage(i, "train", "steps")
                    tokens = store.node_token_counts([(p.tree_id, n) for p in pairs for n in (p.chosen_node, p.rejected_node)])
                    del generator
                    release_gpu()
                    result = train_dpo(start, pairs, train_cfg, out_dir, training, node_tokens=tokens, parent=str(start),
                                       backends=run_backends(store, [run_id]))
            elif config.method in DISTILL_METHODS:
                kind = config.row_kind
                if config.method == "exit-mcts":
                    rows = episode_samples(played, batch, description, run_id=run_id)
                    Units(building, "data", len(played), unit="episodes").step(len(played), rows=len(rows))
                else:
                    trees = Units(building, "data", len(refs), rows=0)
                    rows = distill(refs, kind, config.distill_config(),  # exit-sampled: its Monte Carlo trees
                                   on_tree=count_rows(trees, len))
                if config.corrections:
                    fixes = correction_samples(greedy, played, batch, make_env, description,
                                               CorrectionConfig(per_episode=config.corrections), run_id=run_id)
                    record["corrections"] = len(fixes)
                    rows = rows + fixes
                store.save_samples(rows, prune_run=run_id, prune_kinds=(kind, "correction"))
                train_cfg = config.sft_config()
                samples, curation = curated(store, train_cfg, loop_runs if config.accumulates else [run_id], labelled_samples)
                record.update({"samples": len(samples), "rows_new": len(rows), "curation": curation,
                               "solved_trees": sum(r.tree.solved() for r in refs)})
                if not samples:
                    record["skipped"] = (skip_reason(curation, "search rows") if curation["uncurated_left_out"] else
                                         "no successful trajectory in the trees (no task solved in search)"
                                         if config.method != "visits" else f"no node with {config.distill_config().min_visits}"
                                         " or more visits")
                else:
                    reporter.log(gate_line(i, curation))
                    if config.renamed:
                        copies = renamed_samples(samples, env, config.renamed, config.seed + i)
                        record["renamed"] = len(copies)
                        samples = samples + copies
                    training = stage(i, "train", "steps")
                    del generator
                    release_gpu()
                    result = train_sft(start, samples, train_cfg, out_dir, training, kind=config.method,
                                       parent=str(start))
            else:
                calls = Units(building, "data", 0, unit="judge calls")  # the judge's batched calls (no total known)
                built_r = build_revisions(refs, CountedGenerator(generator, calls), RevisionConfig(seed=config.seed + i))
                calls.extra["rows"] = len(built_r.samples)
                calls.finish()
                store.save_samples(built_r.samples, prune_run=run_id, prune_kinds=("revision", "good", "recovery"))
                train_cfg = config.sft_config()
                share = config.revision_shares[min(i - 1, len(config.revision_shares) - 1)]
                samples, curation = curated(store, train_cfg, [run_id], labelled_samples)
                samples = mix_revisions(samples, share, config.seed + i)
                record.update({"revision_share": share, "samples": len(samples), "curation": curation,
                               "revisions": sum(s.kind == "revision" for s in samples)})
                if not samples:
                    good = sum(s.kind == "good" for s in built_r.samples)
                    record["skipped"] = (skip_reason(curation, "revision or good trajectories") if curation["uncurated_left_out"]
                                         else "no revision trajectory: no (good, bad) leaf pair in the trees "
                                         f"({good} good trajectories alone would be RFT)" if good else
                                         "no revision or good trajectories (no successful leaf in the trees)")
                else:
                    reporter.log(gate_line(i, curation))
                    training = stage(i, "train", "steps")
                    del generator
                    release_gpu()
                    result = train_sft(start, samples, train_cfg, out_dir, training, kind="sft", parent=str(start))
            if "skipped" not in record:
                if result.stopped or result.output is None:
                    reporter.log(f"iteration {i}: training stopped")
                    break
                store.save_model(ModelRecord(path=str(result.output), name=f"{loop_id}-it{i}", kind=config.method,
                                             parent=str(start), job_id=job_id, data_ids=result.data_ids,
                                             config=asdict(train_cfg), metrics=result.metrics))
                record["model"] = str(result.output)
                record["train"] = dict(result.metrics)
                if serves_in_bf16(config.model):  # issue 29 item 8: a bf16 server may not see a small update
                    record["served_bf16_share"] = seen = visible_share(start, result.output)
                    if seen is not None and seen < VISIBLE_ENOUGH:
                        reporter.log(f"iteration {i}: WARNING only {seen:.1%} of the weights change once cast to "
                                     "bf16 as the next search serves them: it runs mostly the old policy (train "
                                     "with a larger learning rate, or serve fp32)")
                if gates:
                    gating = stage(i, "gate", "episodes")
                    if current_gate is None:
                        current_gate = gate_episodes(policy, gating, "gate: current policy")
                    candidate = gate_episodes(result.output, gating, "gate: candidate")
                    decision = decide(current_gate, candidate, config.gate_confidence,
                                      bootstrap=config.eval_config().bootstrap, seed=config.seed)
                    record["gate"] = decision.record(gate_split, config.gate_confidence)
                    reporter.log(f"iteration {i}: gate: {decision.why}")
                    if decision.promoted:
                        policy, current_gate = result.output, candidate
                else:
                    record["gate"] = {"promoted": True, "why": (
                        "no gate (gate_split ''): every trained policy is promoted" if not config.gate_split else
                        f"no gate: the env has no {config.gate_split!r} tasks and fewer than {GATE_EVERY} "
                        f"{config.train_split} tasks to hold out: every trained policy is promoted")}
                    policy = result.output
                record["eval"] = _evaluate(store, result.output, config, eval_tasks, make_env, stage(i, "evaluate", "episodes"),
                                           job_id, load)
            else:
                record["model"] = str(policy)
                reporter.log(f"iteration {i}: {record['skipped']}; the policy is unchanged")
            record["policy"] = str(policy)  # what the next iteration searches with (and Next iteration continues)
            record.update(_gpu_memory(peaks.take()))
            record["seconds"] = time.perf_counter() - began
            record["cpu_s"] = time.process_time() - began_cpu  # every thread of this process: the loop's compute
            store.save_iteration(loop_id, i, config.method, record)
            reporter.progress({"phase": f"iteration {i} done", "step": i - first + 1, "total": total, "loop_id": loop_id,
                               "iteration": i, "stage": "done", "last_iteration": first + total - 1})
    except Cancelled as e:  # a cancel at a stage's next unit: the iteration under way is not recorded
        reporter.log(f"stopped: {e}")
    return loop_id
