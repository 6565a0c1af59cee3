"""A tiny random-init Llama + byte-level BPE tokenizer with a ChatML template, saved to a folder.

WHY: backend tests and the GPU check (bench/gpu/) need a real model folder that servers
(`transformers serve`, vLLM) and the trainers load offline in seconds, on a machine that reaches no
hub. The weights are random: they check plumbing and numerics, never answer quality.
Deliberately independent of engine/llm/tiny.py (the trained tiny model), so backend tests do not
break when that model changes.
"""

from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = (
    "PLAN: 1. get wood 2. craft planks 3. craft sticks\n"
    "THOUGHT: I need planks before sticks.\nACTION: craft 4 oak planks using 1 oak log\n"
    "EXPLANATION: planks are needed for sticks.\nSTATUS: CONTINUE\n"
    "TASK: craft a wooden pickaxe. OBSERVATION: You have 1 oak log. inventory get 2 stick\n"
    "You are an agent that completes tasks in an environment, one command at a time.\n"
    "Which candidate is most promising? BEST: 2 Judgement: Good Bad Uncertain\n"
)


def build_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 384,
    corpus: list[str] | None = None,
    positions: int = 2048,
) -> Path:
    """Write a small Llama (~0.1M parameters at the defaults) and its tokenizer to `out_dir`; `positions`:
    its context length (prompt and answer).
    `corpus`: texts the tokenizer learns its merges from (short token sequences for them)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator([_CORPUS] * 4 + list(corpus or []), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token="<|im_start|>",
        padding_side="left",
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=positions,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    # `transformers serve` samples only when the model's generation config says so (it maps
    # `temperature` but never sets do_sample=True), as instruction-tuned checkpoints usually do.
    model.generation_config.do_sample = True
    model.save_pretrained(out)
    return out
