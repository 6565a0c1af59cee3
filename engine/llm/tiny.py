"""The tiny offline policy: a ~5M-parameter Llama trained on CPU (the default build: ~60 minutes on 2
cores, so it ships as a checkpoint, see `tiny_checkpoint`; small configs build in seconds).

WHY: `make run` must show search and training improving a real model with no network and no GPU.
The model is behaviour-cloned from a noisy TextCraft expert (see `tiny_data`) in the exact actor,
critic and first-error-judge prompts a real LLM receives, then trained on the expert's labels of its
own states (DAgger rounds, `tiny_dagger`), so every part of the pipeline runs on it unchanged. It is
weak on purpose: search and DPO have room to improve it.

The tokenizer is a byte-level BPE trained on the same rows. Its pre-tokenizer splits only at line
breaks, punctuation and digits, so merges may cross spaces: the long constant phrases of the prompts
become a few tokens each (sequence length is what CPU training pays for), while numbers stay single
digits and item names keep one spelling wherever they are copied from.

`ensure_tiny_model()` builds the folder once (deterministic per seed) and reuses it while the
stored config matches.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine import paths
from engine.actions import FormatError, parse
from engine.envs.textcraft_names import trie_pattern
from engine.llm.base import Generator, SampleRequest, SamplingParams
from engine.llm.tiny_config import TinyConfig
from engine.prompts import HistoryStep, actor_prompt
from engine.torch_threads import torch_threads

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from engine.envs.base import Env
    from engine.llm.tiny_data import Row

# Bump when the data builder or training code changes what a given config produces.
TINY_FORMAT = 1
META_FILE = "orchard_tiny.json"
SPECIAL_TOKENS = ("<|pad|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_tiny_dir() -> Path:
    """`$ORCHARD_HOME/models/tiny`, else `<repo>/data/models/tiny` (engine.paths)."""
    return paths.tiny_model_dir()


# ------------------------------------------------------------------ tokenizer and model


def _boundaries(names: Sequence[str]) -> str:
    """Pre-tokenizer split pattern: line breaks, ", " and every word of `names` (with its leading
    space), so an item is spelt the same wherever it appears and templates merge around it."""
    if not names:
        return r"\n|, "
    return rf"\n|, | ?\b(?i:{trie_pattern(names)})\b"


def train_tokenizer(
    texts: Sequence[str], vocab_size: int, names: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """Byte-level BPE over `texts` (see the module docstring), ChatML template with generation
    markers, left padding. `names` are phrases never merged with their surroundings."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_boundaries(names)), "isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token="<|im_start|>",
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def new_model(cfg: TinyConfig, tokenizer: PreTrainedTokenizerFast) -> Any:
    """A freshly initialised Llama (seeded by `cfg.seed`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# ------------------------------------------------------------------ training


@dataclass(frozen=True)
class _Example:
    ids: list[int]
    n_prompt: int  # loss on ids[n_prompt:] (the answer and its EOS)


def encode_rows(rows: Sequence[Row], tokenizer: PreTrainedTokenizerFast) -> list[_Example]:
    """Prompt and answer tokenized apart, answer + EOS, exactly as `HFGenerator` scores them."""
    prompts = [
        tokenizer.apply_chat_template(r.prompt, add_generation_prompt=True, tokenize=False) for r in rows
    ]
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    a_ids = tokenizer([r.answer for r in rows], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [_Example(p + a + [eos], len(p)) for p, a in zip(p_ids, a_ids, strict=True)]


def _batches(examples: list[_Example], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Length-sorted batches of at most `batch_tokens` padded tokens, in shuffled order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].ids), i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * len(examples[i].ids) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _loss(model: Any, examples: Sequence[_Example], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over answer tokens only.

    Rows are RIGHT-padded and no attention mask is passed: under causal attention no real token
    sees the padding after it, and the maskless path is ~2.5x faster on CPU (SDPA with a padding
    mask leaves its fused kernel). The LM head runs only where the loss needs it.
    """
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    target = torch.zeros_like(ids, dtype=torch.bool)
    for i, e in enumerate(examples):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        target[i, e.n_prompt : len(e.ids)] = True
    hidden = model.model(input_ids=ids).last_hidden_state
    predict = target[:, 1:]  # position t predicts token t + 1
    logits = model.lm_head(hidden[:, :-1][predict])
    return torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][predict])


