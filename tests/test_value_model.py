"""The value model learned from backed-up returns (engine/train/value_model.py) and the value critic in
MCTS (SearchConfig.value_model): targets on a hand-worked tree, training toward them, the critic hook
ranking an expansion by the model's predictions, and the config's one-line errors."""

from __future__ import annotations

import pytest
from doubles import LineEnv, ScriptedGenerator
from test_distill import DESC, ref, solved_tree
from tiny_model_fixture import build_tiny_model

from engine.config import ConfigError, SearchConfig, from_dict
from engine.datasets.prm import PRMConfig
from engine.prompts import actor_prompt
from engine.search.mcts import MCTS, start_tree
from engine.search.value_critic import KIND, ValueCritic, load_value_model
from engine.train.value_model import ValueTrainConfig, train_value_model, value_examples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("policy"), seed=3, hidden=32, layers=1)


def random_value_model(base, out, seed: int = 0):
    """A value-model folder with a random (non-zero) head: predictions differ per candidate."""
    import torch

    from engine.train.common import save_model

    torch.manual_seed(seed)
    model, tokenizer = load_value_model(base, base=True)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    return save_model(model, tokenizer, out, {"kind": KIND, "config": {"max_length": 512}})


def test_targets_are_each_visited_steps_backed_up_value_once() -> None:
    tree, (a, b, c, d) = solved_tree()  # Q~: a 4/6 (N 6), b 3/4 (4), c 2/2 (2), d 1/3 (3), wait 0/1 (1)
    examples = value_examples([ref(tree)])
    by_node = {e.node: e for e in examples}
    assert sorted(by_node) == sorted([a, b, c, d, 5])  # a and b lie on one path only once each
    assert [by_node[n].target for n in (a, b, c, d, 5)] == pytest.approx([4 / 6, 3 / 4, 1.0, 1 / 3, 0.0])
    assert [by_node[n].visits for n in (a, b, c, d, 5)] == [6, 4, 2, 3, 1]
    # b's input is what the policy saw when it proposed b: the actor prompt after a, then b's step
    assert by_node[b].prompt == actor_prompt(DESC, tree.task.goal, tree.task.context, tree.history(tree.nodes[a]),
                                             tree.nodes[a].observation)
    assert by_node[b].step == f"{tree.nodes[b].raw}\nOBSERVATION: {tree.nodes[b].observation}"
    # min_visits leaves out paths through rarely visited steps (prm_rows' rule): only d's path stays
    assert [e.node for e in value_examples([ref(tree)], PRMConfig(min_visits=3))] == [d]


def test_training_fits_the_returns_and_saves_a_value_model(policy_dir, tmp_path) -> None:
    tree, (a, _, c, d) = solved_tree()
    examples = value_examples([ref(tree)])
    meta = train_value_model(policy_dir, examples, tmp_path / "vm",
                             ValueTrainConfig(epochs=80, learning_rate=3e-3, batch_size=8, num_threads=1))  # 40 epochs: loss 0.56, d and the leaf not yet apart (transformers 5.25); 80: 0.51
    assert meta["kind"] == KIND and meta["examples"] == 5 and meta["visits"] == 16
    assert meta["history"][-1]["loss"] < meta["history"][0]["loss"]
    critic = ValueCritic(tmp_path / "vm", num_threads=1)
    # the solved step c (Q~ 1) now scores above its sibling-free rivals, the failure leaf (Q~ 0) lowest
    scores = {e.node: critic.score(e.prompt, [e.step])[0] for e in examples}
    assert scores[c] > scores[d] > scores[5]
    assert scores[a] > scores[5]


def test_the_value_critic_ranks_an_expansion_by_the_models_predictions(policy_dir, tmp_path) -> None:
    folder = random_value_model(policy_dir, tmp_path / "vm")
    cfg = SearchConfig(simulations=3, k=4, depth_limit=3, max_tokens=64, value_model=str(folder), seed=1)
    env = LineEnv()
    seen: list[str] = []

    class Recording(ScriptedGenerator):
        def sample(self, requests):
            seen.extend(r.prompt[-1]["content"] for r in requests)
            return super().sample(requests)

    gen = Recording(p_right=0.4, p_garbage=0.2)
    job = start_tree(env.tasks()[2], LineEnv, cfg.simulations)
    stats = MCTS(gen, cfg, rounds=True).run([job])
    tree = job.tree
    assert not any("CANDIDATES:" in p for p in seen)  # the policy is never asked to rank
    assert stats.simulations == 3 and not tree.check_invariants()
    critic = ValueCritic(folder, num_threads=1)
    expanded = [n for n in tree.nodes if n.children]
    assert expanded
    for parent in expanded:
        kids = [tree.nodes[c] for c in parent.children]
        readable = [k for k in kids if not k.format_error]
        expected = critic.score_nodes(tree, [k.id for k in readable], env.describe())
        assert [k.Q_critic for k in readable] == pytest.approx(expected, abs=1e-5)
        by_rank = sorted(readable, key=lambda k: k.critic_rank)
        assert [k.Q_critic for k in by_rank] == sorted(expected, reverse=True)
        for k in kids:
            if k.format_error:  # tied last, and valued as what it backs up
                assert (k.critic_rank, k.Q_critic) == (len(kids) - 1, 0.0)
    # the first simulation followed the model's favourite of the root's candidates
    root_kids = [tree.nodes[c] for c in tree.root.children]
    assert tree.simulations[0].path[0] == max(root_kids, key=lambda k: k.Q_critic or -1.0).id


