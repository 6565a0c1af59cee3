"""Env adapters: steps per second and restore cost (snapshot vs replay at depth 5, 10, 20).

For each env: steps/s over a fixed command loop (reset when an episode ends); then, at depths 5, 10
and 20 along a fixed command sequence, the time to bring an env back to that state by replay
(reset + the commands, what MCTS does without snapshots) and by snapshot/restore where the env
offers it (restore only; taking the snapshot is timed separately). The AgentGym row drives
`orchard serve-env`'s protocol over real HTTP on 127.0.0.1 (TextCraft behind it).

    .venv/bin/python bench/envs.py [--seconds 3] [--only babyai,textworld,...]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.envs.base import SupportsSnapshot
from engine.envs.registry import env_factory

DEPTHS = (5, 10, 20)


def _loop(expert: list[str], filler: list[str], depth: int) -> list[str]:
    """`depth` commands: the expert's first ones (never the last, which would end the task), then filler."""
    head = expert[: max(len(expert) - 2, 0)][:depth]
    return head + list(itertools.islice(itertools.cycle(filler), depth - len(head)))


def _timeit(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench(label: str, env, task_id: str, expert: list[str], filler: list[str], seconds: float) -> dict:
    env.reset(task_id)
    commands = _loop(expert, filler, 200)
    n, start = 0, time.perf_counter()
    for command in itertools.cycle(commands):
        if env.step(command).done:
            env.reset(task_id)
        n += 1
        if time.perf_counter() - start > seconds:
            break
    row = {"env": label, "steps/s": n / (time.perf_counter() - start)}
    repeat = 3
    for depth in DEPTHS:
        path = _loop(expert, filler, depth)

        def replay(path=path):
            env.reset(task_id)
            for c in path:
                env.step(c)

        row[f"replay@{depth}"] = _timeit(replay, repeat)
        if isinstance(env, SupportsSnapshot):
            replay()
            t = time.perf_counter()
            snap = env.snapshot()
            row[f"snap_take@{depth}"] = time.perf_counter() - t
            env.step(filler[0])
            row[f"restore@{depth}"] = _timeit(lambda snap=snap: env.restore(snap), repeat)
    return row


def _agentgym():
    from engine.envs.agentgym import AgentGymEnv
    from engine.envs.serve import EnvService, make_server
    from engine.envs.textcraft import TextCraftEnv
    from engine.envs.textcraft_expert import solve

    srv = make_server(EnvService(TextCraftEnv, "textcraft"))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    env = AgentGymEnv(f"http://127.0.0.1:{srv.server_address[1]}/textcraft?timeout=30")
    task = env.tasks()[40].id
    expert = [s.action.command for s, _ in solve(TextCraftEnv(), task)]
    return env, task, expert, ["inventory"]


def cases(only: set[str]):
    if "textcraft" in only:
        from engine.envs.textcraft_expert import solve

        env = env_factory("textcraft")()
        task = env.tasks()[40].id
        yield "textcraft", env, task, [s.action.command for s, _ in solve(env, task)], ["inventory"]
    if "babyai" in only:
        env = env_factory("babyai:GoToLocal?n=2")()
        yield "babyai:GoToLocal", env, "train-0", [], ["turn left", "turn left", "turn right", "toggle"]
    if "textworld" in only:
        for restore in ("replay", "copy"):
            env = env_factory(f"textworld:cooking?n=1&restore={restore}")()
            yield f"textworld:cooking ({restore})", env, "train-0", env.expert("train-0"), ["look", "inventory"]
    if "scienceworld" in only:
        env = env_factory("scienceworld:boil?vars=1")()
        yield "scienceworld:boil", env, "boil-0", env.expert("boil-0"), ["look around", "inventory"]
    if "agentgym" in only:
        env, task, expert, filler = _agentgym()
        yield "agentgym->serve-env textcraft", env, task, expert, filler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of stepping per env")
    ap.add_argument("--only", default="textcraft,babyai,textworld,scienceworld,agentgym")
    args = ap.parse_args()
    rows = []
    for label, env, task, expert, filler in cases(set(args.only.split(","))):
        rows.append(bench(label, env, task, expert, filler, args.seconds))
        print(f"done {label}", file=sys.stderr, flush=True)
    ms = lambda v: f"{1000 * v:9.2f}" if v is not None else f"{'-':>9}"
    head = f"{'env':<32} {'steps/s':>9} " + " ".join(f"{'replay@' + str(d):>9}" for d in DEPTHS)
    head += " " + " ".join(f"{'restore@' + str(d):>10}" for d in DEPTHS) + f" {'snap@20':>9}"
    print("times in ms (best of 3); restore = snapshot restore where offered, '-' = replay only")
    print(head)
    for r in rows:
        print(f"{r['env']:<32} {r['steps/s']:9.1f} " + " ".join(ms(r[f"replay@{d}"]) for d in DEPTHS) + " "
              + " ".join(f" {ms(r.get(f'restore@{d}'))}" for d in DEPTHS) + f" {ms(r.get('snap_take@20'))}")


if __name__ == "__main__":
    main()
