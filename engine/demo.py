"""`orchard demo` / `make run`: the embedded default's whole loop, offline, on 2 CPU cores.

Loads (or builds) the tiny model, then: MCTS with it as actor AND critic on the demo's train tasks ->
step pairs (eq. 10, theta), RFT and expert-iteration rows -> revision trajectories (first errors
judged by the model, spliced) -> AgentRefine rows from the offline synthesizer (TextCraft's tasks and
expert; the tiny model cannot write the JSON scripts) -> a short SFT job on the expert-iteration rows (the loop's default
recipe) -> greedy evaluation of the base and the trained model on the same held-out tasks, with the
paired difference and the plain statement that 8 tasks cannot show a gain. Everything is stored (run, pairs, samples, refinement rows and their job, job with its loss curve,
model, two evaluations, a two-record loop), so every dashboard page has content on first open.
Prints each stage's time.

WHY plain calls: each stage calls the same domain function the CLI does (`new_run`, `build_pairs`,
`build_revisions`, `train_sft`, `evaluate_and_store`), so the demo shows what the commands do, and a
stage can later be submitted as a job without a second copy of its logic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.config import ConfigError, SearchConfig


@dataclass(frozen=True)
class DemoSettings:
    """The demo's size. Budget: <= 3 min of compute on 2 cores after install; the shipped 5.3M tiny
    model takes 130-160 s (README; docs/decisions.md "Demo stages and their budget" has the per-stage
    figures measured with the earlier 2M model)."""

    tasks: str = "0:8"  # train tasks searched
    search: SearchConfig = field(default_factory=lambda: SearchConfig(
        simulations=12, k=4, depth_limit=3, rollout_temperature=1.0, max_tokens=160, backup="progress",
        constrained=True))
    theta: float = 0.1
    train_epochs: float = 3.0  # passes over the expert-iteration rows (the loop bench's setting, chosen on val)
    train_steps: int = 24  # optimizer steps at most (the steps follow the rows, capped for the time budget)
    batch_size: int = 8
    learning_rate: float = 1e-4
    eval_tasks: str = "0:8"  # held-out (test) tasks, the same for both models
    eval_max_steps: int = 10
    refine_personas: int = 8  # offline AgentRefine rows (TextCraft's scripted synthesizer; well under a second)

    def __post_init__(self) -> None:
        checks = {"tasks": bool(self.tasks.strip()), "theta": self.theta >= 0, "train_steps": self.train_steps >= 1,
                  "train_epochs": self.train_epochs > 0,
                  "batch_size": self.batch_size >= 1, "learning_rate": self.learning_rate > 0,
                  "eval_tasks": bool(self.eval_tasks.strip()), "eval_max_steps": self.eval_max_steps >= 1,
                  "refine_personas": self.refine_personas >= 1}
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"demo setting {name}: invalid value {getattr(self, name)!r}")


DEMO = DemoSettings()


@dataclass
class DemoResult:
    run_id: str
    pairs: int = 0
    revisions: int = 0
    judged: int = 0
    refined: int = 0
    good: int = 0
    model: str | None = None
    trained_rows: int = 0
    eval_ids: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)


def demo_tasks(settings: DemoSettings) -> tuple[list[Any], list[Any]]:
    """(train tasks searched, held-out tasks evaluated); a bad selection is an error before anything runs."""
    from engine.envs.registry import env_factory, select_tasks

    env = env_factory("textcraft")()
    return select_tasks(env, settings.tasks, "train"), select_tasks(env, settings.eval_tasks, "test")


def stage_search(store: Any, generator: Any, tasks: list[Any], settings: DemoSettings,
                 log: Callable[[str], None]) -> str:
    from engine.envs.registry import env_factory
    from engine.search.runner import new_run

    make_env = env_factory("textcraft")
    name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    done = [0]

    def progress(job, sim) -> None:
        done[0] += 1
        if done[0] % len(tasks) == 0:
            log(f"  search: {done[0]}/{len(tasks) * settings.search.simulations} simulations")

    run_id, stats = new_run(store, "textcraft", tasks, generator, settings.search, name, progress, make_env)
    info = store.run(run_id)
    leaves = sum(1 for tid, _ in store.tree_ids(run_id) for n in store.load_tree(tid).nodes
                 if n.terminal is not None and (n.reward or 0) >= settings.search.success_threshold)
    log(f"run {run_id} ({name}): {info.trees} TextCraft tasks, {info.simulations} simulations, {info.nodes} nodes, "
        f"{info.solved} tasks solved at least once, {leaves} success leaves")
    log(f"  batched calls: {stats.rounds}, mean completions per call {stats.to_dict()['mean_batch']:.1f}, "
        f"generation {stats.gen_s:.1f}s, env {stats.env_s:.2f}s, engine {stats.engine_s:.2f}s")
    return run_id


def _refs(store: Any, run_id: str) -> list[Any]:
    from engine.datasets.samples import tree_refs
    from engine.envs.registry import env_factory

    return tree_refs(store, run_id, env_factory("textcraft")().describe())


def stage_pairs(store: Any, run_id: str, settings: DemoSettings, log: Callable[[str], None]) -> int:
    from engine.datasets.pairs import PairsConfig, build_pairs

    built = build_pairs(_refs(store, run_id), PairsConfig(alpha=settings.search.alpha, theta=settings.theta))
    built.save(store, run_id)
    log(f"pairs: {len(built.step)} step pairs, {len(built.trajectory)} trajectory pairs, {len(built.rft)} RFT rows, "
        f"{len(built.exit)} expert-iteration rows")
    return len(built.step)


def stage_revisions(store: Any, run_id: str, judge: Any, log: Callable[[str], None]) -> tuple[int, int, int]:
    from engine.datasets.revisions import RevisionConfig, build_revisions

    built = build_revisions(_refs(store, run_id), judge, RevisionConfig())
    store.save_samples(built.samples, prune_run=run_id, prune_kinds=("revision", "good", "recovery"))
    judged = sum(1 for s in built.revision if s.source["error_found"])
    log(f"revisions: {len(built.revision)} revision trajectories ({judged} with a judged first error), "
        f"{len(built.good)} good trajectories, {len(built.recovery)} recovery prefixes")
    return len(built.revision), judged, len(built.good)


def stage_refine(store: Any, settings: DemoSettings, log: Callable[[str], None]) -> int:
    """AgentRefine rows from the offline synthesizer (engine/datasets/refine_offline.py: TextCraft's task
    generator and expert with refused mistakes and their corrections, no LLM — the tiny policy cannot write
    the JSON scripts), through the pipeline's own verification and loss masks; recorded as a refine job
    so the Refinement page's Builds table shows it. Returns the rows made."""
    from engine.datasets.builds import RefineJob, run_refine

    out = Path(store.path).parent / "runs" / "refine-demo.jsonl"
    spec = RefineJob(model="offline", n=settings.refine_personas, out=str(out))
    job = store.create_job("refine", {"model": spec.model, "n": spec.n, "out": spec.out}, "cpu", name="refine-demo")
    reporter = _Quiet(store, job.id)
    result = run_refine(spec, reporter, store=store, who=f"job {job.id}")
    store.finish_job(job.id, "succeeded", output_path=result.output, expect=("queued",))
    rows = int(store.job(job.id).progress.get("rows") or 0)
    log(f"refine: {rows} AgentRefine rows from the offline synthesizer (TextCraft tasks, expert logs with refused "
        f"mistakes masked) -> {out}")
    return rows