def test_config_errors_name_the_field(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^SearchConfig\.value_model: set, but critic is off"):
        SearchConfig(value_model="vm", critic=False)
    with pytest.raises(ConfigError, match="field value_model must be a string"):
        from_dict(SearchConfig, {"value_model": 3}, where="run.toml")
    with pytest.raises(ConfigError, match=r"SearchConfig\.value_model: leading or trailing"):
        SearchConfig(value_model=" vm")
    with pytest.raises(ConfigError, match=r"ValueTrainConfig\.epochs"):
        ValueTrainConfig(epochs=0)
    # a folder that is no value model: one line when the search first needs it
    cfg = SearchConfig(simulations=1, k=2, depth_limit=2, value_model=str(tmp_path / "nothing"))
    job = start_tree(LineEnv().tasks()[0], LineEnv, 1)
    with pytest.raises(ConfigError, match=r"^SearchConfig\.value_model: .*nothing is not a value-model folder"):
        MCTS(ScriptedGenerator(), cfg, rounds=True).run([job])
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "orchard_train.json").write_text('{"kind": "sft"}')
    with pytest.raises(ConfigError, match="not a value-model folder"):
        ValueCritic(tmp_path / "policy")


def test_mcts_at_inference_can_take_the_value_critic(policy_dir, tmp_path) -> None:
    """EvalConfig.mcts_value_model reaches the search: the policy is never asked to rank, and an
    evaluation with the critic off and a value model set is refused naming the field."""
    from engine.evaluate import EvalConfig, evaluate

    folder = random_value_model(policy_dir, tmp_path / "vm")
    seen: list[str] = []

    class Recording(ScriptedGenerator):
        def sample(self, requests):
            seen.extend(r.prompt[-1]["content"] for r in requests)
            return super().sample(requests)

    config = EvalConfig(mode="mcts", mcts_simulations=2, mcts_k=3, max_steps=3, max_tokens=64,
                        mcts_value_model=str(folder))
    episodes = evaluate(Recording(p_right=0.5, p_garbage=0.1), LineEnv, LineEnv().tasks()[:2], config).episodes
    assert len(episodes) == 2 and seen and not any("CANDIDATES:" in p for p in seen)
    critic, tree = ValueCritic(folder, num_threads=1), episodes[0].tree
    parent = next(n for n in tree.nodes if n.children)
    readable = [c for c in parent.children if not tree.nodes[c].format_error]
    assert readable and [tree.nodes[c].Q_critic for c in readable] == pytest.approx(
        critic.score_nodes(tree, readable, LineEnv().describe()), abs=1e-5)  # Q^ is the model's prediction
    with pytest.raises(ConfigError, match=r"SearchConfig\.value_model: set, but critic is off"):
        evaluate(Recording(), LineEnv, LineEnv().tasks()[:1],
                 EvalConfig(mode="mcts", mcts_critic=False, mcts_value_model=str(folder), max_steps=2))


def test_the_cli_trains_a_value_model_from_a_stored_search_and_the_search_takes_it(policy_dir, tmp_path,
                                                                                     monkeypatch, capsys) -> None:
    """`orchard train value` reads the store's trees and saves a folder `orchard search --value-model` uses."""
    import json

    import engine.llm.registry
    from engine.cli import main

    db = tmp_path / "o.db"
    monkeypatch.setattr(engine.llm.registry, "load_generator",
                        lambda spec, log=print, **_kw: ScriptedGenerator(p_right=0.5, p_garbage=0.1))
    assert main(["search", "--tasks", "0:2", "--simulations", "4", "--k", "3", "--no-critic", "--name", "s",
                 "--db", str(db)]) == 0
    out = tmp_path / "vm"
    capsys.readouterr()
    assert main(["train", "value", "--model", str(policy_dir), "--run", "s", "--out", str(out), "--epochs", "2",
                 "--threads", "1", "--db", str(db)]) == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "orchard_train.json").read_text())
    assert meta["kind"] == KIND and meta["examples"] > 0 and f"{meta['examples']} visited steps" in printed
    assert main(["search", "--tasks", "0:1", "--simulations", "2", "--k", "3", "--value-model", str(out),
                 "--name", "v", "--db", str(db)]) == 0
    assert main(["train", "value", "--model", str(policy_dir), "--run", "nothing-like-it", "--out",
                 str(tmp_path / "vm2"), "--db", str(db)]) == 2  # an unknown run: one line, nothing saved
    assert not (tmp_path / "vm2").exists()
