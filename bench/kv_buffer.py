"""The decode loop's KV cache in search: transformers' concatenating cache vs the in-place buffer.

Each decode step of transformers' DynamicLayer copies every row's whole cache (`torch.cat`); the
generator's buffer (engine/llm/kv_buffer.py) writes one column in place. This runs the same
MCTS-at-inference evaluation as bench/prefix_cache.py (fit tasks drawn with the seed, constrained
decoding, per-request seeds, the prefix cache on in both arms) with the buffer off (the baseline) and
on, alternating `--repeats` times in one process, and prints per run: wall, simulations per second,
and the ratio of the medians. First, the bare decode step: ms per step at 1, 20 and 80 rows of 500
tokens of context, for each cache (`--decode-only` stops there). Outcomes are printed beside the speed, not asserted equal (a sampled
token can flip at a float near-tie).

    .venv/bin/python bench/kv_buffer.py [--tasks 8] [--simulations 2] [--k 4] [--max-steps 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

from engine.envs.textcraft import TextCraftEnv
from engine.evaluate import EvalConfig, evaluate
from engine.llm.hf import HFGenerator
from engine.llm.tiny_checkpoint import tiny_model_dir
from engine.torch_threads import torch_threads


def decode_steps(folder: str, threads: int, context: int = 500, steps: int = 40, repeats: int = 3) -> None:
    """ms per bare decode step of the model (the loop HFGenerator runs: one token per row, the mask grown
    by one): prefill `rows` random prompts of `context` tokens, then `steps` greedy steps with
    transformers' cache and with the same cache moved into the buffer (`preallocate`); the best of
    `repeats`, so a step's cost is not mixed with the prefill's or with rows ending early."""
    import torch

    from engine.llm.kv_buffer import preallocate

    gen = HFGenerator(folder, device="cpu", seed=0, num_threads=threads, prefix_cache_mb=0)
    model, kw = gen.model, gen._cache_kw
    for rows in (1, 20, 80):
        ids = torch.randint(100, model.config.vocab_size - 1, (rows, context), generator=torch.Generator().manual_seed(0))
        best = {}
        for buffered in (False, True):
            times = []
            for _ in range(repeats):
                with torch.inference_mode(), torch_threads(threads):
                    mask = torch.ones_like(ids)
                    out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
                    cache = getattr(out, kw)
                    if buffered:
                        preallocate(cache, steps)
                    tokens, pos = out.logits[:, -1].argmax(-1), torch.full((rows,), context - 1)
                    t = time.perf_counter()
                    for _ in range(steps):
                        mask, pos = torch.cat([mask, mask.new_ones((rows, 1))], dim=1), pos + 1
                        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos[:, None],
                                    use_cache=True, **{kw: cache})
                        tokens = out.logits[:, -1].argmax(-1)
                    times.append((time.perf_counter() - t) / steps * 1000)
            best[buffered] = min(times)
        print(f"  bare decode step, {rows:>2} rows x {context} tokens of context: {best[False]:6.1f} ms concatenating, "
              f"{best[True]:6.1f} ms buffer ({best[False] / best[True]:.2f}x)", flush=True)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="a model folder (default: the shipped tiny policy)")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--simulations", type=int, default=2, help="MCTS simulations per real step")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--decode-only", action="store_true", help="only the bare decode-step timing")
    args = ap.parse_args(argv)
    folder = args.model or str(tiny_model_dir())
    decode_steps(folder, args.threads)
    if args.decode_only:
        return {}
    tasks = random.Random(args.seed).sample(TextCraftEnv().tasks("fit"), args.tasks)
    config = EvalConfig(mode="mcts", seeds=(args.seed,), mcts_simulations=args.simulations, mcts_k=args.k,
                        mcts_backup="reward", max_steps=args.max_steps, constrained=True)
    print(f"MCTS at inference, {args.tasks} fit tasks (seed {args.seed}), {args.simulations} simulations per "
          f"real step, K={args.k}, {args.max_steps} steps, constrained; model {folder}; {args.threads} thread(s)")
    rates: dict[str, list[float]] = {"concatenating cache": [], "in-place buffer": []}
    for _ in range(args.repeats):
        for name, runs in rates.items():
            gen = HFGenerator(folder, device="cpu", seed=args.seed, num_threads=args.threads)
            gen.kv_buffer = name == "in-place buffer"
            t = time.perf_counter()
            episodes = evaluate(gen, TextCraftEnv, tasks, config).episodes
            wall = time.perf_counter() - t
            sims = sum(e.steps for e in episodes) * args.simulations
            runs.append(sims / wall)
            print(f"  {name:<20} {wall:7.1f} s  {sims} simulations  {sims / wall:.3f} simulations/s  solved "
                  f"{sum(e.success for e in episodes)}/{len(episodes)}", flush=True)
    medians = {name: statistics.median(r) for name, r in rates.items()}
    off, on = medians.values()
    print(f"median simulations/s: {off:.3f} -> {on:.3f}; ratio (buffer / concatenating): {on / off:.2f}x")
    return medians


if __name__ == "__main__":
    main()
