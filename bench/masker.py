"""The HF backend's token masker per decode step: the first-character index vs the radix trie.

Issue 29 item 10: `TokenMasker` (engine/llm/hf_constrain.py) tried, at every constrained place, each
token whose first character could come next, one partial regex match (~10 us) each: 0.1-0.2 s per
step on a 150k vocabulary. It now walks the pieces as a radix trie (one failed match prunes every
piece that extends it), and an ACTION line under the any-line command is free text. This times
`mask()` per decode step, both maskers in one run, on tokenizers of ~32k and ~150k pieces built here
(no download: a byte-level BPE whose vocabulary is words of the repository's own text and of
TextCraft's items, with and without a leading space and capitalised, numbers, punctuation and
whitespace runs, newline pieces, and pseudo-words from syllables up to the size; every prefix of a
piece is a piece, as BPE merges make them). The texts are TextCraft expert answers under their
tasks' grammars (and the any-line grammar), cut at every token. Two figures per arm: `fresh` (the
mask cache emptied before each step: the work of a step never seen) and `run` (the cache kept over
the run: what a search pays). It also checks the two maskers give the same mask at every step.
The vocabulary is drawn from the repository's text at the commit run, so it differs a little
between commits (the figures are per step, not per piece).

    .venv/bin/python bench/masker.py [--sizes 32000,150000] [--answers 12] [--fresh-steps 100]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: this checkout's engine (tests import it as bench.masker)
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from engine.actions import render
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import TextCraftExpert
from engine.grammar import ActionGrammar, grammar_for
from engine.llm.hf_constrain import TokenMasker

ROOT = Path(__file__).resolve().parents[1]


class FirstCharMasker(TokenMasker):
    """The masker before the trie (as of commit 6ca7655): every token whose first character fits is
    tried with one partial match; kept here as the baseline and as the reference tests compare to."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Any) -> None:
        super().__init__(tokenizer, vocab_size, eos_ids)
        self.by_first: dict[str, list[int]] = {}
        self.first_by_first: dict[str, list[int]] = {}
        for pieces, index in ((self.pieces, self.by_first), (self.first_pieces, self.first_by_first)):
            for i, piece in enumerate(pieces):
                if piece:
                    index.setdefault(piece[0], []).append(i)

    def mask(self, grammar: ActionGrammar, text: str) -> torch.Tensor:
        placed = grammar.place(text)
        if placed is None:
            return self._only_eos()
        where, line = placed
        free = old_free_tail(grammar, where, line)
        key = (grammar, where, "\x00free", grammar.after(where, line)) if free else (grammar, where, line)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        allowed = self.no_newline.clone() if free else torch.zeros(self.vocab_size, dtype=torch.bool)
        pieces, by_first = (self.pieces, self.by_first) if text else (self.first_pieces, self.first_by_first)
        candidates: Sequence[int]
        if free:
            candidates = self.newline_ids
        else:
            firsts = [c for c in by_first if self._fits(grammar, where, line, c)]
            candidates = [i for c in firsts for i in by_first[c]]
        for i in candidates:
            if self._fits(grammar, where, line, pieces[i]):
                allowed[i] = True
        if where == "status" and grammar.complete(where, line):
            allowed[self.eos_ids] = True
        self._cache[key] = allowed
        if not allowed.any():
            allowed[self.eos_ids] = True
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return allowed


