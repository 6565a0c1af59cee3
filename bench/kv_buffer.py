"""The decode loop's KV cache in search: transformers' concatenating cache vs the in-place buffer.

Each decode step of transformers' DynamicLayer copies every row's whole cache (`torch.cat`); the
generator's buffer (engine/llm/kv_buffer.py) writes one column in place. This runs the same
MCTS-at-inference evaluation as bench/prefix_cache.py (fit tasks drawn with the seed, constrained
decoding, per-request seeds, the prefix cache on in both arms) with the buffer off (the baseline) and
on, alternating `--repeats` times in one process, and prints per run: wall, simulations per second,
and the ratio of the medians. First, the bare decode step: ms per step of the generator's own decode
loop at 1, 20 and 80 rows of a 500-token prompt, for each cache (`--decode-only` stops there). Outcomes are printed beside the speed, not asserted equal (a sampled
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
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.tiny_checkpoint import tiny_model_dir


def decode_steps(folder: str, threads: int, context: int = 500, steps: int = 40) -> None:
    """ms per decode step: `HFGenerator.sample` of one fixed random prompt as `rows` sampled rows of up to
    `steps` tokens; the call's time (prefill included) over the longest row's tokens."""
    import torch

    gen = HFGenerator(folder, device="cpu", seed=0, num_threads=threads, prefix_cache_mb=0)
    vocab = gen.tokenizer.vocab_size
    text = gen.tokenizer.decode(torch.randint(100, vocab - 1, (context,), generator=torch.Generator().manual_seed(0)))
    prompt = [{"role": "user", "content": text}]
    params = SamplingParams(temperature=1.0, max_tokens=steps, seed=0)
    for rows in (1, 20, 80):
        line = []
        for buffered in (False, True):
            gen.kv_buffer = buffered
            gen.sample([SampleRequest(prompt, n=rows, params=SamplingParams(temperature=1.0, max_tokens=2))])
            t = time.perf_counter()
            out = gen.sample([SampleRequest(prompt, n=rows, params=params)])[0]
            wall = time.perf_counter() - t
            line.append(wall / max(max(c.n_tokens for c in out), 1) * 1000)
        print(f"  decode, {rows:>2} rows x {context} prompt tokens: {line[0]:6.1f} ms/step concatenating, "
              f"{line[1]:6.1f} ms/step buffer ({line[0] / line[1]:.2f}x; prefill included)", flush=True)


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
