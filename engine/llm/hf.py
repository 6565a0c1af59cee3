"""`HFGenerator`: the transformers backend (CPU or CUDA, a local model folder, no hub).

WHY a hand-written decode loop instead of `model.generate`: search sends many requests at once,
each with its own n, temperature, top-p, max_tokens, stop strings and seed, and needs the RAW
log-prob of every sampled token (the replay buffer is the DPO reference). `generate` takes one
set of settings per call and reports processed log-probs. Here one call serves every request:
the distinct prompts are prefilled together (left-padded, one forward), the KV cache is copied
to the n rows of each request, and all rows decode together; finished rows leave the batch.

Log-prob convention (shared with `logprobs()` so the two agree):
- each token's log-prob is `log_softmax` of the unprocessed logits (temperature 1, no top-p);
- a completion's tokens are the generated ones, INCLUDING the end-of-turn (EOS) token when the
  model produced it; the EOS is not part of the text. `logprobs(prompt, text)` scores the
  tokenizer's encoding of `text` followed by the tokenizer's EOS token.
So `sample()` and `logprobs()` agree for completions that ended with EOS and whose sampled tokens
are the tokenizer's own encoding of the text (nearly always for a trained model; a sampled
non-canonical split of the same text has a different, equally valid, path probability).
Completions cut by `max_tokens` ("length") or by a stop string carry the log-probs of the
tokens actually generated (for a stop string: up to the token that completed it, as vLLM does).
"""

from __future__ import annotations

import contextlib
import inspect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.errors import cause_line
from engine.llm.base import (
    Completion,
    ContextOverflow,
    GeneratorError,
    Prompt,
    PromptTooLong,
    SampleRequest,
    SamplingParams,
    is_canonical,
)
from engine.llm.prefix_cache import PrefixCache
from engine.torch_threads import torch_threads

if TYPE_CHECKING:
    from engine.llm.hf_constrain import TokenMasker

_SEED_MOD = 2**63 - 1
# Prompt key/value states kept for reuse (engine/llm/prefix_cache.py): ~85 prompts of 480 tokens for the
# shipped 5.3M model; 0 turns the cache off.
PREFIX_CACHE_MB = 256
# Upper bound on the float32 elements of one logits tensor in `logprobs()` (~1 GiB): long
# completions over a big vocabulary are scored in smaller batches rather than running out of memory.
_LOGITS_BUDGET = 2**28


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """float32 on CPU (exact log-probs, and bf16 matmuls are slow on most CPUs); bf16 on CUDA."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def encode_chat(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of the chat-templated `prompt`, ending with the assistant turn header (what
    `HFGenerator` feeds the model; a tokenizer alone counts a prompt before any weights load)."""
    text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_fit(model_dir: str | Path, prompts: Sequence[tuple[Prompt, int]]) -> tuple[int, int, int] | None:
    """The first (prompt tokens, new tokens, positions) of `prompts` ((prompt, max new tokens) pairs)
    that does not fit the model folder's positions (config.json's `max_position_embeddings`), or None.
    Reads the tokenizer and config only: no weights are loaded."""
    import json

    from transformers import AutoTokenizer

    path = Path(model_dir)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - a broken folder: one line
        raise GeneratorError(f"cannot read the tokenizer and config of {path}: {cause_line(exc)}") from None
    positions = config.get("max_position_embeddings") if isinstance(config, dict) else None
    if not isinstance(positions, int) or getattr(tokenizer, "chat_template", None) is None:
        return None  # unknown: the model says so itself when it runs
    for prompt, new in prompts:
        n = len(encode_chat(tokenizer, prompt))
        if n + new > positions:
            return n, new, positions
    return None


@dataclass
class _Row:
    """One completion being generated: request `req`, sample `k` of its n, prompt slot `slot`."""

    req: int
    k: int
    slot: int
    params: SamplingParams
    rng: torch.Generator | None  # None for greedy rows
    ids: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    finish: str = ""


