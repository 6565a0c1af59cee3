"""Per-step value labels from backed-up returns (engine/datasets/prm.py), on a hand-worked tree, and
`orchard export prm` on a stored TextCraft search."""

from __future__ import annotations

import json

import pytest
from test_distill import DESC, ref, solved_tree

from engine.config import ConfigError
from engine.datasets.prm import PRMConfig, prm_rows


def test_every_leaf_path_is_a_row_labelled_by_its_steps_backed_up_values() -> None:
    tree, (a, b, c, d) = solved_tree()  # Q~: a 4/6, b 3/4, c 2/2, d 1/3, the wait leaf 0/1
    rows = prm_rows([ref(tree)])
    by_path = {tuple(r["path"]): r for r in rows}
    assert set(by_path) == {(a, b, c), (d,), (5,)}  # the leaves: c, d (expanded by rollout only), wait
    solved = by_path[(a, b, c)]
    assert solved["values"] == pytest.approx([4 / 6, 3 / 4, 1.0]) and solved["labels"] == [True, True, True]
    assert solved["visits"] == [6, 4, 2] and solved["terminal"] == "success"
    assert by_path[(d,)]["labels"] == [False] and by_path[(5,)]["labels"] == [False]
    assert solved["prompt"] == "TASK: " + tree.task.goal + "\n" + tree.task.context + "\n\n" + tree.root.observation
    assert DESC in solved["system"]
    assert solved["completions"][0].startswith(tree.nodes[a].raw) and "OBSERVATION: " in solved["completions"][0]
    # A stricter threshold flips the 0.67 step; too few visits leaves the path out.
    strict = {tuple(r["path"]): r for r in prm_rows([ref(tree)], PRMConfig(threshold=0.7))}
    assert strict[(a, b, c)]["labels"] == [False, True, True]
    assert {tuple(r["path"]) for r in prm_rows([ref(tree)], PRMConfig(min_visits=3))} == {(d,)}
    with pytest.raises(ConfigError, match="threshold"):
        PRMConfig(threshold=1.5)


@pytest.mark.slow
def test_export_prm_writes_trl_stepwise_rows(tmp_path, capsys) -> None:
    from engine.cli import main
    from engine.config import SearchConfig
    from engine.envs.textcraft import TextCraftEnv
    from engine.llm.registry import load_generator
    from engine.search.runner import new_run
    from engine.store import Store

    db = tmp_path / "o.db"
    with Store(db) as store:
        run_id, _ = new_run(store, "textcraft", TextCraftEnv().tasks("train")[:1], load_generator("tiny"),
                            SearchConfig(simulations=3, k=2, depth_limit=3, max_tokens=96), "prm-test")
    out = tmp_path / "prm.jsonl"
    assert main(["export", "prm", run_id, "--out", str(out), "--db", str(db)]) == 0
    assert "PRM rows" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(len(r["completions"]) == len(r["labels"]) == len(r["values"]) for r in rows)
    assert all(isinstance(r["prompt"], str) and all(isinstance(x, bool) for x in r["labels"]) for r in rows)
