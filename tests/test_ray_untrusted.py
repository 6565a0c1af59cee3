"""Ray workers are untrusted peers of the driver: their messages are rebuilt from allowlisted classes
only and checked like local steps before anything is committed, and a cluster beyond loopback
without Ray's token auth is refused unless explicitly allowed. No cluster needed."""

from __future__ import annotations

import os
import pickle
from dataclasses import replace

import pytest

from engine.actions import CompositeAction
from engine.envs.base import TaskSpec
from engine.llm.base import GeneratorError
from engine.search import ray_search
from engine.search.mcts import SearchStats
from engine.search.ray_search import (
    RayUnavailable,
    _Mirror,
    check_auth,
    check_done_message,
    check_sim_message,
    loads_message,
)
from engine.tree_nodes import Node, Simulation


def _message(**changes):
    root = Node(0, None, 0, "You are at 0.", N=1, value_sum=0.5, children=[1])
    child = Node(1, 0, 1, "You are at 1.", action=CompositeAction("t", "right"), reward=0.5, progress=0.5, N=1,
                 value_sum=0.5, gen_ms=3.0, n_tokens=7)
    child = replace(child, **changes) if changes else child
    return (7, 0, [root, child], [(0, 1, 0.5), (1, 1, 0.5)], Simulation((1,), 0.5, ("wait",)), (123, "node-a"))


def _mirrors():
    return {7: _Mirror(7, TaskSpec(id="goal-1", goal="reach 1"))}


def test_a_valid_message_passes_and_applies():
    mirrors = _mirrors()
    tree_id, first, new, values, sim, _ = check_sim_message(loads_message(pickle.dumps(_message())), mirrors)
    mirrors[tree_id].apply(first, new, values, sim)
    assert [n.id for n in mirrors[7].job.tree.nodes] == [0, 1]


@pytest.mark.parametrize(("changes", "problem"), [
    ({"reward": float("nan")}, "node 1: reward nan is not a finite number"),
    ({"progress": 1.5}, "node 1: progress 1.5 is outside [0.0, 1.0]"),
    ({"reward": "1"}, "node 1: reward '1' is not a finite number"),
    ({"value_sum": float("inf")}, "node 1: value_sum inf is not a finite number"),
    ({"Q_critic": -0.1}, "node 1: Q_critic -0.1 is outside"),
    ({"N": True}, "node 1: N True"),
    ({"observation": b"bytes"}, "node 1: observation is a bytes, not text"),
    ({"action": "right"}, "node 1: action is not a composite action"),
    ({"parent": 5}, "node 1: parent 5 is not an earlier node"),
    ({"depth": 3}, "node 1: depth 3, its parent's is 0"),
    ({"id": 9}, "node 1: id 9, expected 1"),
    ({"children": [1]}, "node 1: children [1] are not the nodes naming it"),
    ({"gen_ms": -1.0}, "node 1: gen_ms -1.0 is outside"),
    ({"terminal": "won"}, "node 1: terminal 'won' is not one of success"),
    ({"author": "human"}, "node 1: author 'human', not 'policy'"),  # a worker cannot pass as a person's edit
    ({"author": ["x"]}, "node 1: author"),
])
def test_a_crafted_node_is_refused_in_one_line(changes, problem):
    with pytest.raises(GeneratorError) as e:
        check_sim_message(_message(**changes), _mirrors())
    assert str(e.value).startswith("invalid result from a search shard: tree 7: ") and problem in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("index", "value", "problem"), [
    (0, 8, "tree 8 is not one of this shard's"),
    (0, "7", "tree '7' is not one of this shard's"),
    (1, 1, "new nodes start at 1, the driver holds 0"),
    (3, [(5, 1, 0.5)], "visit count entry (5, 1, 0.5)"),
    (3, [(0, -1, 0.5)], "visit count entry (0, -1, 0.5)"),
    (3, [(0, 1, float("nan"))], "node 0: value_sum nan"),
    (4, Simulation((1,), float("nan")), "simulation reward nan"),
    (4, Simulation((1,), 2.0), "simulation reward 2.0 is outside"),
    (4, Simulation((3,), 0.5), "simulation path (3,) does not run down the tree"),
    (4, Simulation((1,), 0.5, (1,)), "rollout or turns are not text"),
    (4, "sim", "a str, not a Simulation"),
    (5, ("123", "n"), "(process id, node id) is malformed"),
])
def test_a_crafted_message_is_refused(index, value, problem):
    message = list(_message())
    message[index] = value
    with pytest.raises(GeneratorError, match="invalid result from a search shard") as e:
        check_sim_message(tuple(message), _mirrors())
    assert problem in str(e.value)
    with pytest.raises(GeneratorError, match="not a 6-tuple"):
        check_sim_message(tuple(message[:5]), _mirrors())


