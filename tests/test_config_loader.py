"""The one config loader (engine.config.from_dict) and the CLI flags generated from config fields."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pytest
from doubles import ScriptedGenerator

import engine.config
import engine.evaluate
import engine.llm.registry
from engine.cli import build_parser, main
from engine.config import ConfigError, SearchConfig, from_dict, load_file
from engine.datasets.pairs import PairsConfig
from engine.datasets.refine import RefineConfig
from engine.datasets.revisions import RevisionConfig
from engine.evaluate import EvalConfig
from engine.loop import IterateConfig
from engine.store import Store
from engine.train.dpo import DPOTrainConfig
from engine.train.sft import SFTTrainConfig


@dataclass(frozen=True)
class Inner:
    depth: int = 1


@dataclass(frozen=True)
class Sample:
    n: int = 1
    rate: float = 0.5
    on: bool = False
    name: str = "x"
    limit: int | None = None
    seeds: tuple[int, ...] = (0,)
    pair: tuple[str, float] = ("a", 1.0)
    mode: Literal["fast", "slow"] = "fast"
    inner: Inner = field(default_factory=Inner)
    extra: dict[str, Any] = field(default_factory=dict)


def test_values_are_checked_and_converted_by_their_annotation() -> None:
    got = from_dict(Sample, {"n": 3.0, "rate": 2, "on": True, "limit": None, "seeds": [1, 2], "pair": ["b", 3],
                             "mode": "slow", "inner": {"depth": 4}, "extra": {"k": [1]}})
    assert got == Sample(n=3, rate=2.0, on=True, limit=None, seeds=(1, 2), pair=("b", 3.0), mode="slow",
                         inner=Inner(4), extra={"k": [1]})
    assert isinstance(got.n, int) and isinstance(got.rate, float)
    assert from_dict(Sample, {"limit": 5}).limit == 5


@pytest.mark.parametrize(("data", "needles"), [
    ({"n": "3"}, ("field n", "an integer", "'3'")),
    ({"n": 2.5}, ("field n", "an integer")),
    ({"n": True}, ("field n",)),
    ({"rate": "fast"}, ("field rate", "a number")),
    ({"on": 1}, ("field on", "true/false")),
    ({"name": 3}, ("field name", "a string")),
    ({"limit": "none"}, ("field limit", "an integer or null")),
    ({"seeds": 3}, ("field seeds", "a list of an integer")),
    ({"seeds": [1, "b"]}, ("field seeds",)),
    ({"pair": ["a"]}, ("field pair",)),
    ({"mode": "medium"}, ("field mode", "one of 'fast', 'slow'")),
    ({"inner": {"depth": "deep"}}, ("inner", "field depth")),
    ({"inner": {"width": 1}}, ("inner", "unknown field(s) width for Inner")),
    ({"extra": [1]}, ("field extra", "a table")),
    ({"bogus": 1, "also": 2}, ("unknown field(s) also, bogus for Sample",)),
])
def test_a_bad_value_is_one_line_naming_where_and_the_field(data: dict[str, Any], needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(Sample, data, where="my.toml")
    message = str(e.value)
    assert message.startswith("my.toml: ") and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_not_a_table_is_an_error() -> None:
    with pytest.raises(ConfigError, match="my.json: expected a table of Sample settings, got list"):
        from_dict(Sample, [1], where="my.json")


CONFIGS = [SearchConfig, EvalConfig, DPOTrainConfig, SFTTrainConfig, IterateConfig, RefineConfig, PairsConfig,
           RevisionConfig]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_round_trips_through_json(cls: type) -> None:
    default = cls()
    assert from_dict(cls, json.loads(json.dumps(asdict(default)))) == default


def test_every_config_class_loader_checks_types() -> None:
    """The four loaders the project had (config.from_dict, TrainConfig/IterateConfig/EvalConfig
    .from_dict) are one: each now refuses a wrong type instead of passing it to the class."""
    with pytest.raises(ConfigError, match=r"eval config: field max_steps must be an integer, got '15'"):
        EvalConfig.from_dict({"max_steps": "15"})
    with pytest.raises(ConfigError, match=r"field seeds must be a list of an integer"):
        EvalConfig.from_dict({"seeds": "0,1"})
    with pytest.raises(ConfigError, match=r"job: field num_threads must be an integer or null"):
        DPOTrainConfig.from_dict({"num_threads": "2"}, where="dpo job")
    with pytest.raises(ConfigError, match=r"field kinds must be a list of a string"):
        SFTTrainConfig.from_dict({"kinds": "good"})
    with pytest.raises(ConfigError, match=r"iterate config: field revision_shares must be a list of a number"):
        IterateConfig.from_dict({"revision_shares": 0.5})
    with pytest.raises(ConfigError, match=r"iterate config: field search must be a table"):
        IterateConfig.from_dict({"search": [1]})
    assert SFTTrainConfig.from_dict({"kinds": ["good"], "max_length": None}).kinds == ("good",)


def test_a_config_file_error_names_the_file_and_the_field(tmp_path) -> None:
    path = tmp_path / "search.toml"
    path.write_text('[search]\nsimulations = "many"\n')
    with pytest.raises(ConfigError) as e:
        load_file(SearchConfig, path)
    assert str(e.value) == f"{path}: field simulations must be an integer, got 'many'"


def _help(*argv: str) -> str:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in argv:
        parser = sub[name]
        sub = getattr(parser, "_subparsers", None) and parser._subparsers._group_actions[0].choices
    return " ".join(parser.format_help().split())


def test_flag_help_shows_the_dataclass_default() -> None:
    assert "--max-steps MAX_STEPS model steps per episode at most (default 15)" in _help("eval")
    assert "--simulations SIMULATIONS simulations per task, T (default 16)" in _help("search")
    assert "--lr LEARNING_RATE learning rate (default 1e-06)" in _help("train", "dpo")
    assert "--lr LEARNING_RATE learning rate (default 2e-05)" in _help("train", "sft")
    assert "--theta THETA minimum Q gap, strict (default 0.1)" in _help("pairs", "build")


def test_changing_a_dataclass_default_changes_the_cli_default(tmp_path, monkeypatch) -> None:
    """No default is repeated in argparse: the CLI follows the dataclass (before, `--max-steps`
    had default=15 of its own beside EvalConfig.max_steps)."""

    @dataclass(frozen=True)
    class ShortEval(EvalConfig):
        max_steps: int = field(default=7, metadata={"help": "model steps per episode at most"})

    @dataclass(frozen=True)
    class FewSims(SearchConfig):
        simulations: int = field(default=3, metadata={"help": "simulations per task, T"})

    monkeypatch.setattr(engine.evaluate, "EvalConfig", ShortEval)
    monkeypatch.setattr(engine.config, "SearchConfig", FewSims)
    monkeypatch.setattr(engine.llm.registry, "load_generator", lambda spec, log=print, **_kw: ScriptedGenerator())
    assert "(default 7)" in _help("eval") and "(default 3)" in _help("search")
    db = tmp_path / "o.db"
    assert main(["eval", "--model", "scripted", "--tasks", "0:1", "--db", str(db)]) == 0
    assert main(["search", "--tasks", "0:1", "--k", "1", "--no-critic", "--db", str(db)]) == 0
    with Store(db) as store:
        assert [e["config"]["max_steps"] for e in store.evaluations()] == [7]
        assert [r.config["simulations"] for r in store.runs()] == [3]
    assert main(["eval", "--model", "scripted", "--tasks", "0:1", "--max-steps", "2", "--db", str(db)]) == 0
    with Store(db) as store:
        assert [e["config"]["max_steps"] for e in store.evaluations()] == [7, 2]
