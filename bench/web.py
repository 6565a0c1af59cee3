"""Web env speed: steps/s of the scripted expert in the real browser, and the cost of restoring a state
(snapshot/restore against reset + replay) at several depths.

Runs the expert through N tasks (every step timed, by command verb), then for one task restores the
state after d steps both ways. Prints means and medians in milliseconds.

    .venv/bin/python bench/web.py [--tasks 6] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.envs import web
from engine.envs.web import ReplayWebEnv, WebEnv
from engine.envs.web_site import booking
from engine.envs.web_site.expert import expert_command


def ms(values: list[float]) -> str:
    return f"mean {1000 * statistics.mean(values):6.1f} ms  median {1000 * statistics.median(values):6.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    t = time.perf_counter()
    env = WebEnv()
    env.reset(booking.tasks()[0].id)
    print(f"first reset (starts Chromium + site + context): {time.perf_counter() - t:.2f} s")

    steps: dict[str, list[float]] = {}
    resets: list[float] = []
    episodes, solved, total = 0, 0, 0.0
    for task in booking.tasks()[: args.tasks]:
        t = time.perf_counter()
        obs = env.reset(task.id)
        resets.append(time.perf_counter() - t)
        total += resets[-1]
        while (command := expert_command(task.meta, obs)) is not None:
            t = time.perf_counter()
            step = env.step(command)
            dt = time.perf_counter() - t
            total += dt
            steps.setdefault(command.split()[0], []).append(dt)
            obs = step.observation
        episodes += 1
        solved += step.reward == 1.0
    n_steps = sum(len(v) for v in steps.values())
    print(f"\nexpert: {episodes} episodes, {solved} solved, {n_steps} steps")
    print(f"  steps/s (incl. resets): {n_steps / total:5.1f}   observation {len(obs)} chars at the end")
    print(f"  reset          {ms(resets)}")
    for verb, values in sorted(steps.items()):
        print(f"  {verb:<14} {ms(values)}  (n={len(values)})")

    task = booking.tasks()[1]
    obs = env.reset(task.id)
    commands, snaps = [], []
    while (command := expert_command(task.meta, obs)) is not None:
        obs = env.step(command).observation
        commands.append(command)
        snaps.append(env.snapshot())
    replay = ReplayWebEnv()
    replay.reset(task.id)
    print(f"\nrestore after d steps ({len(commands)}-step episode), {args.repeat} repeats each:")
    for depth in sorted({1, 4, 8, len(commands) - 1}):
        restore, replays = [], []
        for _ in range(args.repeat):
            env.step("GOTO [/]")  # leave the state first
            t = time.perf_counter()
            env.restore(snaps[depth - 1])
            restore.append(time.perf_counter() - t)
            t = time.perf_counter()
            replay.reset(task.id)
            for command in commands[:depth]:
                replay.step(command)
            replays.append(time.perf_counter() - t)
        print(f"  d={depth:2d}  snapshot restore {ms(restore)}   reset+replay {ms(replays)}   "
              f"x{statistics.mean(replays) / statistics.mean(restore):.1f}")
    snap_bytes = len(repr(snaps[-1]).encode())
    print(f"\nsnapshot size ~{snap_bytes} bytes; screenshot on the final step: "
          f"{len(env.screenshot() or b'')} bytes JPEG")
    replay.close()
    env.close()
    web.shutdown()


if __name__ == "__main__":
    main()
