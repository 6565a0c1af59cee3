"""DPO training speed: the replay buffer's stored reference log-probs vs TRL's reference passes.

Agent Q stores the generation log-prob of every action (the replay buffer), so the DPO reference
needs no forward pass. This trains the same pairs, from the same weights, for the same steps with
`ref_source`:
- stored:     reference log-probs from the pairs (no reference forward in training; the setup
              re-scores 4 pairs per run as the spot check);
- live:       TRL's default — a reference-model forward at every step;
- precompute: TRL's option — one reference pass over the data before training;
and prints steps/s of the training steps, the one-off setup (reference pass), the total, and the
ratios to `live`. Also checks that all three give the same step-1 loss and nearly the same losses.

Pairs are TextCraft actor prompts part-way through expert episodes (train tasks) with two expert
actions of realistic length as chosen/rejected; their stored log-probs are what the replay buffer
holds for such completions (the model's raw log-prob of text + EOS).

    .venv/bin/python bench/train.py [--model DIR] [--pairs 64] [--batch 8] [--steps 16] [--threads 1]

Without --model: the cached tiny model (data/models/tiny) if built, else a random-init model of the
tiny model's architecture (same compute per token; built in seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The repository root, in place of this folder (bench/datasets.py would shadow the `datasets` package).
sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from engine.actions import render
from engine.datasets.pairs import Pair
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import solve
from engine.llm.hf import HFGenerator
from engine.prompts import HistoryStep, actor_prompt
from engine.train.dpo import DPOTrainConfig, train_dpo


def make_pairs(count: int) -> list[Pair]:
    env = TextCraftEnv()
    pairs: list[Pair] = []
    tasks = env.tasks("train")
    i = 0
    while len(pairs) < count:
        task = tasks[i % len(tasks)]
        good = solve(env, task.id, noise=0.0, seed=i)
        bad = solve(env, task.id, noise=1.0, seed=i)
        cut = (i // len(tasks)) % max(1, len(good))
        history = [HistoryStep(s.action, r.observation) for s, r in good[:cut]]
        observation = history[-1].observation if history else env.reset(task.id)
        prompt = actor_prompt(env.describe(), task.goal, task.context, history, observation)
        chosen = render(good[cut][0].action)
        rejected = render(bad[min(cut, len(bad) - 1)][0].action)
        if chosen != rejected:
            pairs.append(Pair(id=f"b{i}", kind="step", run_id="bench", tree_id=None, task_id=task.id, node_id=cut,
                              chosen_node=1, rejected_node=2, prompt=prompt, chosen=chosen, rejected=rejected,
                              q_chosen=1.0, q_rejected=0.0, logprob_chosen=None, logprob_rejected=None, depth=cut,
                              status="approved"))
        i += 1
    return pairs


def random_tiny_architecture(out: Path, pairs: list[Pair]) -> Path:
    from engine.llm.tiny import TinyConfig, new_model, train_tokenizer

    texts = [m["content"] for p in pairs for m in p.prompt] + [p.chosen for p in pairs] + [p.rejected for p in pairs]
    cfg = TinyConfig()
    tok = train_tokenizer(texts, cfg.vocab_size)
    model = new_model(cfg, tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="best of this many runs per mode")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    pairs = make_pairs(args.pairs)
    scratch = Path(tempfile.mkdtemp(prefix="orchard-bench-train-"))
    if args.model:
        model_dir = Path(args.model)
        source = str(model_dir)
    else:
        from engine.llm.tiny import default_tiny_dir, read_meta

        if read_meta(default_tiny_dir()) is not None:
            model_dir, source = default_tiny_dir(), "the cached tiny model"
        else:
            model_dir = random_tiny_architecture(scratch / "random-tiny", pairs)
            source = "a random-init model of the tiny model's architecture"
    gen = HFGenerator(model_dir, device="cpu")
    n_params = sum(p.numel() for p in gen.model.parameters())
    # The replay buffer: the generating model's raw log-prob of each action text + EOS.
    chosen = gen.logprobs([p.prompt for p in pairs], [p.chosen for p in pairs])
    rejected = gen.logprobs([p.prompt for p in pairs], [p.rejected for p in pairs])
    from dataclasses import replace

    pairs = [replace(p, logprob_chosen=c, logprob_rejected=r) for p, c, r in zip(pairs, chosen, rejected, strict=True)]
    lengths = [len(gen.encode_prompt(p.prompt)) for p in pairs]
    completion = [len(gen.tokenizer(p.chosen)["input_ids"]) + 1 for p in pairs]
    del gen
    print(f"model: {source} ({n_params / 1e6:.2f}M parameters); {len(pairs)} pairs, prompt {statistics.mean(lengths):.0f} "
          f"tokens, completion {statistics.mean(completion):.0f} tokens (mean); batch {args.batch}, "
          f"{args.steps} steps, {args.threads} thread(s), best of {args.repeats}")

    # Rounds interleave the modes (stored, live, precompute, stored, ...): on a shared machine whose
    # speed drifts over minutes, each mode then sees the same conditions; best of the rounds per mode.
    results: dict[str, dict] = {}
    for _ in range(args.repeats):
        for mode in ("stored", "live", "precompute"):
            best = results.get(mode)
            cfg = DPOTrainConfig.for_cpu(ref_source=mode, max_steps=args.steps, batch_size=args.batch,
                                         learning_rate=1e-4, num_threads=args.threads, logging_steps=1)
            began = time.perf_counter()
            result = train_dpo(model_dir, pairs, cfg, None)
            total = time.perf_counter() - began
            run = {"steps_per_s": result.metrics["steps_per_s"], "train_s": result.metrics["train_seconds"],
                   "setup_s": result.metrics.get("ref_setup_s", 0.0), "total_s": total,
                   "losses": [h["loss"] for h in result.history if "loss" in h]}
            if best is None or run["train_s"] < best["train_s"]:
                results[mode] = run

    live = results["live"]
    print(f"{'reference':<12} {'steps/s':>8} {'train s':>8} {'setup s':>8} {'total s':>8} {'speed-up':>9}")
    for mode, r in results.items():
        print(f"{mode:<12} {r['steps_per_s']:>8.2f} {r['train_s']:>8.2f} {r['setup_s']:>8.2f} {r['total_s']:>8.2f} "
              f"{r['steps_per_s'] / live['steps_per_s']:>8.2f}x")
    first = {m: r["losses"][0] for m, r in results.items()}
    drift = max(abs(a - b) for m in ("stored", "precompute") for a, b in zip(results[m]["losses"], live["losses"]))
    print(f"step-1 loss: {json.dumps({m: round(v, 6) for m, v in first.items()})}; "
          f"max loss difference to live over {args.steps} steps: {drift:.2e}")
    ratio = results["stored"]["steps_per_s"] / live["steps_per_s"]
    print(f"stored vs live reference: {ratio:.2f}x steps/s (goal >= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