def stage_train(store: Any, run_id: str, base: Path, settings: DemoSettings,
                log: Callable[[str], None]) -> tuple[str | None, int]:
    """The loop's default recipe, expert iteration (docs/algorithms.md §3.5): SFT on each solved tree's
    shortest successful trajectory, recorded as a job (with its loss curve) and a model. Nobody has
    curated the demo's rows: it includes them, and says so. Returns (model folder, rows trained)."""
    from dataclasses import replace

    from engine.datasets.samples import to_step_rows
    from engine.store import ModelRecord
    from engine.train.presets import planned_steps
    from engine.train.sft import SFTTrainConfig, labelled_samples, train_sft

    config = SFTTrainConfig.for_cpu(learning_rate=settings.learning_rate, epochs=settings.train_epochs,
                                    batch_size=settings.batch_size, kinds=("exit",), include_pending=True,
                                    num_threads=2)
    samples, _ = labelled_samples(store, config, [run_id])
    if not samples:
        log("train: no solved tree in this run, so no expert-iteration rows; nothing to train")
        return None, 0
    rows = sum(len(to_step_rows(s)) for s in samples)
    if planned_steps(rows, config) > settings.train_steps:  # the cap of the demo's time budget
        config = replace(config, max_steps=settings.train_steps)
    name = f"exit-{store.run(run_id).name}"
    out = Path(store.path).parent / "models" / "trained" / name
    job = store.create_job("sft", {"model": str(base), "output": str(out), "runs": [run_id],
                                   "train": config.to_dict()}, "cpu", name=name)
    result = train_sft(base, samples, config, out, _Quiet(store, job.id), kind="exit", parent=str(base))
    store.finish_job(job.id, "succeeded", output_path=str(result.output), expect=("queued",))
    store.save_model(ModelRecord(path=str(result.output), name=name, kind="exit", parent=str(base), job_id=job.id,
                                 data_ids=list(result.data_ids), config=config.to_dict(), metrics=result.metrics))
    log(f"train: expert iteration, SFT on {len(samples)} uncurated shortest successful trajectories "
        f"({result.metrics.get('rows')} step rows), {result.metrics.get('steps')} steps, "
        f"loss {result.metrics.get('train_loss'):.4f} -> {result.output}")
    return str(result.output), len(samples)


