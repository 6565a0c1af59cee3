"""Token ids as the generator made them, for every trainer's rows (DPO pairs, SFT steps).

The policy's log-probs in the replay buffer, and what training re-scores, are of exactly these ids:
the chat-templated prompt with the generation header (`HFGenerator.encode_prompt`) and the
completion's text + EOS (`HFGenerator.logprobs`), never the template's glue after the EOS.
"""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, prompt: list[dict[str, str]]) -> list[int]:
    """The prompt's ids exactly as `HFGenerator.encode_prompt` makes them."""
    text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_completion(tokenizer: Any, text: str) -> list[int]:
    """The completion's ids exactly as `HFGenerator.logprobs` scores them: text + EOS."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