class HFGenerator:
    """A `Generator` over a transformers causal LM. See the module docstring for the log-prob rules.

    `seed` seeds requests whose params carry no seed (so a whole run is reproducible);
    `num_threads` sets torch's CPU threads during calls only (on 2 cores shared with another busy
    process, 1 thread can be several times faster than 2); `batch_size` caps rows per forward.
    """

    name: str

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "auto",
        dtype: torch.dtype | str | None = None,
        batch_size: int = 64,
        name: str | None = None,
        seed: int | None = None,
        num_threads: int | None = None,
        prefix_cache_mb: int = PREFIX_CACHE_MB,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(model_dir)
        if not path.is_dir():
            raise GeneratorError(f"model folder {path} does not exist")
        dev = _resolve_device(device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, use_safetensors=True, dtype=_resolve_dtype(dtype, dev)
            )
        except Exception as exc:  # noqa: BLE001 - a broken folder (cut weights, a config of another shape): one line
            raise GeneratorError(f"cannot load a model from {path}: {cause_line(exc)}") from None
        # PreTrainedModel.to is wrapped in functools.wraps, whose typeshed type does not bind `self`.
        moved = model.to(dev)  # type: ignore[arg-type]
        self._setup(moved, tokenizer, name or f"hf:{path}", batch_size, seed, num_threads, prefix_cache_mb)

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        name: str = "hf:memory",
        batch_size: int = 64,
        seed: int | None = None,
        num_threads: int | None = None,
        prefix_cache_mb: int = PREFIX_CACHE_MB,
    ) -> HFGenerator:
        """Wrap an already-loaded model and tokenizer (e.g. a model just trained in memory)."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, name, batch_size, seed, num_threads, prefix_cache_mb)
        return self

    def _setup(
        self,
        model: Any,
        tokenizer: Any,
        name: str,
        batch_size: int,
        seed: int | None,
        num_threads: int | None,
        prefix_cache_mb: int = PREFIX_CACHE_MB,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if prefix_cache_mb < 0:
            raise ValueError("prefix_cache_mb must be >= 0")
        if getattr(tokenizer, "chat_template", None) is None:
            raise GeneratorError(f"{name}: the tokenizer has no chat template")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        self.num_threads = num_threads
        self.device = next(model.parameters()).device
        self._rng = random.Random(seed)
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        if not eos_ids:
            raise GeneratorError(f"{name}: neither the tokenizer nor the model names an EOS token")
        self.eos_ids = frozenset(eos_ids)
        # The token `logprobs()` appends: the one a finished reply ends with.
        self.eos_id: int = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(eos_ids)
        pad = tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else self.eos_id
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        # Decode into a KV buffer sized for the chunk (engine/llm/kv_buffer.py) instead of torch.cat per
        # token; False keeps transformers' own cache (bench/kv_buffer.py compares the two).
        self.kv_buffer = True
        # transformers >= 5.2x renamed `past_key_values` to `cache` (the old name warns).
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._masker: TokenMasker | None = None  # built on the first constrained request
        self.prefix_cache = PrefixCache(prefix_cache_mb * 2**20)
        self._weights_version: tuple[int, ...] = ()
        self._prefix_layers_ok: bool | None = None  # known after the first prefill

    def _masks(self, rows: list[_Row], width: int) -> torch.Tensor | None:
        """Allowed next tokens per row (rows without a grammar: all), or None when no row has one."""
        if not any(row.params.grammar is not None for row in rows):
            return None
        if self._masker is None:
            from engine.llm.hf_constrain import TokenMasker

            self._masker = TokenMasker(self.tokenizer, width, self.eos_ids)
        masker = self._masker
        return torch.stack([
            masker.mask(row.params.grammar, self._decode(row.ids)) if row.params.grammar is not None
            else torch.ones(width, dtype=torch.bool)
            for row in rows
        ]).to(self.device)

    # ---------------------------------------------------------------- encoding

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids of the chat-templated prompt, ending with the assistant turn header."""
        return encode_chat(self.tokenizer, prompt)

    def _decode(self, ids: Sequence[int]) -> str:
        # Special tokens are kept so the text re-encodes to the same ids.
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _check_length(self, n_prompt: int, n_new: int) -> None:
        if self.max_positions is not None and n_prompt + n_new > self.max_positions:
            raise PromptTooLong(
                f"{self.name}: prompt of {n_prompt} tokens + {n_new} new tokens exceeds the model's "
                f"{self.max_positions} positions"
            )

    def _forward_context(self) -> contextlib.ExitStack:
        """Inference mode, the generator's CPU threads and, on CUDA, an attention kernel without
        cuDNN's: torch picks cuDNN SDPA for bf16 there, which builds a plan per new sequence length,
        so every decode step paid ~7 ms of CPU (bench/gpu/profile_decode.py: bf16 sampling 18x slower
        than fp32 on an H200)."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(torch_threads(self.num_threads))
        if self.device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                             SDPBackend.MATH]))
        return stack

    # ---------------------------------------------------------------- sampling

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        """For each request, `request.n` completions, in order; every request in one batched pass.
        Requests that do not fit the model's positions are left out and named by ContextOverflow."""
        prompt_ids: list[list[int]] = []
        slot_of: dict[tuple[int, ...], int] = {}
        rows: list[_Row] = []
        overflowed: dict[int, str] = {}
        for r, req in enumerate(requests):
            if req.n < 0:
                raise ValueError(f"request {r}: n must be >= 0")
            if req.params.max_tokens < 1:
                raise ValueError(f"request {r}: max_tokens must be >= 1")
            if req.params.temperature < 0 or not 0 < req.params.top_p <= 1:
                raise ValueError(f"request {r}: temperature must be >= 0 and top_p in (0, 1]")
            ids = self.encode_prompt(req.prompt)
            try:
                self._check_length(len(ids), req.params.max_tokens)
            except PromptTooLong as exc:  # the others are still answered (ContextOverflow below)
                overflowed[r] = str(exc)
                continue
            slot = slot_of.setdefault(tuple(ids), len(prompt_ids))
            if slot == len(prompt_ids):
                prompt_ids.append(ids)
            base_seed = req.params.seed if req.params.seed is not None else self._rng.getrandbits(62)
            for k in range(req.n):
                rng = None
                if req.params.temperature > 0:
                    # One stream per row: a row's sample depends only on (seed, k), never on
                    # which other requests share the batch or how rows are chunked.
                    rng = torch.Generator().manual_seed((base_seed * 1_000_003 + k) % _SEED_MOD)
                rows.append(_Row(req=r, k=k, slot=slot, params=req.params, rng=rng))

        # Rows of the same prompt stay adjacent (they share one prefill); similar prompt lengths
        # go together to limit padding.
        rows.sort(key=lambda row: (len(prompt_ids[row.slot]), row.slot))
        with self._forward_context():
            for start in range(0, len(rows), self.batch_size):
                self._generate_chunk(rows[start : start + self.batch_size], prompt_ids)

        out: list[list[Completion]] = [[None] * req.n for req in requests]  # type: ignore[list-item]
        for row in rows:
            out[row.req][row.k] = self._completion(row)
        if overflowed:
            raise ContextOverflow(overflowed, [None if r in overflowed else o for r, o in enumerate(out)])
        return out

    def _completion(self, row: _Row) -> Completion:
        ids = row.ids[:-1] if row.ids and row.ids[-1] in self.eos_ids else row.ids
        text = self._decode(ids)
        finish = row.finish
        cut = [i for i in (text.find(s) for s in row.params.stop if s) if i >= 0]
        if cut:
            text, finish = text[: min(cut)], "stop"
        return Completion(
            text=text,
            logprob=float(sum(row.logps)),
            token_logprobs=tuple(row.logps),
            n_tokens=len(row.ids),
            finish_reason=finish,
            token_ids=tuple(row.ids),
            canonical=is_canonical(row.ids, text, self._encode_text, self.eos_id, self.eos_ids),
        )

    def _encode_text(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _generate_chunk(self, rows: list[_Row], prompt_ids: list[list[int]]) -> None:
        slots = sorted({row.slot for row in rows})
        local = {slot: i for i, slot in enumerate(slots)}
        logits, cache, mask, positions = self._prefill([prompt_ids[s] for s in slots])
        # Copy each prompt's cache to its rows (n samples of one prompt share one prefill).
        src = torch.tensor([local[row.slot] for row in rows], device=self.device)
        cache.reorder_cache(src)
        room = max(row.params.max_tokens for row in rows) - 1  # the last token is picked, never fed back
        if self.kv_buffer and room > 0:
            from engine.llm.kv_buffer import preallocate

            preallocate(cache, room)
        logits = logits[src]
        mask, last_pos = mask[src], positions[src, -1]

        temps = torch.tensor([row.params.temperature for row in rows], device=self.device)
        top_p = torch.tensor([row.params.top_p for row in rows], device=self.device)
        active = list(rows)
        for _ in range(max(row.params.max_tokens for row in rows)):
            tokens, logps = self._pick(logits, active, temps, top_p, self._masks(active, logits.shape[-1]))
            keep: list[int] = []
            for i, row in enumerate(active):
                tok = int(tokens[i])
                row.ids.append(tok)
                row.logps.append(float(logps[i]))
                if tok in self.eos_ids or self._hit_stop(row):
                    row.finish = "stop"
                elif len(row.ids) >= row.params.max_tokens:
                    row.finish = "length"
                else:
                    keep.append(i)
            if not keep:
                return
            if len(keep) < len(active):
                sel = torch.tensor(keep, device=self.device)
                cache.reorder_cache(sel)
                tokens, mask, last_pos = tokens[sel], mask[sel], last_pos[sel]
                temps, top_p = temps[sel], top_p[sel]
                active = [active[i] for i in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            last_pos = last_pos + 1
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=last_pos[:, None],
                use_cache=True,
                **{self._cache_kw: cache},
            )
            cache, logits = _cache_of(out), out.logits[:, -1]

    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """One forward over the distinct prompts: (last logits, KV cache, attention mask, positions), one
        row per prompt. A prompt's longest cached prefix (engine/llm/prefix_cache.py) is not prefilled
        again: each row is [pad | cached prefix | pad | rest of the prompt], the pads masked out and the
        positions counted over real tokens only, so every token sits where a plain prefill puts it."""
        self._check_weights()
        cache_on = self.prefix_cache.budget_bytes > 0 and self._prefix_layers_ok is not False
        found = [self.prefix_cache.lookup(p) if cache_on else (0, None) for p in prompts]
        past = max(n for n, _ in found)
        rest = [p[n:] for p, (n, _) in zip(prompts, found, strict=True)]
        width = max(len(r) for r in rest)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), past + width), dtype=torch.long)
        for i, ((n, _), r) in enumerate(zip(found, rest, strict=True)):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, past - n : past] = 1
            mask[i, past + width - len(r) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kwargs: dict[str, Any] = {}
        if past:
            from transformers import DynamicCache

            kwargs[self._cache_kw] = DynamicCache(ddp_cache_data=self._stack_past(found, past))
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions[:, past:], use_cache=True,
            logits_to_keep=1, **kwargs,
        )
        cache = _cache_of(out)
        if cache_on:
            self._keep_prompts(prompts, cache, mask)
        return out.logits[:, -1], cache, mask, positions

    def _stack_past(self, found: list[tuple[int, Any]], past: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the cached prefixes right-aligned in a [prompts, heads, past, dim] block (zeros where a
        prompt has less cached: those positions are masked)."""
        template = next(layers for n, layers in found if n)
        stacked = []
        for layer, (k0, v0) in enumerate(template):
            keys = k0.new_zeros((len(found), k0.shape[1], past, k0.shape[3]))
            values = v0.new_zeros((len(found), v0.shape[1], past, v0.shape[3]))
            for i, (n, layers) in enumerate(found):
                if n:
                    keys[i, :, past - n :] = layers[layer][0][0]
                    values[i, :, past - n :] = layers[layer][1][0]
            stacked.append((keys, values))
        return stacked

    def _keep_prompts(self, prompts: list[list[int]], cache: Any, mask: torch.Tensor) -> None:
        """Store each prompt's states (its real positions only) for later prompts that start the same way."""
        layers: list[Any] = list(getattr(cache, "layers", None) or [])
        if self._prefix_layers_ok is None:
            # Only plain dynamic layers hold every position as [batch, heads, tokens, dim]; sliding-window
            # or quantized caches do not, and are left uncached.
            self._prefix_layers_ok = bool(layers) and all(type(lay).__name__ == "DynamicLayer" for lay in layers)
        if not self._prefix_layers_ok:
            self.prefix_cache.clear()
            return
        for i, p in enumerate(prompts):
            real = mask[i].nonzero().squeeze(-1)
            if len(real) != len(p):
                continue
            self.prefix_cache.store(p, [(lay.keys[i : i + 1].index_select(2, real),
                                         lay.values[i : i + 1].index_select(2, real)) for lay in layers])

    def _check_weights(self) -> None:
        """Forget cached prompt states when any parameter changed in place (a model trained between calls)."""
        version = tuple(p._version for p in self.model.parameters())
        if version != self._weights_version:
            self.prefix_cache.clear()
            self._weights_version = version

    def _pick(
        self, logits: torch.Tensor, rows: list[_Row], temps: torch.Tensor, top_p: torch.Tensor,
        allowed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token per row (greedy where temperature is 0) and its RAW log-prob; `allowed`
        (rows x vocab) masks what a grammar forbids before the pick, not in the log-prob."""
        logits = logits.float()
        raw = torch.log_softmax(logits, dim=-1)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        tokens = logits.argmax(dim=-1)
        sampled = [i for i, row in enumerate(rows) if row.rng is not None]
        if sampled:
            idx = torch.tensor(sampled, device=logits.device)
            probs = torch.softmax(logits[idx] / temps[idx, None], dim=-1)
            order = None
            if bool((top_p[idx] < 1).any()):
                # Nucleus: keep the most likely tokens until their mass reaches top_p.
                probs, order = probs.sort(dim=-1, descending=True)
                before = probs.cumsum(-1) - probs
                probs = probs * (before < top_p[idx, None])
            cdf = probs.cumsum(-1)
            u = torch.cat([torch.rand(1, generator=rows[i].rng) for i in sampled]).to(logits.device)
            pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=cdf.shape[1] - 1)
            if order is not None:
                pick = order.gather(1, pick)
            tokens[idx] = pick[:, 0]
        return tokens, raw.gather(1, tokens[:, None])[:, 0]

    def _hit_stop(self, row: _Row) -> bool:
        stops = [s for s in row.params.stop if s]
        if not stops:
            return False
        ids = row.ids[:-1] if row.ids[-1] in self.eos_ids else row.ids
        # A stop of L characters spans at most 4L byte-level tokens (+ slack for merges).
        tail = self._decode(ids[-(4 * max(map(len, stops)) + 4) :])
        return any(s in tail for s in stops)

    # ---------------------------------------------------------------- scoring

    def logprobs(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float | None]:
        """Teacher-forced sum of RAW log-probs of each completion + EOS as the assistant reply."""
        if len(prompts) != len(completions):
            raise ValueError("prompts and completions differ in length")
        items: list[tuple[list[int], int]] = []
        for prompt, text in zip(prompts, completions, strict=True):
            p = self.encode_prompt(prompt)
            c = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos_id]
            self._check_length(len(p), len(c))
            items.append((p + c, len(c)))
        order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
        result: list[float | None] = [None] * len(items)
        vocab = self.model.config.vocab_size
        with self._forward_context():
            start = 0
            while start < len(order):
                end, keep = start + 1, items[order[start]][1]
                while end < len(order) and end - start < self.batch_size:
                    k = max(keep, items[order[end]][1])
                    if (end - start + 1) * (k + 1) * vocab > _LOGITS_BUDGET:
                        break
                    end, keep = end + 1, k
                batch = order[start:end]
                for i, value in zip(batch, self._score([items[i] for i in batch]), strict=True):
                    result[i] = value
                start = end
        return result

    def _score(self, items: list[tuple[list[int], int]]) -> list[float]:
        # Left padding puts every completion at the end of its row, so only the last
        # (longest completion + 1) positions need logits.
        width = max(len(seq) for seq, _ in items)
        keep = max(n for _, n in items) + 1
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for i, (seq, _) in enumerate(items):
            ids[i, width - len(seq) :] = torch.tensor(seq)
            mask[i, width - len(seq) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=keep
        ).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        targets = ids[:, width - keep + 1 :]
        tok = logp.gather(2, targets[..., None])[..., 0]
        n_c = torch.tensor([n for _, n in items], device=self.device)
        cols = torch.arange(keep - 1, device=self.device)
        mine = cols[None, :] >= (keep - 1 - n_c)[:, None]
        return torch.where(mine, tok, torch.zeros_like(tok)).double().sum(-1).tolist()