def test_the_final_stats_are_checked():
    assert check_done_message(("done", SearchStats(gen_s=1.0))).gen_s == 1.0
    with pytest.raises(GeneratorError, match="stats gen_s nan"):
        check_done_message(("done", SearchStats(gen_s=float("nan"))))
    with pytest.raises(GeneratorError, match="not \\(\"done\", SearchStats\\)"):
        check_done_message(("done", {"gen_s": 1}))


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_naming_any_other_class_is_never_rebuilt(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(GeneratorError, match=r"names (posix|os)\.system, which is not allowed"):
        loads_message(pickle.dumps((7, 0, [_Evil(str(marker))])))
    assert not marker.exists()
    with pytest.raises(GeneratorError, match="a str, not bytes"):
        loads_message("text")


# --- joining a cluster ------------------------------------------------------------------------------


@pytest.fixture
def no_auth(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv(ray_search.ALLOW_UNAUTHENTICATED_ENV, raising=False)
    return monkeypatch


@pytest.mark.parametrize("address", ["10.0.0.2:6379", "head-1.cluster.local:10001", "[2001:db8::1]:6379"])
def test_a_remote_cluster_without_token_auth_is_refused_unless_allowed(no_auth, address):
    with pytest.raises(RayUnavailable) as e:
        check_auth(address)
    assert "not on loopback and Ray token auth is off" in str(e.value) and "\n" not in str(e.value)
    check_auth(address, allow=True)
    no_auth.setenv(ray_search.ALLOW_UNAUTHENTICATED_ENV, "1")
    check_auth(address)
    no_auth.delenv(ray_search.ALLOW_UNAUTHENTICATED_ENV)
    no_auth.setenv("RAY_AUTH_MODE", "token")
    check_auth(address)


@pytest.mark.parametrize("address", ["", "auto", "127.0.0.1:6379", "localhost:6379", "[::1]:6379"])
def test_loopback_and_local_addresses_need_no_token(no_auth, address):
    check_auth(address)


def test_the_cli_refuses_a_remote_cluster_without_token_auth_before_anything_is_written(no_auth, tmp_path, capsys):
    from engine import cli

    no_auth.setattr(ray_search, "connect", lambda *a, **k: pytest.fail("the driver tried to join"))
    rc = cli.main(["search", "--db", str(tmp_path / "x.db"), "--tasks", "0:1", "--ray", "10.0.0.2:6379"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("orchard: error: ray address 10.0.0.2:6379: not on loopback") and "\n" not in err
    assert not (tmp_path / "x.db").exists()


def test_an_object_rebuilt_without_a_field_is_refused_in_one_line():
    """pickle restores whatever state it is sent: a Node without `id`, stats without `batch_sizes`."""
    root, child = _message()[2]
    del child.__dict__["id"]
    with pytest.raises(GeneratorError, match="a simulation message holds an incomplete object .*'id'"):
        check_sim_message(loads_message(pickle.dumps((7, 0, [root, child], *_message()[3:]))), _mirrors())
    stats = SearchStats()
    del stats.__dict__["batch_sizes"]
    with pytest.raises(GeneratorError, match="the final message holds an incomplete object .*'batch_sizes'"):
        check_done_message(loads_message(pickle.dumps(("done", stats))))
