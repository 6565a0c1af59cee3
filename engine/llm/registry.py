"""Model specs -> Generators: `tiny | PATH | hf:PATH | openai:URL[,URL...]#MODEL[?opts] | vllm:PATH[?opts]`.

Backends are imported only when chosen, so the CLI starts fast and vLLM stays optional.
A Generator's `name` is a spec that loads it again (runs store it; resume uses it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.llm.base import Generator, GeneratorError

SPEC_HELP = ("tiny | PATH | hf:PATH | openai:URL[,URL...]#MODEL[?concurrency=N] | "
             "vllm:PATH[?gpu_memory_utilization=F&max_model_len=N&enforce_eager=0|1&sleep=0|1...]")


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("is not 0 or 1")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("is not a whole number >= 1")
    return int(text)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("is not a number") from None
    if not 0 < value <= 1:
        raise ValueError("is not in (0, 1]")
    return value


def _dtype(text: str) -> str:
    if text not in VLLM_DTYPES:
        raise ValueError(f"is not one of {', '.join(VLLM_DTYPES)}")
    return text


VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")
# `vllm:PATH?key=value&...`: each option and how its value is read. All but the generator's own
# (VLLM_GENERATOR_OPTIONS) are vllm.LLM engine arguments, under the names vLLM 0.33.0 gives them
# (tests check them against the pinned version's EngineArgs).
VLLM_SPEC_OPTIONS: dict[str, Callable[[str], Any]] = {
    "gpu_memory_utilization": _fraction,
    "max_model_len": _positive_int,
    "max_num_seqs": _positive_int,
    "enforce_eager": _flag,
    "dtype": _dtype,
    "tensor_parallel_size": _positive_int,
    "sleep": _flag,
    "request_seeds": _flag,
}
# Options VLLMGenerator reads itself -> its keyword argument: `sleep` builds the engine with
# enable_sleep_mode (engine.train.vllm_policy sleeps it while training), `request_seeds` sends
# each request's seed.
VLLM_GENERATOR_OPTIONS = {"sleep": "sleep_mode", "request_seeds": "request_seeds"}


def parse_vllm_options(spec: str, query: str) -> dict[str, Any]:
    """`key=value&...` after a `vllm:PATH?` -> options (see VLLM_SPEC_OPTIONS); a GeneratorError in
    one line names the option that is unknown, repeated or ill-typed."""
    options: dict[str, Any] = {}
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if key not in VLLM_SPEC_OPTIONS:
            raise GeneratorError(f"model {spec!r}: unknown option {key!r} after '?' (known: "
                                 f"{', '.join(VLLM_SPEC_OPTIONS)})")
        if not eq:
            raise GeneratorError(f"model {spec!r}: option {key} has no value (write {key}=VALUE)")
        if key in options:
            raise GeneratorError(f"model {spec!r}: option {key} is given twice")
        try:
            options[key] = VLLM_SPEC_OPTIONS[key](value)
        except ValueError as e:
            raise GeneratorError(f"model {spec!r}: option {key}={value!r} {e}") from None
    return options


def vllm_query(options: dict[str, Any]) -> str:
    """The `?key=value&...` tail that parse_vllm_options reads back ('' when there is none)."""
    def text(value: Any) -> str:
        return str(int(value)) if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)

    return "?" + "&".join(f"{k}={text(v)}" for k, v in options.items()) if options else ""


def vllm_generator_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """Spec options -> VLLMGenerator keyword arguments (engine arguments pass through by name)."""
    return {VLLM_GENERATOR_OPTIONS.get(k, k): v for k, v in options.items()}


@dataclass(frozen=True)
class ModelSpec:
    """A model spec as read once: `kind` (tiny | openai | vllm | hf), `text` (the spec, normalised),
    `target` (the server part after `openai:`, or the folder) and, for `vllm:`, the `options` after
    '?' (parsed, typed; `target` is the folder without them)."""

    kind: str
    text: str
    target: str
    options: dict[str, Any] = field(default_factory=dict)


def parse_model_spec(spec: str) -> ModelSpec:
    """The one reading of a spec. WHY one: whatever decides whether $OPENAI_API_KEY may go to a spec's
    server (a resume asks first for a spec read from the database) must see the spec exactly as the
    loader does; a check on the raw text and a loader on the stripped one let `' openai:http://...'`
    past the check (docs/decisions.md). A `vllm:` spec's options are read here too (a GeneratorError
    names a bad one), so a job with a mistyped option is refused when it is submitted."""
    text = spec.strip()
    if text == "tiny":
        return ModelSpec("tiny", text, "")
    if text.startswith("vllm:"):
        folder, sep, query = text[len("vllm:"):].partition("?")
        return ModelSpec("vllm", text, folder, parse_vllm_options(text, query) if sep else {})
    for kind in ("openai", "hf"):
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
        return VLLMGenerator(path, name=f"vllm:{path}{vllm_query(parsed.options)}",
                             **vllm_generator_kwargs(parsed.options))
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
