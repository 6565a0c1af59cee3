"""Generation throughput: one batched `HFGenerator.sample` call vs `model.generate` prompt by prompt.

Search asks for K samples at each of many trees' leaves at once; this measures that shape (16 TextCraft
actor prompts, n=4, temperature 1) both ways on the same model, in the same process, and prints
generated tokens per second and the ratio.

    .venv/bin/python bench/generation.py [--model DIR] [--prompts 16] [--n 4] [--max-tokens 96]

Without --model it uses the cached tiny model (building it if needed: about two minutes).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import solve
from engine.llm.base import Prompt, SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.tiny_checkpoint import tiny_model_dir
from engine.prompts import HistoryStep, actor_prompt


def search_prompts(count: int) -> list[Prompt]:
    """Actor prompts as search sends them: test tasks, part-way through expert episodes."""
    env = TextCraftEnv()
    prompts: list[Prompt] = []
    for i, task in enumerate(env.tasks("test")[:count]):
        trajectory = solve(env, task.id, noise=0.3, seed=i)
        cut = i % max(1, len(trajectory))
        history = [HistoryStep(s.action, r.observation) for s, r in trajectory[:cut]]
        observation = history[-1].observation if history else env.reset(task.id)
        prompts.append(actor_prompt(env.describe(), task.goal, task.context, history, observation))
    return prompts


def batched(gen: HFGenerator, prompts: list[Prompt], n: int, max_tokens: int) -> tuple[int, float]:
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)
    start = time.perf_counter()
    out = gen.sample([SampleRequest(p, n=n, params=params) for p in prompts])
    return sum(c.n_tokens for cs in out for c in cs), time.perf_counter() - start


def one_by_one(gen: HFGenerator, prompts: list[Prompt], n: int, max_tokens: int) -> tuple[int, float]:
    tok, model = gen.tokenizer, gen.model
    tokens = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([gen.encode_prompt(prompt)], device=gen.device)
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_tokens,
                num_return_sequences=n,
                pad_token_id=tok.pad_token_id,
                eos_token_id=sorted(gen.eos_ids),
            )
            for row in out[:, ids.shape[1] :].tolist():
                ends = [i for i, t in enumerate(row) if t in gen.eos_ids]
                tokens += ends[0] + 1 if ends else len(row)
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: the tiny model)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    gen = HFGenerator(args.model or tiny_model_dir(), device="cpu")
    prompts = search_prompts(args.prompts)
    lengths = [len(gen.encode_prompt(p)) for p in prompts]
    print(
        f"model {gen.name}: {sum(p.numel() for p in gen.model.parameters()) / 1e6:.1f}M parameters, "
        f"{len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens, n={args.n}, "
        f"max_tokens={args.max_tokens}, {torch.get_num_threads()} threads"
    )
    batched(gen, prompts[:2], 1, 4)  # warm-up
    b_tokens, b_time = batched(gen, prompts, args.n, args.max_tokens)
    o_tokens, o_time = one_by_one(gen, prompts, args.n, args.max_tokens)
    b_rate, o_rate = b_tokens / b_time, o_tokens / o_time
    print(f"HFGenerator.sample, one call : {b_tokens:6d} tokens in {b_time:6.2f} s = {b_rate:8.1f} tokens/s")
    print(f"model.generate, per prompt   : {o_tokens:6d} tokens in {o_time:6.2f} s = {o_rate:8.1f} tokens/s")
    print(f"ratio (batched / per prompt) : {b_rate / o_rate:.2f}x")


if __name__ == "__main__":
    main()
