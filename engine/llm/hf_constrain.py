"""Token masks for constrained decoding in the HF backend (the grammar: engine/grammar.py).

WHY a mask per step instead of a grammar library: the HF backend already runs its own decode loop
(engine/llm/hf.py), and the composite-action grammar is line-structured, so "may this token come
next?" is a partial regex match of the current line alone (the `regex` module's `partial=True`),
never of the whole text. Two things keep it cheap: where the rest of a line is free text (THOUGHT,
EXPLANATION, plan lines) the mask is every token without a newline, plus the newline tokens that
open a valid next line; elsewhere only the tokens whose first character can come next are tried.
Masks are cached per (grammar, place, line): the rows of one search share most of their lines.

Log-probs stay those of the unmasked distribution (engine/llm/hf.py's rule), so a constrained
sample's log-prob is what teacher-forced scoring and DPO's reference compute for the same text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any

import torch

from engine.grammar import ActionGrammar

CACHE_BYTES = 64 << 20  # masks kept (one byte per vocabulary entry each): 8192 for a 8k vocabulary


class TokenMasker:
    """Which token ids may follow a text under a grammar, for one tokenizer."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Collection[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_ids = sorted(i for i in eos_ids if 0 <= i < vocab_size)
        special = set(getattr(tokenizer, "all_special_ids", ()))
        self.pieces = token_pieces(tokenizer, vocab_size, special)
        # The completion's first token decodes alone: a SentencePiece word token's leading space is
        # dropped there ("\u2581THOUGHT" is "THOUGHT"), so the first mask reads these pieces.
        self.first_pieces = token_pieces(tokenizer, vocab_size, special, anchored=False)
        self.first_by_first: dict[str, list[int]] = {}
        for i, piece in enumerate(self.first_pieces):
            if piece:
                self.first_by_first.setdefault(piece[0], []).append(i)
        self.by_first: dict[str, list[int]] = {}
        no_newline = torch.zeros(vocab_size, dtype=torch.bool)
        self.newline_ids: list[int] = []
        for i, piece in enumerate(self.pieces):
            if not piece:
                continue
            if "\n" in piece:
                self.newline_ids.append(i)
            elif "\x00" not in piece:  # the parser refuses a NUL anywhere in a completion
                no_newline[i] = True
            self.by_first.setdefault(piece[0], []).append(i)
        self.no_newline = no_newline
        self._cache: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()
        self._cache_size = max(64, CACHE_BYTES // max(1, vocab_size))

    def mask(self, grammar: ActionGrammar, text: str) -> torch.Tensor:
        """Allowed next ids after `text` (bool, vocab_size). A text that has left the grammar (it
        cannot, when every token came through this mask) may only end: EOS alone."""
        placed = grammar.place(text)
        if placed is None:
            return self._only_eos()
        where, line = placed
        free = grammar.free_tail(where, line)
        # A free line's mask depends only on where its newline leads, not on its text.
        key = (grammar, where, "\x00free", grammar.after(where, line)) if free else (grammar, where, line)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        allowed = self.no_newline.clone() if free else torch.zeros(self.vocab_size, dtype=torch.bool)
        pieces, by_first = (self.pieces, self.by_first) if text else (self.first_pieces, self.first_by_first)
        if free:
            candidates: Sequence[int] = self.newline_ids
        else:
            firsts = [c for c in by_first if self._fits(grammar, where, line, c)]
            candidates = [i for c in firsts for i in by_first[c]]
        for i in candidates:
            if self._fits(grammar, where, line, pieces[i]):
                allowed[i] = True
        if where == "status" and grammar.complete(where, line):
            allowed[self.eos_ids] = True
        self._cache[key] = allowed
        if not allowed.any():  # a tokenizer without a character the grammar needs: end, never sample garbage
            allowed[self.eos_ids] = True
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return allowed

    @staticmethod
    def _fits(grammar: ActionGrammar, where: str, line: str, piece: str) -> bool:
        """Does `piece`, appended to the current `line` at `where`, keep the text in the grammar?"""
        first, *rest = piece.split("\n")
        current: str | None = line + first
        for nxt in rest:
            following = grammar.after(where, current) if current is not None else None
            if following is None:
                return False
            where, current = following, nxt
        return current is not None and grammar.viable(where, current)

    def _only_eos(self) -> torch.Tensor:
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        allowed[self.eos_ids] = True
        return allowed


def token_pieces(tokenizer: Any, vocab_size: int, special: Collection[int] = (), anchored: bool = True) -> list[str]:
    """The text each id adds when appended to a sequence ("" for special and unused ids). Decoded
    after a fixed plain token, so tokenizers that drop a word's leading space when it starts the text
    (SentencePiece) still give the space; `anchored=False`: what each id is as the text's first token.
    Decoded as the HF backend decodes (no clean-up of spaces, which would turn " ," into ",")."""
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][:1] if anchored else []
    base = decode(anchor) if anchor else ""
    size = min(vocab_size, len(tokenizer))
    pieces = [""] * vocab_size
    for i in range(size):
        if i in special:
            continue
        text = decode([*anchor, i])
        pieces[i] = text[len(base):] if text.startswith(base) else ""
        if "\ufffd" in pieces[i]:  # a part of a multi-byte character: never needed by the grammar
            pieces[i] = ""
    return pieces
