"""A model folder is outside input (copied, downloaded by hand, cut short): every loader of one — the trainer's,
the HF generator's, the value model's — refuses a broken one in one line naming the folder and what broke,
never with a library's traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_model_fixture import build_tiny_model

from engine.config import ConfigError
from engine.llm.base import GeneratorError
from engine.llm.hf import HFGenerator
from engine.search.value_critic import load_value_model
from engine.train.common import TrainConfig, TrainError, load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


def _edit_config(folder: Path, **changes: object) -> None:
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **changes}))


BROKEN = {
    "weights cut short": (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:100]),
                          "SafetensorError"),
    "config a list": (lambda d: (d / "config.json").write_text("[]"), "Error"),
    "no attention heads": (lambda d: _edit_config(d, num_attention_heads=0), "ZeroDivisionError"),
    "tokenizer config a list": (lambda d: (d / "tokenizer_config.json").write_text("[]"), "AttributeError"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_model_folder_is_one_line_for_every_loader(tiny: Path, tmp_path: Path, case: str) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(tiny, folder)
    breaks, says = BROKEN[case]
    breaks(folder)
    for error, load in ((TrainError, lambda: load_model(folder, TrainConfig.for_cpu())),
                        (GeneratorError, lambda: HFGenerator(folder, device="cpu")),
                        (ConfigError, lambda: load_value_model(folder, base=True))):
        with pytest.raises(error) as raised:
            load()
        message = str(raised.value)
        assert str(folder) in message and says in message and "\n" not in message, (case, message)


def test_the_value_model_keeps_the_policys_architecture(tiny: Path, tmp_path: Path) -> None:
    """A Qwen2 policy read as a Llama lost its attention biases without a word: the value model's body was
    not the policy. Read with the policy's own class, its hidden states are the policy's."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path / "qwen"
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                          max_position_embeddings=512))
    for module in policy.modules():  # non-zero biases, as a trained Qwen2 has
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.normal_(module.bias, std=0.5)
    policy.save_pretrained(folder)
    value, _ = load_value_model(folder, base=True)
    ids = torch.tensor([tokenizer("THOUGHT: craft a stick")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(policy.model(input_ids=ids).last_hidden_state,
                              value.model(input_ids=ids).last_hidden_state, atol=1e-5)