def train_model(
    model: Any, examples: list[_Example], cfg: TinyConfig, pad_id: int, log: Callable[[str], None]
) -> dict[str, float]:
    """AdamW with warm-up and cosine decay for `cfg.steps` steps; returns loss figures."""
    with torch_threads(cfg.threads):
        return _train_loop(model, examples, cfg, pad_id, log)


def _train_loop(
    model: Any,
    examples: list[_Example],
    cfg: TinyConfig,
    pad_id: int,
    log: Callable[[str], None],
) -> dict[str, float]:
    rng = random.Random(cfg.seed)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    model.train()
    queue: list[list[int]] = []
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        if not queue:
            queue = _batches(examples, cfg.batch_tokens, rng)
        batch = [examples[i] for i in queue.pop()]
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = _loss(model, batch, pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == cfg.steps - 1:
            log(f"tiny model: step {step + 1}/{cfg.steps} loss {loss.item():.3f}")
    model.eval()
    tail = losses[-max(1, len(losses) // 10) :]
    return {
        "first_loss": losses[0] if losses else float("nan"),
        "final_loss": sum(tail) / len(tail) if tail else float("nan"),
        "train_seconds": time.perf_counter() - start,
    }


# ------------------------------------------------------------------ build and cache


def build_tiny_model(
    out_dir: Path, cfg: TinyConfig, log: Callable[[str], None] = print, base: Path | None = None
) -> Path:
    """Generate the data, train tokenizer and model, write the folder (no caching logic here).

    `base`: a finished build of the same config without DAgger rounds (`base_config`); its tokenizer and
    weights stand in for the first stage, which that build already ran (the same result, deterministic),
    and only the DAgger rounds run here."""
    from engine.envs.textcraft_names import item_names, item_words
    from engine.llm.tiny_data import build_rows

    began = time.perf_counter()
    rows = build_rows(cfg)
    counts = {kind: sum(r.kind == kind for r in rows) for kind in sorted({r.kind for r in rows})}
    log(f"tiny model: {len(rows)} training rows {counts}")
    metrics: dict[str, Any]
    if base is not None:
        tokenizer, model, metrics = _load_base(base, cfg)
        log(f"tiny model: first stage from {base} (built in {metrics['base_build_seconds']:.0f} s)")
    else:
        pieces = item_names() if cfg.name_pieces == "name" else item_words()
        tokenizer = train_tokenizer([t for r in rows for t in _texts(r)], cfg.vocab_size, pieces)
    examples = _kept(rows, tokenizer, cfg)
    n_tokens = sum(len(e.ids) for e in examples)
    log(f"tiny model: {len(examples)} rows kept, {n_tokens / max(1, len(examples)):.0f} tokens per row")
    if base is None:
        model = new_model(cfg, tokenizer)
        metrics = dict(train_model(model, examples, cfg, tokenizer.pad_token_id, log))
    if cfg.dagger_rounds:
        metrics["dagger"] = _dagger(model, tokenizer, examples, cfg, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if base is not None:  # the base's own files: a re-saved loaded tokenizer adds load-time keys
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (base / name).is_file():
                shutil.copyfile(base / name, out_dir / name)
    meta = {
        "format": TINY_FORMAT,
        "config": asdict(cfg),
        "metrics": {
            **metrics,
            "rows": counts,
            "rows_kept": len(examples),
            "tokens": n_tokens,
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab": len(tokenizer),
        },
        "build_seconds": time.perf_counter() - began + metrics.get("base_build_seconds", 0.0),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2))
    return out_dir


def base_config(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a stored config's first stage (all but the DAgger ones): what a `base` must match."""
    return {k: v for k, v in config.items() if not k.startswith("dagger_")}


def _load_base(base: Path, cfg: TinyConfig) -> tuple[Any, Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = read_meta(base)
    have = base_config((meta or {}).get("config", {}))
    if meta is None or meta.get("format") != TINY_FORMAT or have != base_config(asdict(cfg)) or (
        meta["config"].get("dagger_rounds", 0)
    ):
        raise ValueError(f"{base} is not a first-stage build of this config (no DAgger rounds, same settings)")
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    model.eval()
    metrics = {k: v for k, v in meta["metrics"].items() if k in ("first_loss", "final_loss", "train_seconds")}
    return tokenizer, model, {**metrics, "base_build_seconds": float(meta.get("build_seconds", 0.0))}


def _dagger(
    model: Any, tokenizer: PreTrainedTokenizerFast, examples: list[_Example], cfg: TinyConfig,
    log: Callable[[str], None],
) -> list[dict[str, float]]:
    """`cfg.dagger_rounds` rounds of rollout, expert relabelling and more training (tiny_dagger)."""
    from engine.llm.hf import HFGenerator
    from engine.llm.tiny_dagger import dagger_rows

    generator = HFGenerator.from_model(model, tokenizer, name="tiny:dagger", num_threads=cfg.threads)
    added: list[_Example] = []
    rounds = []
    for r in range(cfg.dagger_rounds):
        began = time.perf_counter()
        rows = dagger_rows(generator, cfg, r, log)
        added += _kept(rows, tokenizer, cfg)
        rollout_s = time.perf_counter() - began
        more = replace(cfg, steps=cfg.dagger_steps, lr=cfg.dagger_lr, seed=cfg.seed + 1 + r)
        metrics = train_model(model, examples + added, more, tokenizer.pad_token_id, log)
        rounds.append({"rows": len(rows), "rows_total": len(added), "rollout_seconds": rollout_s, **metrics})
    return rounds


MORE_FILE = "orchard_tiny_more.json"  # a `train_more` round's record (not META_FILE: the weights are not that build's)


def train_more(base: Path, extra: Sequence[Row], out_dir: Path, copies: int = 1, steps: int | None = None,
               lr: float | None = None, own_rows: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One more round of a finished tiny build's own recipe: its expert rows (regenerated from its stored config,
    deterministic; not its DAgger rows, which need the first stage's rollouts) plus `extra` x `copies`,
    `dagger_steps` steps at peak `dagger_lr` from its weights.

    WHY: the build's DAgger round adds rows this way (beside every expert row, at the build's own step
    size) and gained 8 of 109 test tasks; SFT on search's rows alone at a small step barely moves the
    policy, and at a larger one loses held-out tasks (docs/experiments.md). With `extra` empty it is the
    control: the same steps on the build's rows only. `steps` and `lr` override the round's length and peak lr;
    `own_rows=False` trains on `extra` alone (no rehearsal of the build's rows)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.llm.tiny_data import build_rows

    cfg = build_config(base)
    more = replace(cfg, steps=steps or cfg.dagger_steps, lr=lr or cfg.dagger_lr, seed=cfg.seed + 1 + cfg.dagger_rounds)
    if more.steps < 1:
        raise ValueError(f"{base}: a round of {more.steps} steps trains nothing")
    tokenizer: Any = AutoTokenizer.from_pretrained(base, local_files_only=True)
    own = _kept(build_rows(cfg), tokenizer, cfg) if own_rows else []
    added = _kept(list(extra), tokenizer, cfg) * copies if extra else []
    if not own and not added:
        raise ValueError(f"{base}: a round without the build's rows needs extra rows")
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)  # only once the round is known to train
    log(f"tiny model: {len(own)} build rows + {len(added)} extra ({len(extra)} x {copies}, longer than "
        f"{cfg.max_row_tokens} tokens dropped), "
        f"{more.steps} steps at lr {more.lr}")
    metrics = train_model(model, own + added, more, tokenizer.pad_token_id, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (base / name).is_file():
            shutil.copyfile(base / name, out_dir / name)
    record = {"base": str(base), "build_rows": len(own), "extra_rows": len(extra),
              "extra_rows_kept": len(added) // copies if copies else 0, "copies": copies,
              "steps": more.steps, "lr": more.lr, "seed": more.seed, **metrics}
    (out_dir / MORE_FILE).write_text(json.dumps(record, indent=2))
    return record


def build_config(base: Path) -> TinyConfig:
    """The recipe a finished tiny build was made with (its stored config); ValueError when `base` is no tiny
    build or was built by another version of TinyConfig."""
    meta = read_meta(base)
    if meta is None or meta.get("format") != TINY_FORMAT:
        raise ValueError(f"{base}: not a tiny build (no {META_FILE} with model.safetensors)")
    try:
        return TinyConfig(**meta["config"])
    except TypeError as e:  # a build of another version of TinyConfig
        raise ValueError(f"{base}: its build config does not fit this TinyConfig ({e})") from None


def _kept(rows: Sequence[Row], tokenizer: PreTrainedTokenizerFast, cfg: TinyConfig) -> list[_Example]:
    """The rows encoded, those longer than `cfg.max_row_tokens` dropped."""
    return [e for e in encode_rows(rows, tokenizer) if len(e.ids) <= cfg.max_row_tokens]


def _texts(row: Row) -> list[str]:
    return [m["content"] for m in row.prompt] + [row.answer]


def read_meta(path: Path) -> dict[str, Any] | None:
    """The stored build record, or None when the folder holds no complete build."""
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if (path / "model.safetensors").exists() else None


def ensure_tiny_model(
    path: Path | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
    config: TinyConfig | None = None,
) -> Path:
    """The tiny model's folder, built first if missing or built from another config.

    The build goes to a sibling temp folder and is renamed into place, so an interrupted build
    never leaves a folder that looks complete, and concurrent builders do not mix files.
    """
    path = Path(path) if path is not None else default_tiny_dir()
    cfg = replace(config or TinyConfig(), seed=seed)
    wanted = {"format": TINY_FORMAT, "config": asdict(cfg)}
    meta = read_meta(path)
    if meta is not None and {k: meta.get(k) for k in wanted} == wanted:
        return path
    log(f"tiny model: building {path} (seed {seed}; the default config takes about an hour on 2 CPU cores)")
    tmp = path.with_name(f".{path.name}.building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny_model(tmp, cfg, log)
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    log(f"tiny model: built in {read_meta(path)['build_seconds']:.0f} s")  # type: ignore[index]
    return path


# ------------------------------------------------------------------ evaluation


def rollout_outcomes(
    generator: Generator,
    make_env: Callable[[], Env],
    task_ids: Sequence[str],
    max_steps: int = 15,
    temperature: float = 0.0,
    seed: int = 0,
    max_tokens: int = 256,
) -> dict[str, bool]:
    """Run the generator as the actor on every task (one env each), all tasks batched per step.

    An episode ends on success (reward 1), a non-CONTINUE status, a format error, or `max_steps`.
    """
    envs = {tid: make_env() for tid in task_ids}
    obs = {tid: env.reset(tid) for tid, env in envs.items()}
    history: dict[str, list[HistoryStep]] = {tid: [] for tid in task_ids}
    success = dict.fromkeys(task_ids, False)
    active = list(task_ids)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    for _ in range(max_steps):
        if not active:
            break
        requests = []
        for tid in active:
            env, task = envs[tid], envs[tid].task(tid)
            prompt = actor_prompt(env.describe(), task.goal, task.context, history[tid], obs[tid])
            requests.append(SampleRequest(prompt, n=1, params=params))
        still = []
        for tid, (completion,) in zip(active, generator.sample(requests), strict=True):
            action = parse(completion.text)
            if isinstance(action, FormatError):
                continue
            step = envs[tid].step(action.command)
            history[tid].append(HistoryStep(action, step.observation))
            obs[tid] = step.observation
            if step.reward >= 1.0:
                success[tid] = True
            elif not step.done and action.status == "CONTINUE":
                still.append(tid)
        active = still
    return success


def rollout_success_rate(
    generator: Generator,
    make_env: Callable[[], Env],
    task_ids: Sequence[str],
    max_steps: int = 15,
    temperature: float = 0.0,
) -> float:
    """Fraction of `task_ids` the generator solves acting alone (see `rollout_outcomes`)."""
    outcomes = rollout_outcomes(generator, make_env, task_ids, max_steps, temperature)
    return sum(outcomes.values()) / max(1, len(outcomes))
