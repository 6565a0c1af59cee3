"""Model specs -> Generators: `tiny | PATH | hf:PATH | openai:URL[,URL...]#MODEL[?opts] | vllm:PATH`.

Backends are imported only when chosen, so the CLI starts fast and vLLM stays optional.
A Generator's `name` is a spec that loads it again (runs store it; resume uses it).
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.llm.base import Generator, GeneratorError

SPEC_HELP = "tiny | PATH | hf:PATH | openai:URL[,URL...]#MODEL[?concurrency=N] | vllm:PATH"


def load_generator(spec: str, log=print, allow_http_key: bool | None = None) -> Generator:
    """`allow_http_key`: let an `openai:http://...` backend send $OPENAI_API_KEY to a host that is not
    loopback (default: only when ORCHARD_ALLOW_HTTP_KEY=1)."""
    spec = spec.strip()
    if allow_http_key is None:
        allow_http_key = os.environ.get("ORCHARD_ALLOW_HTTP_KEY") == "1"
    if spec == "tiny":
        from engine.llm.tiny_checkpoint import tiny_generator

        return tiny_generator(log=log)
    if spec.startswith("openai:"):
        from engine.llm.openai_http import OpenAIGenerator, parse_spec

        try:
            if len(parse_spec(spec)[0]) > 1:  # several servers of one model
                from engine.llm.routing import RoutedGenerator

                return RoutedGenerator.from_spec(spec, allow_http_key=allow_http_key)
            return OpenAIGenerator.from_spec(spec, allow_http_key=allow_http_key)
        except ValueError as e:  # a malformed spec or URL: the user's to fix, said in one line
            raise GeneratorError(f"model {spec!r}: {e}") from None
    if spec.startswith("vllm:"):
        from engine.llm.vllm_backend import VLLMGenerator

        path = _model_dir(spec[len("vllm:") :])
        return VLLMGenerator(path, name=f"vllm:{path}")
    path = _model_dir(spec.removeprefix("hf:"))
    from engine.llm.hf import HFGenerator

    return HFGenerator(path, name=f"hf:{path}")


def _model_dir(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_dir():
        raise GeneratorError(f"model {text!r}: no such folder (expected {SPEC_HELP})")
    if not (path / "config.json").exists():
        raise GeneratorError(f"model folder {path} has no config.json (not a transformers model folder)")
    return path.resolve()