def old_free_tail(grammar: ActionGrammar, where: str, line: str) -> bool:
    """ActionGrammar.free_tail before the any-line ACTION line counted as free."""
    from engine.grammar import _FREE_HEADS

    heads = _FREE_HEADS[where]
    return heads is not None and heads.match(line) is not None


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(
        range(ord("\xae"), ord("\xff") + 1))
    chars, n = dict(zip(keep, map(chr, keep), strict=True)), 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def _words() -> list[str]:
    """Words of the repository's own prose and code, and TextCraft's item names (no download)."""
    text = " ".join(p.read_text(errors="ignore") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                                                            *sorted((ROOT / "engine").rglob("*.py"))])
    env = TextCraftEnv()
    items = " ".join(t.context if isinstance(t.context, str) else str(t.context) for t in env.tasks("train"))
    return sorted(set(re.findall(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]+", text + " " + items)))


def synthetic_tokenizer(size: int, seed: int = 0) -> Any:
    """A byte-level BPE tokenizer (transformers' fast tokenizer) of about `size` pieces: realistic
    pieces (module docstring), every prefix of a piece a piece, merges that build each piece from
    its prefix and last character, "<|endoftext|>" the EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    byte_char = _byte_chars()
    words = _words()
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in ["a", "e", "i", "o", "u", "ai", "ou", "ee", "an", "er"]]
    pieces: set[str] = set()
    candidates = [w for word in words for w in (word, " " + word, word.capitalize(), " " + word.capitalize(),
                                                word.lower(), " " + word.lower())]
    candidates += [str(n) for n in range(1000)] + [" " + str(n) for n in range(1000)]
    candidates += [" " * k for k in range(1, 17)] + ["\n" * k for k in range(1, 4)]
    candidates += [p + "\n" for p in (".", ":", ",", ")", "]", "}", "\"", "'", ";")] + ["\n" + " " * k for k in range(1, 9)]
    candidates += [".\n\n", ":\n\n", "\n\n\n\n"]
    rng.shuffle(candidates)

    def add(piece: str) -> None:
        data = piece.encode()
        for k in range(1, len(data) + 1):
            pieces.add("".join(byte_char[b] for b in data[:k]))

    for b in range(256):
        pieces.add(byte_char[b])
    for piece in candidates:
        if len(pieces) >= size:
            break
        add(piece)
    while len(pieces) < size:  # pseudo-words: syllables, with a leading space most of the time
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
        add((" " if rng.random() < 0.7 else "") + (word.capitalize() if rng.random() < 0.2 else word))
    ordered = sorted(pieces, key=lambda p: (len(p), p))
    vocab = {p: i for i, p in enumerate(ordered)}
    merges = [(p[:-1], p[-1]) for p in ordered if len(p) > 1]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)
    fast.add_special_tokens({"eos_token": "<|endoftext|>"})
    return fast


def expert_answers(n: int, seed: int = 0) -> list[tuple[ActionGrammar, str]]:
    """(grammar, rendered expert answer) over TextCraft's train tasks, every other one under the
    any-line grammar (an env without a command pattern)."""
    env, out = TextCraftEnv(), []
    for task in env.tasks("train"):
        env.reset(task.id)
        expert = TextCraftExpert(env, 0.0, task.id, compact=True, chain=True)
        for i in range(6):
            step = expert.act(first_step=i == 0)
            grammar = grammar_for(env, task) if len(out) % 2 == 0 else ActionGrammar()
            out.append((grammar, render(step.action)))
            if len(out) >= n or env.step(step.action.command).done:
                break
        if len(out) >= n:
            break
    random.Random(seed).shuffle(out)
    for grammar, _ in out:
        grammar.viable("start", "")  # compile its line regexes now, outside either arm's time
    return out


def steps(tokenizer: Any, answers: list[tuple[ActionGrammar, str]]) -> list[tuple[ActionGrammar, str]]:
    """(grammar, text so far) at every decode step of each answer (its tokens in this tokenizer)."""
    out = []
    for grammar, text in answers:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out += [(grammar, tokenizer.decode(ids[:k], clean_up_tokenization_spaces=False)) for k in range(len(ids))]
    return out


def time_masks(masker: TokenMasker, work: list[tuple[ActionGrammar, str]], fresh: bool) -> tuple[float, list[Any]]:
    """Mean ms per mask() over `work` (the cache emptied before each call when `fresh`), and the masks."""
    masker._cache.clear()
    masks, start = [], time.perf_counter()
    for grammar, text in work:
        if fresh:
            masker._cache.clear()
        masks.append(masker.mask(grammar, text))
    return (time.perf_counter() - start) * 1000 / len(work), masks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="32000,150000", help="vocabulary sizes (comma-separated)")
    ap.add_argument("--answers", type=int, default=12, help="expert answers to step through")
    ap.add_argument("--fresh-steps", type=int, default=100, help="steps timed with the cache emptied (a sample)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    answers = expert_answers(args.answers)
    for size in (int(s) for s in args.sizes.split(",")):
        t0 = time.perf_counter()
        tok = synthetic_tokenizer(size)
        eos = {tok.eos_token_id}
        new, old = TokenMasker(tok, len(tok), eos), FirstCharMasker(tok, len(tok), eos)
        work = steps(tok, answers)
        sample = random.Random(0).sample(work, min(args.fresh_steps, len(work)))
        print(f"vocabulary {len(tok):,} pieces (built in {time.perf_counter() - t0:.1f} s, both maskers); "
              f"{len(answers)} answers, {len(work)} decode steps, {len(sample)} of them timed fresh")
        row: dict[str, float] = {}
        for name, masker in (("first-char", old), ("trie", new)):
            row[f"{name} fresh"], fresh_masks = time_masks(masker, sample, fresh=True)
            row[f"{name} run"], run_masks = time_masks(masker, work, fresh=False)
            if name == "first-char":
                reference = (fresh_masks, run_masks)
            else:
                same = all(torch.equal(a, b) for a, b in zip(reference[0] + reference[1], fresh_masks + run_masks,
                                                              strict=True))
        allowed = statistics.mean(float(m.sum()) for m in reference[1])
        print(f"  ms per step, cache emptied each step: first-char {row['first-char fresh']:.2f}, trie "
              f"{row['trie fresh']:.2f} ({row['first-char fresh'] / row['trie fresh']:.1f}x)")
        print(f"  ms per step over the run, cache kept: first-char {row['first-char run']:.2f}, trie "
              f"{row['trie run']:.2f} ({row['first-char run'] / row['trie run']:.1f}x)")
        print(f"  same masks at every step: {same}; {allowed:,.0f} tokens allowed per step on average")
        if not same:
            raise SystemExit("the trie's masks differ from the first-character index's")


if __name__ == "__main__":
    main()
