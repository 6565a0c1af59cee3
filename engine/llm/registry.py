"""Model specs -> Generators: `tiny | PATH | hf:PATH | openai:URL[,URL...]#MODEL[?opts] | vllm:PATH`.

Backends are imported only when chosen, so the CLI starts fast and vLLM stays optional.
A Generator's `name` is a spec that loads it again (runs store it; resume uses it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.llm.base import Generator, GeneratorError

SPEC_HELP = "tiny | PATH | hf:PATH | openai:URL[,URL...]#MODEL[?concurrency=N] | vllm:PATH"


@dataclass(frozen=True)
class ModelSpec:
    """A model spec as read once: `kind` (tiny | openai | vllm | hf), `text` (the spec, normalised)
    and `target` (the server part after `openai:`, or the folder)."""

    kind: str
    text: str
    target: str


def parse_model_spec(spec: str) -> ModelSpec:
    """The one reading of a spec. WHY one: whatever decides whether $OPENAI_API_KEY may go to a spec's
    server (a resume asks first for a spec read from the database) must see the spec exactly as the
    loader does; a check on the raw text and a loader on the stripped one let `' openai:http://...'`
    past the check (docs/decisions.md)."""
    text = spec.strip()
    if text == "tiny":
        return ModelSpec("tiny", text, "")
    for kind in ("openai", "vllm", "hf"):
        if text.startswith(f"{kind}:"):
            return ModelSpec(kind, text, text[len(kind) + 1 :])
    return ModelSpec("hf", text, text)


def load_generator(spec: str, log=print, allow_http_key: bool | None = None) -> Generator:
    """`allow_http_key`: let an `openai:http://...` backend send $OPENAI_API_KEY to a host that is not
    loopback (default: only when ORCHARD_ALLOW_HTTP_KEY=1)."""
    parsed = parse_model_spec(spec)
    spec = parsed.text
    if allow_http_key is None:
        allow_http_key = os.environ.get("ORCHARD_ALLOW_HTTP_KEY") == "1"
    if parsed.kind == "tiny":
        from engine.llm.tiny_checkpoint import tiny_generator

        return tiny_generator(log=log)
    if parsed.kind == "openai":
        from engine.llm.openai_http import OpenAIGenerator, parse_spec

        try:
            if len(parse_spec(spec)[0]) > 1:  # several servers of one model
                from engine.llm.routing import RoutedGenerator

                return RoutedGenerator.from_spec(spec, allow_http_key=allow_http_key)
            return OpenAIGenerator.from_spec(spec, allow_http_key=allow_http_key)
        except ValueError as e:  # a malformed spec or URL: the user's to fix, said in one line
            raise GeneratorError(f"model {spec!r}: {e}") from None
    if parsed.kind == "vllm":
        from engine.llm.vllm_backend import VLLMGenerator

        path = _model_dir(parsed.target)
        return VLLMGenerator(path, name=f"vllm:{path}")
    path = _model_dir(parsed.target)
    from engine.llm.hf import HFGenerator

    return HFGenerator(path, name=f"hf:{path}")


def local_model_dir(spec: str, log=print) -> Path | None:
    """The local folder a spec loads (`tiny`: the shipped checkpoint), or None for a server or a
    spec that names no model folder (loading it says why). Nothing is loaded."""
    parsed = parse_model_spec(spec)
    if parsed.kind == "tiny":
        from engine.llm.tiny_checkpoint import tiny_model_dir

        return tiny_model_dir(log=log)
    if parsed.kind == "openai":
        return None
    path = Path(parsed.target).expanduser()
    return path.resolve() if (path / "config.json").is_file() else None


def _model_dir(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_dir():
        raise GeneratorError(f"model {text!r}: no such folder (expected {SPEC_HELP})")
    if not (path / "config.json").exists():
        raise GeneratorError(f"model folder {path} has no config.json (not a transformers model folder)")
    return path.resolve()


MODEL_TIMEOUT_S = 2.0  # a model server must answer within this long for a job naming it to be queued


def check_model(spec: str, timeout: float = MODEL_TIMEOUT_S) -> None:
    """GeneratorError unless `spec` names a model that can be loaded: `tiny`, a model folder, or an
    `openai:URL#MODEL` server that answers (any HTTP status) within `timeout` seconds. Nothing is loaded."""
    parsed = parse_model_spec(spec)
    spec = parsed.text
    if parsed.kind == "tiny":
        return
    if parsed.kind == "openai":
        import urllib.error
        import urllib.parse
        import urllib.request

        url, sep, model = parsed.target.partition("#")
        parts = urllib.parse.urlsplit(url)
        if not sep or not model or parts.scheme not in ("http", "https") or not parts.hostname:
            raise GeneratorError(f"model {spec!r}: expected openai:http(s)://HOST[:PORT]/PATH#MODEL")
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout):
                pass
        except urllib.error.HTTPError:
            return  # it answered (an auth error or a 404 is still a server)
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise GeneratorError(f"model {spec!r}: the server at {url} did not answer within {timeout:g}s "
                                 f"({reason})") from None
        return
    _model_dir(parsed.target)
