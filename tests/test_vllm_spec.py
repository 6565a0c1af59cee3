"""`vllm:PATH?key=value&...`: engine settings in the model spec, read by the one spec parser
(engine.llm.registry.parse_model_spec), checked against vLLM 0.33.0's names, carried to vllm.LLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import vllm_double
from tiny_model_fixture import build_tiny_model

from engine.llm.base import GeneratorError
from engine.llm.registry import (
    VLLM_GENERATOR_OPTIONS,
    VLLM_SPEC_OPTIONS,
    check_model,
    load_generator,
    local_model_dir,
    parse_model_spec,
    vllm_query,
)


def test_options_are_parsed_typed_and_kept_off_the_folder() -> None:
    spec = parse_model_spec(" vllm:/m/x?gpu_memory_utilization=0.5&max_model_len=4096&enforce_eager=1&sleep=0")
    assert (spec.kind, spec.target) == ("vllm", "/m/x")
    assert spec.options == {"gpu_memory_utilization": 0.5, "max_model_len": 4096, "enforce_eager": True, "sleep": False}
    assert parse_model_spec("vllm:/m/x").options == {}
    assert parse_model_spec("vllm:/m?dtype=float32&request_seeds=true").options == {"dtype": "float32",
                                                                                    "request_seeds": True}
    # The name a generator takes reads back to the same options.
    assert parse_model_spec("vllm:/m" + vllm_query(spec.options)).options == spec.options
    assert vllm_query(spec.options) == "?gpu_memory_utilization=0.5&max_model_len=4096&enforce_eager=1&sleep=0"


@pytest.mark.parametrize(("query", "words"), [
    ("gpu_mem=0.5", "unknown option 'gpu_mem'"),
    ("max_model_len", "option max_model_len has no value"),
    ("", "unknown option ''"),
    ("max_model_len=4k", "option max_model_len='4k' is not a whole number"),
    ("max_model_len=0", "option max_model_len='0' is not a whole number >= 1"),
    ("gpu_memory_utilization=1.5", "option gpu_memory_utilization='1.5' is not in (0, 1]"),
    ("gpu_memory_utilization=half", "option gpu_memory_utilization='half' is not a number"),
    ("enforce_eager=maybe", "option enforce_eager='maybe' is not 0 or 1"),
    ("dtype=fp8", "option dtype='fp8' is not one of auto"),
    ("sleep=1&sleep=0", "option sleep is given twice"),
])
def test_a_bad_option_is_one_line_naming_it(query: str, words: str) -> None:
    with pytest.raises(GeneratorError) as info:
        parse_model_spec(f"vllm:/m?{query}")
    message = str(info.value)
    assert words in message and "\n" not in message and message.startswith("model 'vllm:/m?")


def test_engine_options_are_vllm_0_33_engine_arguments() -> None:
    engine = set(VLLM_SPEC_OPTIONS) - set(VLLM_GENERATOR_OPTIONS)
    assert engine and engine <= set(vllm_double.NAMES["EngineArgs"])
    assert "enable_sleep_mode" in vllm_double.NAMES["EngineArgs"]  # what sleep=1 sets


def test_checks_and_folder_lookups_see_the_folder_without_options(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m")
    check_model(f"vllm:{model}?max_model_len=512")
    assert local_model_dir(f"vllm:{model}?enforce_eager=1") == model.resolve()
    with pytest.raises(GeneratorError, match="unknown option 'x'"):
        check_model(f"vllm:{model}?x=1")


class RecordingLLM(vllm_double.LLM):
    instances: list[vllm_double.LLM] = []  # noqa: RUF012 (the double's per-class list)


def test_the_options_reach_vllm_llm_and_the_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_tiny_model(tmp_path / "m")
    vllm_double.install(monkeypatch, RecordingLLM)
    query = "?gpu_memory_utilization=0.5&max_model_len=512&enforce_eager=1&sleep=1&request_seeds=1"
    gen: Any = load_generator(f"vllm:{model}{query}")
    kwargs = RecordingLLM.instances[0].kwargs
    assert (kwargs["gpu_memory_utilization"], kwargs["max_model_len"], kwargs["enforce_eager"]) == (0.5, 512, True)
    assert kwargs["enable_sleep_mode"] is True and "sleep" not in kwargs and "request_seeds" not in kwargs
    assert gen.request_seeds and gen.sleep_mode and gen.name == f"vllm:{model.resolve()}{query}"
    assert gen.reload(build_tiny_model(tmp_path / "n", seed=1)) == "rebuilt"  # this double has no reload_weights
    assert gen.name == f"vllm:{(tmp_path / 'n').resolve()}{query}"  # the options stay with a new folder
    rebuilt = RecordingLLM.instances[1].kwargs
    assert rebuilt["max_model_len"] == 512 and rebuilt["enable_sleep_mode"] is True  # and with a rebuilt engine
    load_generator(f"vllm:{model}")
    assert "enable_sleep_mode" not in RecordingLLM.instances[2].kwargs  # off unless asked for


def test_a_job_keeps_the_options_after_its_folder_is_made_absolute() -> None:
    from engine.jobs.runner import resolve_job_paths

    config = resolve_job_paths("eval", {"model": "vllm:m/../n?max_model_len=512&sleep=1"}, "/somewhere")
    assert config["model"] == "vllm:/somewhere/n?max_model_len=512&sleep=1"
