"""GPU check of VLLMGenerator (< 5 minutes on one GPU with vLLM installed; no hub access).

1. Throughput: search-like actor prompts (engine.prompts on a synthetic crafting task; deeper
   steps extend shallower ones, so prompts share prefixes as siblings in a tree do), n samples
   each. Generated tokens/s of `VLLMGenerator.sample` vs raw `vllm.LLM.generate` on the same
   pre-tokenized prompts and SamplingParams (prefix cache reset before every timed run; best of
   --repeats). The ratio is our overhead (templating, decoding, mapping): expect >= 0.9.
2. Log-probs: every sampled token log-prob is present and finite; `logprobs()` is finite; for
   completions that ended with EOS, the sampled (raw) log-prob matches the teacher-forced one
   (per-token median gap < 0.05). Processed (temperature 0.7) log-probs would be far off.
3. Constrained decoding (structured outputs): every finished completion in the grammar; their
   log-probs (re-scored without the mask) match `logprobs()`. Any check that compared nothing fails.
4. Reload (skip with --skip-reload): perturbed weights change a teacher-forced score; reloading
   the original weights restores it.

    PYTHONPATH=. python bench/gpu/vllm_check.py /path/to/model_folder [--prompts 64 --n 4]

Prints one JSON line at the end; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.actions import CompositeAction
from engine.llm.base import Completion, Prompt, SampleRequest, SamplingParams
from engine.llm.vllm_backend import VLLMGenerator, sampling_kwargs
from engine.prompts import HistoryStep, actor_prompt

ENV = (
    "Crafting world. Commands: 'get N ITEM' fetches base items; 'craft N ITEM using N A, N B' "
    "crafts with a listed recipe; 'inventory' lists what you hold."
)
ITEMS = ["oak log", "birch log", "cobblestone", "iron ingot", "string", "redstone", "coal", "sand"]
GOALS = ["wooden pickaxe", "stone axe", "iron sword", "bow", "furnace", "torch", "compass", "glass pane"]


def search_prompts(n_prompts: int, depth: int) -> list[Prompt]:
    """n_prompts actor prompts: n_prompts/depth tasks, each seen at steps 1..depth."""
    prompts = []
    for t in range(math.ceil(n_prompts / depth)):
        goal = GOALS[t % len(GOALS)]
        context = "Crafting commands:\n" + "\n".join(
            f"craft 1 {GOALS[(t + j) % len(GOALS)]} using 2 {ITEMS[(t + j) % len(ITEMS)]}, "
            f"1 {ITEMS[(t + j + 3) % len(ITEMS)]}"
            for j in range(10)
        )
        history: list[HistoryStep] = []
        for d in range(depth):
            obs = f"Got {d + 1} {ITEMS[(t + d) % len(ITEMS)]}." if d else "You hold nothing."
            prompts.append(actor_prompt(ENV, f"craft 1 {goal}", context, history, obs))
            item = ITEMS[(t + d) % len(ITEMS)]
            action = CompositeAction(
                thought=f"I need {item} for the {goal}.",
                command=f"get {d + 1} {item}",
                explanation=f"fetch {item}",
                plan="1. get the base items\n2. craft the parts\n3. craft the goal" if d == 0 else None,
            )
            history.append(HistoryStep(action, obs))
    return prompts[:n_prompts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path, help="local transformers model folder with a chat template")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--depth", type=int, default=4, help="steps per synthetic task (shared prefixes)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--skip-reload", action="store_true")
    ap.add_argument("--skip-sleep", action="store_true", help="skip the sleep / wake / reload check (the loop's)")
    args = ap.parse_args()

    import vllm

    failures: list[str] = []
    t0 = time.perf_counter()
    gen = VLLMGenerator(
        args.model_dir, max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
        sleep_mode=not args.skip_sleep,
    )
    start_s = time.perf_counter() - t0
    mode = getattr(getattr(gen.llm.llm_engine, "model_config", None), "logprobs_mode", "(no such option)")
    print(f"vllm {vllm.__version__}: engine up in {start_s:.1f} s; logprobs_mode={mode!r}")

    prompts = search_prompts(args.prompts, args.depth)
    reqs = [
        SampleRequest(
            p, n=args.n, params=SamplingParams(args.temperature, max_tokens=args.max_tokens, seed=i)
        )
        for i, p in enumerate(prompts)
    ]
    token_prompts = [{"prompt_token_ids": gen.encode_prompt(p)} for p in prompts]
    raw_params = [vllm.SamplingParams(**sampling_kwargs(r.params, r.n, seeded=gen.request_seeds)) for r in reqs]
    gen.sample(reqs[:4])  # warm-up (CUDA graphs, allocator)

    raw_s = ours_s = math.inf
    for _ in range(args.repeats):  # interleaved, best of each; every run starts on a cold prefix cache
        gen.llm.reset_prefix_cache()
        t = time.perf_counter()
        raw_out = gen.llm.generate(token_prompts, raw_params, use_tqdm=False)
        raw_s = min(raw_s, time.perf_counter() - t)
        gen.llm.reset_prefix_cache()
        t = time.perf_counter()
        ours_out = gen.sample(reqs)
        ours_s = min(ours_s, time.perf_counter() - t)
    raw_tokens = sum(len(o.token_ids) for r in raw_out for o in r.outputs)
    ours_tokens = sum(c.n_tokens for comps in ours_out for c in comps)
    raw_tps, ours_tps = raw_tokens / raw_s, ours_tokens / ours_s
    print(f"raw LLM.generate:      {raw_tokens} tokens in {raw_s:.2f} s = {raw_tps:,.0f} tok/s")
    print(f"VLLMGenerator.sample:  {ours_tokens} tokens in {ours_s:.2f} s = {ours_tps:,.0f} tok/s")
    print(f"ratio (ours / raw): {ours_tps / raw_tps:.3f}")

    comps = [c for cs in ours_out for c in cs]
    bad = [
        c for c in comps if c.token_logprobs is None or not all(math.isfinite(x) for x in c.token_logprobs)
    ]
    if bad:
        failures.append(f"{len(bad)}/{len(comps)} completions without finite sampled log-probs")
    ended = [
        (p, c) for p, cs in zip(prompts, ours_out, strict=True) for c in cs if c.finish_reason == "stop"
    ][:64]
    pairs = ended or [(p, cs[0]) for p, cs in zip(prompts, ours_out, strict=True)][:16]
    scored = gen.logprobs([p for p, _ in pairs], [c.text for _, c in pairs])
    if not all(s is not None and math.isfinite(s) for s in scored):
        failures.append(f"logprobs() not finite: {scored[:8]}")
    gaps = [
        abs(s - c.logprob) / c.n_tokens for (_, c), s in zip(ended, scored, strict=False) if s is not None
    ]
    median_gap = statistics.median(gaps) if gaps else None
    print(
        f"sampled vs teacher-forced log-prob, per token, {len(gaps)} EOS-ended completions: median gap {median_gap}"
    )
    if not gaps:  # a check that compared nothing has not passed
        failures.append("no EOS-ended completion to compare sampled and teacher-forced log-probs "
                        "(raise --max-tokens)")
    elif median_gap is not None and median_gap > 0.05:
        failures.append(f"sampled log-probs do not look raw: median per-token gap {median_gap:.3f}")
    constrained = check_constrained(gen, prompts[: max(4, args.prompts // 8)], args, failures)

    reload_ok = None
    if not args.skip_reload:
        reload_ok = check_reload(gen, args.model_dir, pairs[0], failures)
    sleep = None if args.skip_sleep else check_sleep(gen, args.model_dir, pairs[0], failures)

    summary = {
        "vllm": vllm.__version__,
        "model": str(args.model_dir),
        "engine_start_s": round(start_s, 1),
        "raw_tok_s": round(raw_tps),
        "ours_tok_s": round(ours_tps),
        "ratio": round(ours_tps / raw_tps, 3),
        "median_logprob_gap_per_token": median_gap,
        "logprob_comparisons": len(gaps),
        "constrained": constrained,
        "reload_ok": reload_ok,
        "sleep": sleep,
        "total_s": round(time.perf_counter() - t0, 1),
        "failures": failures,
    }
    print(json.dumps(summary))
    return 1 if failures else 0


def check_constrained(gen: VLLMGenerator, prompts: list[Prompt], args: argparse.Namespace,
                      failures: list[str]) -> dict[str, object]:
    """Constrained decoding through vLLM's structured outputs: every finished completion is in the
    grammar, and its (re-scored, unmasked) log-prob matches `logprobs()` where the ids are canonical."""
    from engine.grammar import ActionGrammar

    grammar = ActionGrammar("inventory|get [1-9][0-9]? [a-z ]+|craft [1-9][0-9]? [a-z ]+ using [0-9a-z ,]+")
    params = SamplingParams(args.temperature, max_tokens=max(args.max_tokens, 160), seed=0, grammar=grammar)
    t = time.perf_counter()
    out = gen.sample([SampleRequest(p, n=2, params=params) for p in prompts])
    took = time.perf_counter() - t
    comps = [(p, c) for p, cs in zip(prompts, out, strict=True) for c in cs]
    finished = [(p, c) for p, c in comps if c.finish_reason == "stop"]
    outside = [c.text[:80] for _, c in finished if not grammar.accepts(c.text)]
    canonical = [(p, c) for p, c in finished if c.canonical and c.logprob is not None]
    scored = gen.logprobs([p for p, _ in canonical], [c.text for _, c in canonical])
    gaps = [abs(s - c.logprob) / c.n_tokens for (_, c), s in zip(canonical, scored, strict=True) if s is not None]
    gap = statistics.median(gaps) if gaps else None
    print(f"constrained: {len(finished)}/{len(comps)} finished in {took:.1f} s, {len(outside)} outside the grammar; "
          f"re-scored vs teacher-forced median gap per token {gap} over {len(gaps)}")
    if not finished or outside:
        failures.append(f"constrained: {len(finished)} finished, outside the grammar: {outside[:3]}")
    if not gaps:
        failures.append("constrained: no canonical finished completion to compare log-probs")
    elif gap is not None and gap > 0.05:
        failures.append(f"constrained log-probs are not the unmasked ones: median gap {gap:.3f}")
    return {"completions": len(comps), "finished": len(finished), "outside": len(outside),
            "compared": len(gaps), "median_gap": gap, "s": round(took, 2)}


def check_reload(
    gen: VLLMGenerator, model_dir: Path, pair: tuple[Prompt, Completion], failures: list[str]
) -> bool:
    """Perturbed weights must change a score; the original weights must bring it back."""
    import torch
    from safetensors.torch import load_file, save_file

    prompt, comp = pair
    before = gen.logprobs([prompt], [comp.text])[0]
    with tempfile.TemporaryDirectory() as tmp:
        noisy = Path(tmp) / "perturbed"
        shutil.copytree(model_dir, noisy)
        torch.manual_seed(0)
        for f in noisy.glob("*.safetensors"):
            tensors = load_file(f)
            for k, w in tensors.items():
                if w.is_floating_point() and w.numel() > 1:
                    tensors[k] = (w.float() + 0.05 * w.float().std() * torch.randn_like(w.float())).to(
                        w.dtype
                    )
            save_file(tensors, f, metadata={"format": "pt"})
        t = time.perf_counter()
        gen.reload(noisy)
        changed = gen.logprobs([prompt], [comp.text])[0]
        print(f"reload took {time.perf_counter() - t:.1f} s; score {before:.4f} -> {changed:.4f}")
    gen.reload(model_dir)
    after = gen.logprobs([prompt], [comp.text])[0]
    print(f"reloaded the original: score {after:.4f}")
    ok = abs(changed - before) > 1e-3 and abs(after - before) <= 1e-2 * max(1.0, abs(before))
    if not ok:
        failures.append(f"reload: {before} -> perturbed {changed} -> original {after}")
    return ok


def check_sleep(gen: VLLMGenerator, model_dir: Path, pair: tuple[Prompt, Completion],
                failures: list[str]) -> dict[str, object]:
    """The loop's cycle around training: sleep at level 2 (weights and KV cache freed), wake, write the
    folder back in (`reload`), and the score comes back; prints the device memory freed while asleep."""
    import torch

    prompt, comp = pair
    before = gen.logprobs([prompt], [comp.text])[0]

    def used() -> int:  # the whole device's bytes in use (vLLM's engine core is another process)
        free, total = torch.cuda.mem_get_info()
        return total - free

    awake_bytes = used()
    t = time.perf_counter()
    gen.sleep(2)
    asleep_bytes, slept_s = used(), time.perf_counter() - t
    t = time.perf_counter()
    gen.wake_up()
    gen.reload(model_dir)
    woke_s = time.perf_counter() - t
    after = gen.logprobs([prompt], [comp.text])[0]
    freed = (awake_bytes - asleep_bytes) / 2**30
    print(f"sleep level 2: device memory in use {awake_bytes / 2**30:.1f} -> {asleep_bytes / 2**30:.1f} GiB "
          f"({freed:.1f} GiB freed) in {slept_s:.1f} s; wake + reload {woke_s:.1f} s; score {before:.4f} -> {after:.4f}")
    if freed <= 0 or abs(after - before) > 1e-2 * max(1.0, abs(before)):
        failures.append(f"sleep: freed {freed:.2f} GiB, score {before} -> {after}")
    return {"freed_gib": round(freed, 2), "asleep_gib": round(asleep_bytes / 2**30, 2), "sleep_s": round(slept_s, 1),
            "wake_reload_s": round(woke_s, 1), "score_before": before, "score_after": after}


if __name__ == "__main__":
    sys.exit(main())
