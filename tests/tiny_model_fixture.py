"""Test-side name of the random-weights model builder (engine/llm/scratch_model.py)."""

from engine.llm.scratch_model import CHATML_TEMPLATE, SPECIAL_TOKENS, build_tiny_model

__all__ = ["CHATML_TEMPLATE", "SPECIAL_TOKENS", "build_tiny_model"]
