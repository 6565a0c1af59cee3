"""How far apart are stored (search-time) and re-scored (training-time) reference log-probs?

DPO's `ref_source=auto` uses the replay buffer's log-probs as the reference when a spot check
agrees within a tolerance (nats per token). Search scores in the generator's dtype (HF: fp32 on
CPU, bf16 on CUDA; vLLM: the engine's, bf16 for the models here), training re-scores with fp32
master weights under bf16 autocast (engine.train.common.load_model). This bench measures the
per-token gap |stored - rescored| / tokens between the generator's teacher-forced scoring
(`HFGenerator.logprobs`, fp32 and bf16 weights) and the DPO trainer's own reference pass (fp32 and
bf16 autocast), on completions the model sampled itself, and prints max / p99 / mean per pairing.

    PYTHONPATH=. python bench/gpu/ref_tolerance.py [--model DIR] [--device cpu|cuda] [--n 48]

Without --model it builds the random-weights Llama (engine/llm/scratch_model.py). Prints a table
and one JSON line last. (vLLM's bf16 kernels are not measured here: vLLM does not run on CPU.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])  # the repository root, not bench/gpu

import torch

from engine.datasets.pairs import Pair
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.hf import HFGenerator
from engine.llm.scratch_model import build_tiny_model
from engine.prompts import actor_prompt
from engine.train.dpo import DPOTrainConfig, build_trainer


def sample_pairs(gen: HFGenerator, n: int, max_tokens: int) -> list[Pair]:
    prompts = [actor_prompt("Commands: get N item, craft N X using N a, inventory.", f"craft item {i}", "", [],
                            f"You have {i % 5} oak logs.") for i in range(n)]
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)
    outs = gen.sample([SampleRequest(p, 2, params) for p in prompts])
    return [Pair(id=f"p{i}", kind="step", run_id="bench", tree_id=None, task_id=f"t{i}", node_id=0, chosen_node=1,
                 rejected_node=2, prompt=p, chosen=o[0].text, rejected=o[1].text, q_chosen=1.0, q_rejected=0.0,
                 logprob_chosen=None, logprob_rejected=None, depth=0, status="approved")
            for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]


def generator_scores(model: Path, device: str, dtype: torch.dtype, pairs: list[Pair]) -> list[float]:
    gen = HFGenerator(model, device=device, dtype=dtype, seed=0)
    prompts = [p.prompt for p in pairs for _ in (0, 1)]
    texts = [t for p in pairs for t in (p.chosen, p.rejected)]
    return [float(v) for v in gen.logprobs(prompts, texts)]


def trainer_scores(model: Path, device: str, precision: str, pairs: list[Pair]) -> tuple[list[float], list[int]]:
    cfg = DPOTrainConfig(ref_source="precompute", device=device, precision=precision, max_steps=1, batch_size=8,
                         max_length=1024)
    trainer, _tok, rows = build_trainer(model, pairs, cfg, scratch=tempfile.mkdtemp(prefix="orchard-reftol-"))
    data = trainer.train_dataset
    scores = [float(v) for c, r in zip(data["ref_chosen_logps"], data["ref_rejected_logps"], strict=True)
              for v in (c, r)]
    tokens = [len(r[k]) for r in rows for k in ("chosen_ids", "rejected_ids")]
    return scores, tokens


def gaps(a: list[float], b: list[float], tokens: list[int]) -> dict[str, float]:
    per = sorted(abs(x - y) / max(1, n) for x, y, n in zip(a, b, tokens, strict=True))
    return {"max": per[-1], "p99": per[min(len(per) - 1, int(0.99 * len(per)))], "mean": sum(per) / len(per)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n", type=int, default=48, help="prompts (two sampled completions each)")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    model = args.model or build_tiny_model(Path(tempfile.mkdtemp(prefix="orchard-reftol-")) / "m", seed=0)
    torch.manual_seed(0)
    pairs = sample_pairs(HFGenerator(model, device=args.device, dtype=torch.float32, seed=0), args.n, args.max_tokens)
    stored = {"hf-fp32": generator_scores(model, args.device, torch.float32, pairs),
              "hf-bf16": generator_scores(model, args.device, torch.bfloat16, pairs)}
    rescored = {}
    tokens: list[int] = []
    for precision in ("fp32", "bf16"):
        rescored[f"train-{precision}"], tokens = trainer_scores(model, args.device, precision, pairs)
    table = {f"{s} vs {r}": gaps(stored[s], rescored[r], tokens) for s in stored for r in rescored}
    print(f"model {model}, device {args.device}, {len(tokens)} completions, "
          f"{sum(tokens) / len(tokens):.1f} tokens each on average")
    print(f"{'stored vs re-scored':<28} {'max':>10} {'p99':>10} {'mean':>10}   (nats per token)")
    for name, g in table.items():
        print(f"{name:<28} {g['max']:>10.2e} {g['p99']:>10.2e} {g['mean']:>10.2e}")
    print(json.dumps({"device": args.device, "model": str(model), "completions": len(tokens), "gaps": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
