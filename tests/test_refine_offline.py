"""The offline AgentRefine synthesizer (engine/datasets/refine_offline.py, issue 31 item 6): its scripts
and logs pass the pipeline's own checks, the injected mistakes are refused by TextCraft and masked out
of the loss, the next action corrects each, and the same seed gives the same rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.datasets.builds import RefineJob, refine_generator, run_refine
from engine.datasets.refine import (
    RefineConfig,
    check_script,
    continuation_prompt,
    generate,
    load_personas,
    parse_turns,
    sample_personas,
    to_row,
    verify_trajectory,
)
from engine.datasets.refine_offline import OfflineRefineGenerator, make_script, make_trajectory
from engine.envs.textcraft import TextCraftEnv
from engine.llm.base import GeneratorError, SampleRequest, SamplingParams
from engine.progress import MemoryReporter
from engine.store import Store


def _run(n: int = 12, **config) -> list:
    personas = sample_personas(load_personas(), n, config.get("seed", 0))
    result = generate(OfflineRefineGenerator(), personas, RefineConfig(**config))
    assert result.stats.failed == 0 and not result.failures, result.failures
    return result.samples


def test_every_script_and_log_passes_the_verifier_with_the_corrections_asked() -> None:
    for corrections in (1, 2, 3):
        samples = _run(20, min_corrections=corrections, seed=corrections)
        assert len(samples) == 20
        for s in samples:
            v = s.source["verification"]
            assert v["corrections"] >= corrections and v["continuations"] == v["regenerations"] == 0
            assert s.source["model"] == "offline" and s.source["cost"]["completion_tokens"] == 0
            # the pipeline's own checks again, on the stored script and turns
            script = check_script(s.source["script"])
            assert not hasattr(script, "rule"), script
            assert "TextCraft" in s.source["script"]["environment"]["world"]
            assert "not by a language model" in s.source["script"]["environment"]["world"]
            assert s.source["script"]["environment"]["textcraft_task"].startswith("train-")  # never a test task


def test_injected_mistakes_are_refused_by_the_env_masked_and_corrected_by_the_next_action() -> None:
    env = TextCraftEnv()
    for s in _run(10):
        task = s.source["script"]["environment"]["textcraft_task"]
        env.reset(task)
        masked = [i for i, t in enumerate(s.turns) if not t.trains]
        assert len(masked) >= 2
        assert masked == [e["player_turn"] // 2 for e in s.source["verification"]["evaluations"] if e["error"] != "none"]
        for i, turn in enumerate(s.turns):
            command = turn.text.rsplit("Action: ", 1)[1]
            step = env.step(command)
            assert step.info["ok"] is (i not in masked), (task, i, command, step.observation)
            if i in masked:
                assert i + 1 < len(s.turns) and s.turns[i + 1].trains  # the refinement is trained on
                assert "was refused" in s.turns[i + 1].text
        assert step.done  # the log ends with the goal crafted
        row = to_row(s)
        trains = [m["train"] for m in row["messages"] if m["role"] == "assistant"]
        assert trains == [t.trains for t in s.turns]  # the JSONL row carries the same mask


def test_the_same_seed_gives_the_same_rows_and_another_seed_other_ones() -> None:
    first = [to_row(s) for s in _run(6, seed=4)]
    again = [to_row(s) for s in _run(6, seed=4)]
    other = [to_row(s) for s in _run(6, seed=5)]
    assert json.dumps(first) == json.dumps(again)
    assert {r["id"] for r in first} != {r["id"] for r in other}


def test_a_continuation_gets_the_rest_of_the_same_log() -> None:
    """A verified prefix cut short: the synthesizer's answer to the continuation prompt is the same log,
    whose repeated prefix the pipeline strips (so a continuation ends verified)."""
    data = make_script("a baker", seed=7)
    script = check_script(data)
    turns = make_trajectory(data)
    assert verify_trajectory(turns, script).ok
    prefix = verify_trajectory(turns[:5], script).turns
    prompt = continuation_prompt(script, prefix, verify_trajectory(turns[:5], script).violation)
    (answer,), = OfflineRefineGenerator().sample([SampleRequest(prompt, params=SamplingParams(seed=1))])
    again, error = parse_turns(answer.text)
    assert error is None and again == turns


def test_it_answers_only_the_refine_prompts() -> None:
    with pytest.raises(GeneratorError, match="only AgentRefine"):
        OfflineRefineGenerator().sample([SampleRequest([{"role": "user", "content": "Craft 1 stick."}])])


def test_an_offline_build_saves_its_rows_in_the_store_and_a_file(tmp_path: Path) -> None:
    out = tmp_path / "refine.jsonl"
    with Store(tmp_path / "orchard.db") as store:
        result = run_refine(RefineJob(model=" offline ", n=4, out=str(out)), MemoryReporter(), store=store, who="t")
        stored = store.samples(kind="refine")
        assert len(stored) == 4 and result.output == str(out)
        assert {s.id for s in stored} == {json.loads(line)["id"] for line in out.read_text().splitlines()}
        assert "samples: 4 created" in "\n".join(result.lines)
        again = run_refine(RefineJob(model="offline", n=4, out=str(out)), MemoryReporter(), store=store, who="t")
        assert "samples: 4 unchanged" in "\n".join(again.lines)  # deterministic: a rebuild changes nothing


def test_a_model_whose_context_cannot_hold_the_prompts_is_refused_before_loading(tmp_path: Path,
                                                                               monkeypatch) -> None:
    """The shipped tiny model (4096 positions): refused with the prompt's tokens and the positions, in
    one line, and no weights loaded."""
    import engine.llm.registry

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(engine.llm.registry, "load_generator", no_load)
    spec = RefineJob(model="tiny", n=2)
    personas = sample_personas(load_personas(), 2)
    with pytest.raises(GeneratorError, match=r"tokens \+ \d+ new tokens exceeds the model's 4096 positions") as e:
        refine_generator(spec, personas, log=lambda _: None)
    assert "\n" not in str(e.value) and "--model offline" in str(e.value)
    assert isinstance(refine_generator(RefineJob(model="offline"), personas), OfflineRefineGenerator)


def test_the_cli_refuses_a_small_context_in_one_line(tmp_path: Path, capsys) -> None:
    from engine.cli import main

    out = tmp_path / "r.jsonl"
    assert main(["refine", "generate", "--model", "tiny", "--n", "3", "--out", str(out),
                 "--db", str(tmp_path / "o.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exceeds the model's 4096 positions" in err[0] and "Traceback" not in err[0]
    assert not out.exists()
    assert main(["refine", "generate", "--model", "offline", "--n", "3", "--out", str(out),
                 "--db", str(tmp_path / "o.db")]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_the_demo_refine_stage_fills_the_refinement_page(tmp_path: Path) -> None:
    from engine.demo import DEMO, stage_refine

    lines: list[str] = []
    with Store(tmp_path / "orchard.db") as store:
        rows = stage_refine(store, DEMO, lines.append)
        assert rows == DEMO.refine_personas == len(store.samples(kind="refine"))
        (job,) = store.jobs()
        assert job.kind == "refine" and job.state == "succeeded" and job.progress["rows"] == rows
        assert Path(job.output_path).is_file()
    assert any(line.startswith(f"refine: {rows} AgentRefine rows") for line in lines)
