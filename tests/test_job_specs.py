"""Job specs (engine/jobs/kinds.py): a job's JSON is its spec dataclass's fields, read by the one
config loader; JSON queued by older versions loads; what cannot be read is one line naming it."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, SearchConfig, to_dict
from engine.datasets.builds import PairsJob, RefineJob, RevisionsJob
from engine.evaluate import EvalConfig, EvalJob
from engine.jobs.kinds import KINDS, ProbeJob, load_job
from engine.loop import IterateConfig, IterateJob
from engine.search.stage import ResumeSearch, SearchJob
from engine.search.steer import HumanBranch, MoreCandidates, SearchHere
from engine.train.training import DPOJob, RFTJob, SFTJob

# JSON as the job runner of earlier versions stored it (engine/stages.py, engine/submit.py, the CLI).
OLD_JSON = {
    "search": ({"env": "textcraft", "tasks": "0:2", "split": "train", "model": "tiny", "name": None,
                "search": {"simulations": 2, "k": 2}},
               SearchJob(tasks="0:2", search=SearchConfig(simulations=2, k=2))),
    "resume": ({"resume": "r1", "model": "tiny", "ray": "", "allow_http_key": True},
               ResumeSearch(resume="r1", model="tiny", ray="", allow_http_key=True)),
    "pairs": ({"run": "r1", "alpha": None, "theta": 0.0, "trajectory_pairs": 4},
              PairsJob(run="r1", theta=0.0, trajectory_pairs=4)),
    "revisions": ({"run": "r1", "model": "tiny", "alpha_good": 0.3, "beta_gap": 0.2},
                  RevisionsJob(run="r1", model="tiny", alpha_good=0.3, beta_gap=0.2)),
    "refine": ({"model": "tiny", "n": 2, "out": None, "personas": None, "seed": None, "refine": {"max_calls": 3}},
               RefineJob(model="tiny", n=2)),
    "eval": ({"model": "tiny", "env": "textcraft", "split": "test", "tasks": None, "eval": {"max_steps": 2},
              "recovery_runs": []}, EvalJob(model="tiny", eval=EvalConfig(max_steps=2))),
    "dpo": ({"model": "tiny", "output": None, "runs": ["r1"], "train": {"beta": 0.2}}, None),
    "rft": ({"model": "tiny", "train": {}}, None),
    "iterate": ({"iterate": {"method": "exit", "iterations": 1, "search": {"simulations": 1}}},
                IterateJob(IterateConfig(method="exit", iterations=1, search={"simulations": 1}))),
    "probe": ({"steps": 1}, ProbeJob(steps=1)),
    "add_action": ({"run": "r1", "task": "t", "at": 2, "action": "craft stick"},
                   HumanBranch(run="r1", task="t", at=2, action="craft stick")),
    "search_here": ({"run": "r1", "task": "t", "at": 2, "simulations": 4}, SearchHere(run="r1", task="t", at=2,
                                                                                     simulations=4)),
    "more_candidates": ({"run": "r1", "task": "t", "at": 0, "k": 3}, MoreCandidates(run="r1", task="t", at=0, k=3)),
}


@pytest.mark.parametrize("name", sorted(OLD_JSON))
def test_json_queued_by_older_versions_loads_into_its_spec(name: str) -> None:
    data, expected = OLD_JSON[name]
    kind = "search" if name == "resume" else name
    spec = load_job(kind, data)
    if name == "refine":
        assert spec.refine.max_calls == 3 and spec.settings.max_calls == 3
        expected = RefineJob(model="tiny", n=2, refine=spec.refine)
    if name == "dpo":
        assert isinstance(spec, DPOJob) and spec.runs == ("r1",) and spec.train.beta == 0.2
    elif name == "rft":
        assert isinstance(spec, RFTJob) and spec.train.kinds == ("rft",)  # what rft jobs always trained on
    else:
        assert spec == expected


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_spec_written_as_json_loads_back_the_same(kind: str) -> None:
    data = {**OLD_JSON.get(kind, ({"model": "tiny"}, None))[0]}
    spec = load_job(kind, data)
    assert load_job(kind, to_dict(spec)) == spec


def test_what_cannot_be_read_is_one_line_naming_the_kind_and_the_field() -> None:
    cases = [
        ("search", {"resume": "r1", "env": "textcraft"}, "search job: unknown field(s) env"),
        ("search", {"search": {"simulations": "many"}}, "search job: search: field simulations must be an integer"),
        ("sft", {"train": {}}, "sft job: missing field(s) model"),
        ("dpo", {"model": "tiny", "train": {"learning_rat": 1}}, "unknown field(s) learning_rat"),
        ("pairs", {"run": "r1", "theta": -1}, "pairs theta"),
        ("refine", {"model": "tiny", "n": 0}, "refine job: field 'n' must be an integer >= 1"),
        ("eval", {"model": "tiny", "eval": {"mode": "dreamy"}}, "EvalConfig"),
        ("nope", {}, "unknown job kind 'nope'"),
        ("probe", ["not", "a", "table"], "probe job: config must be a JSON object"),
    ]
    for kind, data, words in cases:
        with pytest.raises(ConfigError) as info:
            load_job(kind, data)
        assert words in str(info.value) and "\n" not in str(info.value), (kind, str(info.value))


def test_every_kind_names_its_specs_and_a_resume_is_told_from_a_new_search() -> None:
    assert set(KINDS) == {"dpo", "sft", "rft", "eval", "iterate", "probe", "search", "pairs", "revisions", "refine",
                          "add_action", "search_here", "more_candidates"}
    assert KINDS["search"].specs == (ResumeSearch, SearchJob)
    assert isinstance(load_job("search", {"resume": "r1"}), ResumeSearch)
    assert {k for k, v in KINDS.items() if v.multi_gpu} == {"dpo", "sft", "rft"}
    assert {k for k, v in KINDS.items() if v.stops_at_once} == {"eval", "iterate"}
    assert isinstance(load_job("sft", {"model": "tiny"}), SFTJob)
