"""Prompt prefix reuse in search: MCTS at inference with the transformers backend, prefix cache off vs on.

Search prompts share most of their tokens (system text, task block, the history so far); the
generator keeps recent prompts' key/value states (engine/llm/prefix_cache.py) and prefills only what
is new. This runs the same MCTS-at-inference evaluation (fit tasks drawn with the seed, constrained
decoding, per-request seeds) twice in one process, once with the cache off (the baseline) and once
on, and prints per arm: wall, prompt tokens prefilled and reused, simulations per second, and the
ratio. Episodes can differ between the arms by float rounding alone (a sampled token flips where
two logits sit within ~1e-5), so the outcomes are printed beside the speed, not asserted equal.

    .venv/bin/python bench/prefix_cache.py [--tasks 8] [--simulations 2] [--k 4] [--max-steps 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig, evaluate
from engine.llm.hf import PREFIX_CACHE_MB, HFGenerator
from engine.llm.tiny_checkpoint import tiny_model_dir


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="a model folder (default: the shipped tiny policy)")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--simulations", type=int, default=2, help="MCTS simulations per real step")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    folder = args.model or str(tiny_model_dir())
    tasks = random.Random(args.seed).sample(TextCraftEnv().tasks("fit"), args.tasks)
    config = EvalConfig(mode="mcts", seeds=(args.seed,), mcts_simulations=args.simulations, mcts_k=args.k,
                        mcts_backup="reward", max_steps=args.max_steps, constrained=True)
    print(f"MCTS at inference, {args.tasks} fit tasks (seed {args.seed}), {args.simulations} simulations per "
          f"real step, K={args.k}, {args.max_steps} steps, constrained; model {folder}; {args.threads} thread(s)")
    rates: dict[str, float] = {}
    for name, mb in (("cache off", 0), (f"cache on ({PREFIX_CACHE_MB} MB)", PREFIX_CACHE_MB)):
        gen = HFGenerator(folder, device="cpu", seed=args.seed, num_threads=args.threads, prefix_cache_mb=mb)
        prefilled = 0
        model = gen.model
        inner_forward = model.forward

        def counting(*a, _inner=inner_forward, **kw):  # type: ignore[no-untyped-def]
            nonlocal prefilled
            ids = kw.get("input_ids")
            if ids is not None and ids.shape[1] > 1:  # a prefill (decode steps feed one token)
                prefilled += int(kw["attention_mask"][:, -ids.shape[1]:].sum())
            return _inner(*a, **kw)

        model.forward = counting
        t = time.perf_counter()
        episodes = evaluate(gen, TextCraftEnv, tasks, config).episodes
        wall = time.perf_counter() - t
        sims = sum(e.steps for e in episodes) * args.simulations
        rates[name] = sims / wall
        reused = gen.prefix_cache.reused
        print(f"  {name:<22} {wall:7.1f} s  {sims} simulations  {rates[name]:.3f} simulations/s  prompt tokens "
              f"prefilled {prefilled}, reused {reused} ({reused / max(prefilled + reused, 1):.0%})  solved "
              f"{sum(e.success for e in episodes)}/{len(episodes)}", flush=True)
    off, on = rates.values()
    print(f"ratio (on / off, simulations per second): {on / off:.2f}x")
    return rates


if __name__ == "__main__":
    main()
