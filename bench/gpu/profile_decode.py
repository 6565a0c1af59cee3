"""Where a CUDA decode step's time goes, fp32 against bf16 (the HF backend's default on CUDA).

The first GPU run (2026-12-04) measured HF sampling of the shipped policy 18x slower in bf16 than in
fp32 on an H200. This samples the same requests in both dtypes under torch.profiler and prints each
dtype's wall time and its ten most expensive operators (self CPU and CUDA time).

    PYTHONPATH=. python bench/gpu/profile_decode.py [--model DIR] [--requests 16] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])  # the repository root, not bench/gpu

import torch
from torch.profiler import ProfilerActivity, profile

from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.tiny_checkpoint import tiny_model_dir
from engine.prompts import actor_prompt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    folder = args.model or str(tiny_model_dir())
    prompts = [actor_prompt("Commands: get N item, craft N X using N a, inventory.", f"craft item {i}", "", [],
                            f"You have {i % 5} oak logs.") for i in range(args.requests)]
    reqs = [SampleRequest(p, n=4, params=SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=i))
            for i, p in enumerate(prompts)]
    for dtype in (torch.float32, torch.bfloat16):
        gen = HFGenerator(folder, device="cuda", dtype=dtype, seed=0, prefix_cache_mb=0)
        gen.sample(reqs[:2])  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = gen.sample(reqs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        tokens = sum(c.n_tokens for cs in out for c in cs)
        print(f"== {dtype}: {wall:.2f} s, {tokens} tokens, {tokens / wall:.0f} tokens/s", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            gen.sample(reqs[:4])
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50))
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=50))
    return 0


if __name__ == "__main__":
    sys.exit(main())