class _Quiet:
    """The job runner's store reporter without a line per step on the demo's console."""

    def __init__(self, store: Any, job_id: str) -> None:
        from engine.jobs.worker import StoreReporter

        self._inner = StoreReporter(store, job_id)

    def progress(self, data: dict[str, Any]) -> None:
        self._inner.progress(data)

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        self._inner.store.add_job_metrics(self._inner.job_id, data, step=step)

    def should_stop(self) -> bool:
        return False

    def log(self, message: str) -> None:
        pass


def stage_evaluate(store: Any, run_id: str, generator: Any, model: str, tasks: list[Any], settings: DemoSettings,
                   log: Callable[[str], None]) -> str:
    """Greedy on the held-out demo tasks, plus the run's recovery prefixes (Agent-R's recovery score)."""
    from engine.envs.registry import env_factory
    from engine.evaluate import DEFAULT_EVAL, evaluate_and_store, format_metrics, recovery_starts

    make_env = env_factory("textcraft")
    recovery = recovery_starts(store.samples(run_id=run_id, kind="recovery"))
    config = replace(DEFAULT_EVAL, max_steps=settings.eval_max_steps)  # the dashboard form's default too
    result = evaluate_and_store(store, generator, "textcraft", "test", tasks, config, recovery=recovery, model=model,
                                make_env=make_env)
    log(f"evaluation {result.eval_id} of {model} on test {settings.eval_tasks}:\n{format_metrics(result.metrics)}")
    return str(result.eval_id)


def run_demo(db: str | Path | None = None, log: Callable[[str], None] = print,
             settings: DemoSettings = DEMO) -> DemoResult:
    from engine.llm.registry import load_generator
    from engine.llm.tiny_checkpoint import tiny_generator, tiny_model_dir
    from engine.store import Store

    times: dict[str, float] = {}
    cpu: dict[str, float] = {}

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        """Wall time, and this process's CPU time (the compute, whatever else shares the cores)."""
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times[stage], cpu[stage] = time.perf_counter() - t, time.process_time() - c
        log(f"time {stage}: {times[stage]:.1f}s (cpu {cpu[stage]:.1f}s)")
        return out

    train_tasks, eval_tasks = demo_tasks(settings)
    base = timed("model (load the shipped checkpoint)", lambda: tiny_model_dir(log=log))
    generator = tiny_generator(log=log)
    with Store(db) as store:
        run_id = timed("search", lambda: stage_search(store, generator, train_tasks, settings, log))
        result = DemoResult(run_id=run_id, times=times)
        result.pairs = timed("pairs", lambda: stage_pairs(store, run_id, settings, log))
        result.revisions, result.judged, result.good = timed(
            "revisions", lambda: stage_revisions(store, run_id, generator, log))
        result.refined = timed("refine (offline)", lambda: stage_refine(store, settings, log))
        result.eval_ids.append(timed("evaluate base", lambda: stage_evaluate(
            store, run_id, generator, str(base), eval_tasks, settings, log)))
        result.model, result.trained_rows = timed("train", lambda: stage_train(store, run_id, base, settings, log))
        if result.model:
            trained_path = result.model
            trained = load_generator(trained_path, log=log)
            result.eval_ids.append(timed("evaluate trained", lambda: stage_evaluate(
                store, run_id, trained, trained_path, eval_tasks, settings, log)))
            log(too_few(store, result.eval_ids))
        _save_loop(store, run_id, base, result, settings)
        log(f"stored in {store.path}")
    log(f"time total: {sum(times.values()):.1f}s (cpu {sum(cpu.values()):.1f}s)")
    log(f"next: .venv/bin/orchard runs; .venv/bin/orchard export tree {run_id} --task {train_tasks[0].id}; "
        "the dashboard shows every stage")
    return result


