"""Constrained decoding: the composite-action grammar (engine/grammar.py), TextCraft's command
pattern, the HF backend's token masks (engine/llm/hf_constrain.py) and the backends that take or
refuse a grammar."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import regex
from fuzz_data import model_outputs

from engine.actions import FormatError, parse, render
from engine.config import SearchConfig
from engine.envs.textcraft import TextCraftEnv
from engine.envs.textcraft_expert import TextCraftExpert
from engine.grammar import ActionGrammar, alternatives, grammar_for, literal
from engine.llm.base import GeneratorError, SampleRequest, SamplingParams
from engine.prompts import actor_prompt

SHIPPED = Path(__file__).resolve().parents[1] / "data" / "models" / "shipped" / "textcraft-tiny"


def _line_walk_accepts(grammar: ActionGrammar, text: str) -> bool:
    """Acceptance by the line matcher (what the token masks use), to compare with the one regex."""
    placed = grammar.place(text)
    return placed is not None and placed[0] == "status" and grammar.complete(*placed)


def _expert_answers(tasks: int = 40, noise: float = 0.3) -> list[tuple[object, str]]:
    """(task, rendered correct expert action) for the first steps of `tasks` train tasks."""
    env, out = TextCraftEnv(), []
    for task in env.tasks("train")[:tasks]:
        env.reset(task.id)
        expert = TextCraftExpert(env, noise, task.id, compact=True, chain=True)
        for i in range(12):
            step = expert.act(first_step=i == 0)
            if not step.is_mistake:
                out.append((task, render(step.action)))
            if env.step(step.action.command).done:
                break
    return out


@pytest.mark.slow
def test_textcraft_pattern_takes_every_correct_expert_command_on_every_task() -> None:
    env, checked = TextCraftEnv(), 0
    for split in ("train", "test"):
        for task in env.tasks(split):
            grammar = grammar_for(env, task)
            command = regex.compile(grammar.command)
            env.reset(task.id)
            expert = TextCraftExpert(env, 0.0, task.id, compact=True, chain=True)
            for i in range(30):
                step = expert.act(first_step=i == 0)
                assert command.fullmatch(step.action.command), (task.id, step.action.command)
                assert grammar.accepts(render(step.action)), (task.id, render(step.action))
                checked += 1
                if env.step(step.action.command).done:
                    break
    assert checked > 1000


def test_textcraft_pattern_refuses_names_the_task_does_not_have() -> None:
    env = TextCraftEnv()
    task = env.tasks("train")[0]
    command = regex.compile(grammar_for(env, task).command)
    assert command.fullmatch("inventory")
    assert not command.fullmatch("get 1 unobtainium")
    assert not command.fullmatch(f"craft 1 {task.goal.split(' ', 2)[2]} using 1 unobtainium")
    assert not command.fullmatch("get 0 stick") and not command.fullmatch("look around")


def test_the_one_regex_and_the_line_matcher_accept_the_same_texts() -> None:
    env = TextCraftEnv()
    answers = _expert_answers(10)
    grammar = grammar_for(env, answers[0][0])  # accepts that task's answers, refuses most others
    texts = [text for _, text in answers]
    rng = random.Random(0)
    mutated = []
    for text in texts[:60]:
        cut = rng.randrange(len(text))
        mutated += [text[:cut], text + "\n", text + " extra", text.replace("STATUS: CONTINUE", "STATUS: MAYBE"),
                    text.replace("THOUGHT: ", "THOUGHTS: "), text.replace("\nEXPLANATION", "\n\nEXPLANATION"),
                    "PLAN:\n" + text, text[:cut] + text[cut + 1:]]
    fuzz = [case.values[0][:5000] for case in model_outputs()]
    free = ActionGrammar()
    agree = 0
    for g in (grammar, free):
        for text in texts + mutated + fuzz:
            assert g.accepts(text) == _line_walk_accepts(g, text), text[:200]
            agree += g.accepts(text)
    assert agree > len(texts)  # the comparison is not all-False
    # What the grammar accepts, the parser reads, with the same command.
    for task, text in answers:
        assert grammar_for(env, task).accepts(text) and not isinstance(parse(text), FormatError)


def test_alternatives_is_an_exact_list() -> None:
    pattern = regex.compile(alternatives(["go north", "go north east", "take key (red)"]))
    assert pattern.fullmatch("go north east") and pattern.fullmatch("take key (red)")
    assert not pattern.fullmatch("go") and not pattern.fullmatch("take key red")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SHIPPED)


@pytest.mark.slow
def test_masks_allow_every_token_of_every_expert_answer_and_eos_only_at_the_end(tokenizer) -> None:
    """Constrained decoding never forbids what the policy was trained to write."""
    from engine.llm.hf_constrain import TokenMasker

    masker = TokenMasker(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    env = TextCraftEnv()
    for task, text in _expert_answers(25):
        grammar = grammar_for(env, task)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for k, tok in enumerate(ids):
            mask = masker.mask(grammar, tokenizer.decode(ids[:k]))
            assert mask[tok], (text, k, tokenizer.decode([tok]))
            assert not mask[tokenizer.eos_token_id]
        assert masker.mask(grammar, text)[tokenizer.eos_token_id]
        assert masker.mask(grammar, text).sum() == 1  # after STATUS: only the end


@pytest.mark.slow
def test_constrained_samples_stay_in_the_grammar_and_keep_raw_logprobs() -> None:
    from engine.llm.hf import HFGenerator

    gen = HFGenerator(SHIPPED, name="tiny", num_threads=1)
    env = TextCraftEnv()
    tasks = env.tasks("test")[:6]
    requests = []
    for task in tasks:
        obs = env.reset(task.id)
        prompt = actor_prompt(env.describe(), task.goal, task.context, [], obs)
        requests.append(SampleRequest(prompt, 3, SamplingParams(temperature=1.0, max_tokens=160, seed=7,
                                                                grammar=grammar_for(env, task))))
    out = gen.sample(requests)
    finished = 0
    for task, req, comps in zip(tasks, requests, out, strict=True):
        grammar = grammar_for(env, task)
        for c in comps:
            assert grammar.place(c.text) is not None  # every prefix stays inside the grammar
            if c.finish_reason == "stop":
                finished += 1
                assert grammar.accepts(c.text), c.text
                assert not isinstance(parse(c.text), FormatError)
                if c.canonical:
                    (scored,) = gen.logprobs([req.prompt], [c.text])
                    assert scored == pytest.approx(c.logprob, abs=1e-3)
    assert finished >= 6


@pytest.mark.slow
def test_a_constrained_search_stores_no_unreadable_node(tmp_path: Path) -> None:
    from engine.llm.hf import HFGenerator
    from engine.search.runner import new_run
    from engine.store import Store

    gen = HFGenerator(SHIPPED, name="tiny", num_threads=1)
    env = TextCraftEnv()
    cfg = SearchConfig(simulations=3, k=3, depth_limit=3, max_tokens=160, constrained=True, critic=False)
    with Store(tmp_path / "o.db") as store:
        run_id, _ = new_run(store, "textcraft", env.tasks("train")[:3], gen, cfg, "constrained", None, TextCraftEnv)
        assert store.run(run_id).config["constrained"] is True
        nodes = [n for tree_id, _ in store.tree_ids(run_id) for n in store.load_tree(tree_id).nodes[1:]]
    assert len(nodes) >= 9
    for node in nodes:  # only a completion cut by the token limit can be unreadable
        assert node.format_error is None or node.n_tokens >= cfg.max_tokens, (node.format_error, node.raw)


def test_http_servers_refuse_a_grammar_rather_than_ignore_it() -> None:
    from engine.llm.openai_http import OpenAIGenerator

    gen = OpenAIGenerator("http://127.0.0.1:9/v1", "m", retries=0, timeout_s=1)
    req = SampleRequest([{"role": "user", "content": "x"}], 1, SamplingParams(grammar=ActionGrammar()))
    with pytest.raises(GeneratorError, match="constrained decoding needs an hf: or vllm: model"):
        gen.sample([req])


@pytest.mark.slow
def test_a_constrained_evaluation_has_no_format_error_but_at_the_token_limit() -> None:
    from engine.evaluate import EvalConfig, evaluate
    from engine.llm.hf import HFGenerator

    gen = HFGenerator(SHIPPED, name="tiny", num_threads=1)
    tasks = TextCraftEnv().tasks("test")[:6]
    free = evaluate(gen, TextCraftEnv, tasks, EvalConfig(mode="sampled", max_steps=4, max_tokens=24, seeds=(0,)))
    cut = evaluate(gen, TextCraftEnv, tasks, EvalConfig(mode="sampled", max_steps=4, max_tokens=24, seeds=(0,),
                                                        constrained=True))
    big = evaluate(gen, TextCraftEnv, tasks, EvalConfig(mode="sampled", max_steps=4, max_tokens=400, seeds=(0,),
                                                        constrained=True))
    assert sum(e.format_errors for e in free.episodes) > 0  # 24 tokens: too few for a whole action
    assert sum(e.format_errors for e in cut.episodes) > 0  # the grammar cannot make 24 tokens enough
    assert sum(e.format_errors for e in big.episodes) == 0 and sum(e.steps for e in big.episodes) >= 6


def _sentencepiece_tokenizer(kind: str, clean_up: bool):
    """A SentencePiece-style tokenizer (Metaspace: a word's leading space is part of its token, and the
    space of the text's first word is dropped on decode), BPE or Unigram, trained on expert answers;
    " ," and " ." are tokens of their own, which `clean_up_tokenization_spaces` decodes as "," and "."
    (transformers applies it to non-BPE tokenizers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [text for _, text in _expert_answers(10, 0.0)] + ["a , b . c"] * 50
    tok = Tokenizer(models.BPE(unk_token="<unk>") if kind == "bpe" else models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    special = ["<unk>", "</s>"]
    trainer = (trainers.BpeTrainer(vocab_size=400, special_tokens=special) if kind == "bpe"
               else trainers.UnigramTrainer(vocab_size=400, special_tokens=special, unk_token="<unk>"))
    tok.train_from_iterator(texts, trainer)
    if kind == "unigram":  # give " ," and " ." likely tokens of their own
        spec = json.loads(tok.to_str())
        spec["model"]["vocab"] += [["\u2581,", -1.0], ["\u2581.", -1.0]]
        tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=clean_up)


def _decode(tokenizer, ids) -> str:
    """What the HF backend's text of generated ids is (engine/llm/hf.py `_decode`)."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize(("kind", "clean_up"), [("bpe", False), ("unigram", True)])
def test_masks_follow_a_sentencepiece_tokenizers_text(kind: str, clean_up: bool) -> None:
    """The canonical tokens of an answer are allowed, the first word's space-led token included (its
    space is not in the decoded text), and every allowed token keeps the decoded text in the grammar."""
    from engine.llm.hf_constrain import TokenMasker

    tokenizer = _sentencepiece_tokenizer(kind, clean_up)
    eos = tokenizer.eos_token_id
    masker = TokenMasker(tokenizer, len(tokenizer), {eos})
    env = TextCraftEnv()
    for task, text in _expert_answers(3, 0.0):
        grammar = grammar_for(env, task)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert _decode(tokenizer, ids) == text
        # the canonical prefixes, and the texts cut before each ", " (where " ," must not pass as ",")
        prefixes = [ids[:k] for k in range(len(ids))]
        prefixes += [tokenizer(text[:i], add_special_tokens=False)["input_ids"]
                     for i in range(len(text)) if text.startswith(", ", i)]
        for k, prefix in enumerate(prefixes):
            before = _decode(tokenizer, prefix)
            # A token that adds no text (a Unigram "\u2581" before the first word) is never allowed, so
            # tokens without text are no prefix the masks can reach.
            if prefix and not before:
                continue
            mask = masker.mask(grammar, before)
            if k < len(ids) and _decode(tokenizer, ids[:k + 1]) != before:
                assert mask[ids[k]], (text, k, tokenizer.convert_ids_to_tokens(ids[k]))
            for other in mask.nonzero()[:, 0].tolist():
                after = _decode(tokenizer, [*prefix, other])
                placed = grammar.place(after)
                assert placed is not None and grammar.viable(*placed), (after, tokenizer.convert_ids_to_tokens(other))
        assert masker.mask(grammar, text)[eos]


def test_free_text_and_any_command_exclude_what_the_parser_refuses() -> None:
    free = ActionGrammar()
    ok = "THOUGHT: go\nACTION: look\nEXPLANATION: see\nSTATUS: CONTINUE"
    assert free.accepts(ok) and not isinstance(parse(ok), FormatError)
    assert not free.accepts(ok.replace("go", "g\x00o"))  # parse refuses NUL bytes
    assert not free.accepts(ok.replace("look", "\t \t"))  # parse reads a blank command as empty
    assert regex.fullmatch(free.regex, ok) and "\x00" not in free.regex  # an engine gets the escape, not a NUL


# -- the real structured-output engines vLLM uses (xgrammar, llguidance), on CPU ----------------------

def _every_grammar() -> list[ActionGrammar]:
    env = TextCraftEnv()
    return [ActionGrammar()] + [grammar_for(env, task) for split in ("train", "test") for task in env.tasks(split)]


def test_grammar_regexes_hold_escapes_not_control_characters() -> None:
    """A literal newline in a character class is what xgrammar refuses (issue 29, item 6)."""
    for grammar in _every_grammar()[:50]:
        assert not any(ch in grammar.regex for ch in "\n\r\x00"), grammar.regex[:200]


def test_literal_escapes_only_what_is_special() -> None:
    names = ["light gray wool", "jack-o'lantern", "a.b (c) [d]|e*f+g?h{i}^$\\"]
    for name in names:
        assert regex.fullmatch(literal(name), name) and not regex.fullmatch(literal(name), name + "x")
    assert literal("light gray wool") == "light gray wool"  # no "\ " for xgrammar to warn about
    with pytest.raises(ValueError, match="one line"):
        literal("two\nlines")
    assert alternatives(["ok", "bad\nline", "nul\x00"]) == "ok"


def test_xgrammar_compiles_every_grammar_as_vllm_does(capfd, tokenizer) -> None:
    """vLLM's validation (`Grammar.from_regex`) on every grammar, and its compile for a real tokenizer
    (`GrammarCompiler.compile_regex`) on some, with no error and no warning printed."""
    xgr = pytest.importorskip("xgrammar", reason="xgrammar is not installed (pip install xgrammar)")
    grammars = _every_grammar()
    for grammar in grammars:
        xgr.Grammar.from_regex(grammar.regex)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer)),
                                   max_threads=1)
    for grammar in grammars[:3]:
        compiler.compile_regex(grammar.regex)
    printed = capfd.readouterr()
    assert "Warning" not in printed.err + printed.out, (printed.err + printed.out)[:500]
    assert len(grammars) > 500


def test_llguidance_validates_every_grammar_as_vllm_does(tokenizer) -> None:
    llguidance = pytest.importorskip("llguidance", reason="llguidance is not installed (pip install llguidance)")
    ll_hf = pytest.importorskip("llguidance.hf")

    ll_tokenizer = ll_hf.from_tokenizer(tokenizer)
    for grammar in _every_grammar():
        serialized = llguidance.grammar_from("regex", grammar.regex)
        error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(serialized, ll_tokenizer)
        assert not error and not warnings, (error, warnings, grammar.command[:200])


def test_xgrammar_and_llguidance_accept_what_the_grammar_accepts(tokenizer) -> None:
    """The engines' matchers, fed the shipped tokenizer's ids, end in an accepting state exactly on
    the texts `ActionGrammar.accepts` (expert answers, their mutations, hostile model outputs)."""
    xgr = pytest.importorskip("xgrammar", reason="xgrammar is not installed (pip install xgrammar)")
    llguidance = pytest.importorskip("llguidance", reason="llguidance is not installed (pip install llguidance)")
    ll_hf = pytest.importorskip("llguidance.hf")

    env = TextCraftEnv()
    answers = _expert_answers(4)
    task_grammar = grammar_for(env, answers[0][0])
    texts = [text for _, text in answers]
    mutated = [m for text in texts[:12] for m in (text + "\n", text.replace("STATUS: CONTINUE", "STATUS: MAYBE"),
                                                  text.replace("ACTION: ", "ACTION: get 0 "), text[:-3])]
    fuzz = [case.values[0][:2000] for case in model_outputs()]
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer)),
                                   max_threads=1)
    ll_tokenizer = ll_hf.from_tokenizer(tokenizer)
    eos = tokenizer.eos_token_id
    compared = accepted = 0
    for grammar in (task_grammar, ActionGrammar()):
        compiled = compiler.compile_regex(grammar.regex)
        serialized = llguidance.grammar_from("regex", grammar.regex)
        for text in texts + mutated + fuzz:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            xm = xgr.GrammarMatcher(compiled)
            x_ok = all(xm.accept_token(i) for i in ids) and xm.accept_token(eos) and xm.is_terminated()
            lm = llguidance.LLMatcher(ll_tokenizer, serialized, log_level=0)
            l_ok = lm.consume_tokens(ids) and lm.is_accepting()
            want = grammar.accepts(text)
            assert x_ok == want and l_ok == want, (want, x_ok, l_ok, text[:200])
            compared += 1
            accepted += want
    assert compared > 60 and 10 < accepted < compared
