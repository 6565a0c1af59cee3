"""The HF token masker's radix-trie walk (engine/llm/hf_constrain.py) gives exactly the masks of the
first-character index it replaced (bench/masker.py's FirstCharMasker) and of the definition (every
token tried), on grammar walks and on random texts, for a byte-level BPE and a SentencePiece-style
tokenizer."""

from __future__ import annotations

import random

import pytest
import torch

from bench.masker import FirstCharMasker, expert_answers, synthetic_tokenizer
from engine.envs.textcraft import TextCraftEnv
from engine.grammar import ActionGrammar, grammar_for
from engine.llm.hf_constrain import TokenMasker

CHARS = list("abcdeinorstgpwkl ,.:0123456789\n") + ["ACTION: ", "THOUGHT: ", "PLAN:\n", "1. ", "EXPLANATION: ",
                                                   "STATUS: ", "get ", "craft ", " using ", "\x00", "\u2581", "  "]


def _definition(masker: TokenMasker, grammar: ActionGrammar, text: str) -> torch.Tensor:
    """The mask by definition: each token tried alone (no index, no trie)."""
    placed = grammar.place(text)
    allowed = torch.zeros(masker.vocab_size, dtype=torch.bool)
    if placed is None:
        allowed[masker.eos_ids] = True
        return allowed
    where, line = placed
    pieces = masker.pieces if text else masker.first_pieces
    for i, piece in enumerate(pieces):
        allowed[i] = bool(piece) and masker._fits(grammar, where, line, piece)
    if where == "status" and grammar.complete(where, line):
        allowed[masker.eos_ids] = True
    if not allowed.any():
        allowed[masker.eos_ids] = True
    return allowed


def _texts(masker: TokenMasker, grammars: list[ActionGrammar], rng: random.Random) -> list[tuple[ActionGrammar, str]]:
    """Texts reached by sampling allowed tokens (deep in the grammar), the same texts cut at random
    characters, and random strings of grammar words and characters (mostly outside it)."""
    out = []
    for grammar in grammars:
        for _ in range(3):
            text = ""
            for _ in range(60):
                out.append((grammar, text))
                ids = torch.nonzero(masker.mask(grammar, text)).flatten().tolist()
                tid = rng.choice(ids)
                if tid in masker.eos_ids:
                    break
                text += (masker.pieces if text else masker.first_pieces)[tid]
            out += [(grammar, text[:rng.randrange(len(text) + 1)]) for _ in range(5)]
        out += [(grammar, "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 8)))) for _ in range(20)]
        for _, answer in expert_answers(4, seed=rng.randrange(100)):
            out.append((grammar, answer[:rng.randrange(len(answer) + 1)]))
    return out


@pytest.fixture(scope="module")
def grammars() -> list[ActionGrammar]:
    env = TextCraftEnv()
    return [ActionGrammar(), *(grammar_for(env, task) for task in env.tasks("train")[:3])]


def test_the_trie_gives_the_masks_of_the_first_character_index_and_of_the_definition(grammars) -> None:
    tokenizer = synthetic_tokenizer(3000, seed=1)
    eos = {tokenizer.eos_token_id}
    new, old = TokenMasker(tokenizer, len(tokenizer), eos), FirstCharMasker(tokenizer, len(tokenizer), eos)
    texts = _texts(new, grammars, random.Random(0))
    assert len(texts) > 400
    distinct = 0
    for grammar, text in texts:
        new._cache.clear()
        old._cache.clear()
        mask = new.mask(grammar, text)
        assert torch.equal(mask, old.mask(grammar, text)), (grammar.command[:40], text)
        placed = grammar.place(text)
        if placed is not None and grammar.viable(*placed):  # a text the masks can reach (a line that has
            # already left the grammar, e.g. "THOUGHT: a\x00", gets both maskers' free-line mask)
            assert torch.equal(mask, _definition(new, grammar, text)), (grammar.command[:40], text)
        distinct += 1 < int(mask.sum()) < len(tokenizer) - 100  # neither EOS alone nor nearly everything
    assert distinct > 50  # the walks reached constrained places, not only the free and the refused


def test_a_sentencepiece_tokenizers_first_pieces_go_through_their_own_trie(grammars) -> None:
    from test_grammar import _sentencepiece_tokenizer

    tokenizer = _sentencepiece_tokenizer("unigram", True)
    eos = {tokenizer.eos_token_id}
    new, old = TokenMasker(tokenizer, len(tokenizer), eos), FirstCharMasker(tokenizer, len(tokenizer), eos)
    assert new.pieces != new.first_pieces  # a word's leading space is dropped at the start
    for grammar, text in _texts(new, grammars, random.Random(1)):
        new._cache.clear()
        assert torch.equal(new.mask(grammar, text), old.mask(grammar, text)), text