def too_few(store: Any, eval_ids: list[str]) -> str:
    """The plain words on what the demo's two evaluations can and cannot show: the paired difference
    over its few held-out tasks, and that it is too small a sample to call a gain."""
    from engine.evaluate import by_task, paired_bootstrap_diff

    found = {e["id"]: e for e in store.evaluations(with_episodes=True)}
    arms = [by_task([ep for ep in found[i]["episodes"] if not ep.get("recovery")], "success") for i in eval_ids[:2]]
    n = len(arms[0])
    before, after = (round(sum(max(v) for v in arm.values())) for arm in arms)
    diff = paired_bootstrap_diff(arms[0], arms[1])
    return (f"base {before}/{n}, trained {after}/{n} on {n} held-out tasks: paired difference {diff['mean']:+.3f} "
            f"[{diff['low']:+.3f}, {diff['high']:+.3f}]. {n} tasks are too few for this to show a gain or a loss; "
            "bench/loop_gain.py measures the loop on all 109 test tasks (README, \"Learning from search\").")


def loop_config(base: Path, settings: DemoSettings) -> dict[str, Any]:
    """The demo's recipe as an IterateConfig table: what the Loop view's Next iteration continues with
    (the demo's search and SFT settings; uncurated rows only if the user ticks the box)."""
    from dataclasses import asdict

    return {"method": "exit", "model": str(base), "env": "textcraft", "tasks_per_iteration": len(
        demo_tasks(settings)[0]), "include_pending": False, "search": asdict(settings.search),
        "sft": {"learning_rate": settings.learning_rate, "epochs": settings.train_epochs,
                "batch_size": settings.batch_size, "device": "cpu", "precision": "fp32", "num_threads": 2}}


def _save_loop(store: Any, run_id: str, base: Path, result: DemoResult, settings: DemoSettings = DEMO) -> None:
    """The demo as a one-iteration loop (base, trained), for the evaluation page's loop table."""
    evals = {e["id"]: e["metrics"] for e in store.evaluations()}

    def scores(eval_id: str) -> dict[str, Any]:
        m = evals[eval_id]
        return {"eval_id": eval_id, **{k: m[k] for k in ("success", "progress", "loop_rate")}}

    loop_id = f"loop-{store.run(run_id).name}"
    store.save_iteration(loop_id, 0, "exit", {"model": str(base), "eval": scores(result.eval_ids[0])})
    run = store.run(run_id)
    record: dict[str, Any] = {"run_id": run_id, "parent": str(base), "samples": result.trained_rows,
                              "config": loop_config(base, settings),
                              "curation": {"final": 0, "uncurated_used": result.trained_rows, "uncurated_left_out": 0},
                              "solved_in_search": run.solved, "tasks": [task for _, task in store.tree_ids(run_id)],
                              "model": result.model or str(base), "seconds": sum(result.times.values())}
    if result.model:  # what the Loop view shows as the train stage: the model's own record
        record["train"] = dict(store.model_record(result.model).metrics)
    if result.model and len(result.eval_ids) > 1:
        record["eval"] = scores(result.eval_ids[1])
    else:
        record["skipped"] = "no successful trajectory in the trees (nothing trained)"
    store.save_iteration(loop_id, 1, "exit", record)
