"""`orchard demo` / `make run`: the embedded default end to end, offline, on 2 CPU cores.

Builds (or loads) the tiny model, then runs MCTS with it as actor AND critic on TextCraft train
tasks, stores the run and says where it is. Prints the time of each stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from engine.config import SearchConfig

# 12 tasks x 8 simulations: ~65 s of search on 2 idle cores, so that a cold start (tiny-model build
# ~210 s) stays under 5 minutes (measured: 16 tasks took 84 s, 294 s in all).
DEMO_TASKS = "0:12"
DEMO_CONFIG = SearchConfig(simulations=8, k=4, depth_limit=10, rollout_temperature=1.0, max_tokens=160,
                           backup="progress")


def run_demo(db: str | Path | None = None, log: Callable[[str], None] = print) -> int:
    from engine.envs.registry import env_factory, select_tasks
    from engine.llm.tiny_checkpoint import tiny_generator
    from engine.search.runner import new_run
    from engine.store import Store

    times: dict[str, float] = {}
    t = time.perf_counter()
    generator = tiny_generator(log=log)
    times["model (build or load)"] = time.perf_counter() - t

    t = time.perf_counter()
    make_env = env_factory("textcraft")
    tasks = select_tasks(make_env(), DEMO_TASKS, "train")
    with Store(db) as store:
        name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        done = [0]

        def progress(job, sim) -> None:
            done[0] += 1
            if done[0] % len(tasks) == 0:
                log(f"  search: {done[0]}/{len(tasks) * DEMO_CONFIG.simulations} simulations")

        run_id, stats = new_run(store, "textcraft", tasks, generator, DEMO_CONFIG, name, progress, make_env)
        info = store.run(run_id)
        times["search"] = time.perf_counter() - t
        log(f"run {run_id} ({name}): {info.trees} TextCraft tasks, {info.simulations} simulations, "
            f"{info.nodes} nodes, {info.solved} tasks solved at least once")
        log(f"  batched calls: {stats.rounds}, mean completions per call {stats.to_dict()['mean_batch']:.1f}, "
            f"generation {stats.gen_s:.1f}s, env {stats.env_s:.2f}s, engine {stats.engine_s:.2f}s")
        log(f"stored in {store.path}")
    for stage, seconds in times.items():
        log(f"time {stage}: {seconds:.1f}s")
    log(f"time total: {sum(times.values()):.1f}s")
    log(f"next: .venv/bin/orchard runs; .venv/bin/orchard export tree {run_id} --task {tasks[0].id}")
    return 0
