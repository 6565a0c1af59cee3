"""Token masks for constrained decoding in the HF backend (the grammar: engine/grammar.py).

WHY a mask per step instead of a grammar library: the HF backend already runs its own decode loop
(engine/llm/hf.py), and the composite-action grammar is line-structured, so "may this token come
next?" is a partial regex match of the current line alone (the `regex` module's `partial=True`),
never of the whole text. Three things keep it cheap: where the rest of a line is free text (THOUGHT,
EXPLANATION, plan lines, an ACTION line under the any-line command) the mask is every token without
a newline, plus the newline tokens that open a valid next line; elsewhere the pieces are walked as a
radix trie (`_Trie`): a prefix that cannot continue the line prunes every piece that extends it, so
one partial match answers for a whole subtree (exact: a partial regex match that fails for a text
fails for every extension of it). Masks are cached per (grammar, place, line): the rows of one search
share most of their lines. bench/masker.py times it against the first-character index it replaced
(~10 us per candidate token).

Log-probs stay those of the unmasked distribution (engine/llm/hf.py's rule), so a constrained
sample's log-prob is what teacher-forced scoring and DPO's reference compute for the same text.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.grammar import ActionGrammar

CACHE_BYTES = 64 << 20  # masks kept (one byte per vocabulary entry each): 8192 for a 8k vocabulary


@dataclass
class _Node:
    """A radix-trie node: `prefix` (the whole text from the root), `ids` of the pieces without a
    newline equal to it, `newline_ids` of the pieces whose text before their first newline equals it,
    and [`lo`, `hi`): its subtree's positions in the trie's key order."""

    prefix: str
    lo: int
    hi: int
    ids: list[int] = field(default_factory=list)
    newline_ids: list[int] = field(default_factory=list)
    children: list[_Node] = field(default_factory=list)


class _Trie:
    """The pieces of one tokenizer as a radix trie keyed by their text before the first newline.

    WHY keyed that way: a piece fits only if the line plus its first segment can still become a line
    of the grammar (a newline piece needs that segment to finish the line, which is stricter), so a
    failed partial match at a node rules out its whole subtree, newline pieces included. Pieces that
    start with a newline (empty first segment) sit in `leading_newline` and fit only where the line
    is already whole. A subtree is a range of the key order, so where a prefix makes the rest of the
    line free text its plain pieces (no newline, no NUL) are allowed in one tensor operation."""

    def __init__(self, pieces: Sequence[str]) -> None:
        keyed = sorted((p.split("\n", 1)[0], "\n" in p, i) for i, p in enumerate(pieces) if p)
        self.leading_newline = [i for key, nl, i in keyed if not key]
        items = [k for k in keyed if k[0]]
        self.ids = torch.tensor([i for _, _, i in items], dtype=torch.long)
        self.plain = torch.tensor([not nl and "\x00" not in key for key, nl, _ in items], dtype=torch.bool)
        self.newline_at = [k for k, (_, nl, _) in enumerate(items) if nl]  # positions, ascending
        self.roots = self._build(items)

    def newline_ids(self, lo: int, hi: int) -> list[int]:
        """The ids of the newline pieces at positions [lo, hi)."""
        start, stop = bisect.bisect_left(self.newline_at, lo), bisect.bisect_left(self.newline_at, hi)
        return [int(self.ids[k]) for k in self.newline_at[start:stop]]

    @staticmethod
    def _build(items: list[tuple[str, bool, int]]) -> list[_Node]:
        """Radix nodes over `items` (sorted by key, every key non-empty), without recursion (a piece
        can be hundreds of characters long)."""
        roots: list[_Node] = []
        stack: list[tuple[int, int, int, list[_Node]]] = [(0, len(items), 0, roots)]  # (lo, hi, depth, out)
        while stack:
            lo, hi, depth, out = stack.pop()
            i = lo
            while i < hi:
                char = items[i][0][depth]
                j = i + 1
                while j < hi and items[j][0][depth] == char:
                    j += 1
                first, last = items[i][0], items[j - 1][0]  # sorted: their common prefix is the group's
                common = depth + 1
                while common < min(len(first), len(last)) and first[common] == last[common]:
                    common += 1
                node = _Node(first[:common], i, j)
                k = i
                while k < j and len(items[k][0]) == common:
                    (node.newline_ids if items[k][1] else node.ids).append(items[k][2])
                    k += 1
                out.append(node)
                if k < j:
                    stack.append((k, j, common, node.children))
                i = j
        return roots


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
        self.trie, self.first_trie = _Trie(self.pieces), _Trie(self.first_pieces)
        no_newline = torch.zeros(vocab_size, dtype=torch.bool)
        self.newline_ids: list[int] = []
        for i, piece in enumerate(self.pieces):
            if not piece:
                continue
            if "\n" in piece:
                self.newline_ids.append(i)
            elif "\x00" not in piece:  # the parser refuses a NUL anywhere in a completion
                no_newline[i] = True
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
        if free:
            allowed = self.no_newline.clone()
            ids = [i for i in self.newline_ids if self._fits(grammar, where, line, self.pieces[i])]
        else:
            allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
            ids = self._walk(self.trie if text else self.first_trie, self.pieces if text else self.first_pieces,
                             grammar, where, line, allowed)
        if ids:
            allowed[torch.tensor(ids, dtype=torch.long)] = True
        if where == "status" and grammar.complete(where, line):
            allowed[self.eos_ids] = True
        self._cache[key] = allowed
        if not allowed.any():  # a tokenizer without a character the grammar needs: end, never sample garbage
            allowed[self.eos_ids] = True
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return allowed

    def _walk(self, trie: _Trie, pieces: Sequence[str], grammar: ActionGrammar, where: str, line: str,
              allowed: torch.Tensor) -> list[int]:
        """The ids of `trie` whose piece fits after `line` at `where` (exactly `_fits`, pruned by
        prefix); whole free subtrees are set in `allowed` directly."""
        out: list[int] = []
        if trie.leading_newline and grammar.after(where, line) is not None:
            out += [i for i in trie.leading_newline if self._fits(grammar, where, line, pieces[i])]
        stack = list(trie.roots)
        while stack:
            node = stack.pop()
            if not grammar.viable(where, line + node.prefix):
                continue  # no piece that starts with this prefix can fit
            if grammar.free_tail(where, line + node.prefix):  # the rest of the line is free: every plain piece
                span = slice(node.lo, node.hi)
                allowed[trie.ids[span][trie.plain[span]]] = True
                out += [i for i in trie.newline_ids(node.lo, node.hi) if self._fits(grammar, where, line, pieces[i])]
                continue
            out += node.ids
            if node.newline_ids and grammar.after(where, line + node.prefix) is not None:
                out += [i for i in node.newline_ids if self._fits(grammar, where, line, pieces[i])]
            stack += node.children
        return out

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
