"""Shared helpers for the env adapter tests: a command-pool generator, one small stored MCTS run, and
`orchard serve-env` in a subprocess."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from doubles import action_text

from engine.config import SearchConfig
from engine.envs.base import Env, TaskSpec
from engine.llm.base import Completion, SampleRequest
from engine.search.runner import new_run
from engine.store import Store


class PoolGenerator:
    """Answers actor prompts with a command drawn (per request seed) from `commands`, critic prompts
    with the first candidate: enough to drive real MCTS over a real env without a model."""

    name = "pool"

    def __init__(self, commands: Sequence[str]) -> None:
        self.commands = list(commands)

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        out = []
        for req in requests:
            rng = random.Random(req.params.seed)
            if "CANDIDATES:" in req.prompt[-1]["content"]:
                listed = re.findall(r"^\[(\d+)\]", req.prompt[-1]["content"], re.MULTILINE)
                best = listed[0] if listed else "1"
                out.append([Completion(text=f"REASON: first.\nBEST: {best}", n_tokens=4)] * req.n)
            else:
                out.append([Completion(text=action_text(rng.choice(self.commands)), logprob=-1.0, n_tokens=9)
                            for _ in range(req.n)])
        return out

    def logprobs(self, prompts, completions):
        return [None for _ in completions]


def stored_search(tmp_path, spec: str, make_env: Callable[[], Env], tasks: list[TaskSpec],
                  commands: Sequence[str], simulations: int = 3, k: int = 2, depth: int = 4):
    """Run MCTS with a small budget into a fresh store; returns (stats, loaded trees)."""
    config = SearchConfig(simulations=simulations, k=k, depth_limit=depth, seed=1)
    with Store(tmp_path / "orchard.db") as store:
        run_id, stats = new_run(store, spec, tasks, PoolGenerator(commands), config, "env-test",
                                make_env=make_env)
        trees = [store.load_tree(tree_id) for tree_id, _ in store.tree_ids(run_id)]
        assert store.run(run_id).status == "finished"
    return stats, trees


def check_search(stats, trees, n_tasks: int, simulations: int = 3) -> None:
    assert stats.simulations == n_tasks * simulations
    assert len(trees) == n_tasks
    for tree in trees:
        assert tree is not None, "every tree must be stored"
        assert tree.check_invariants() == []
        assert len(tree.simulations) == simulations
        assert len(tree.nodes) > 1, "the root must have been expanded"
        assert all(n.observation for n in tree.nodes)


def start_serve_env(*args: str) -> tuple[subprocess.Popen, str]:
    """`orchard serve-env ARGS --port 0` in a subprocess; returns it and its URL (…/NAME)."""
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve-env", *args, "--port", "0"],
                            cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = proc.stderr.readline()  # "serving ... on http://127.0.0.1:PORT/NAME"
    match = re.search(r"(http://127\.0\.0\.1:\d+/\S+)", line)
    if not match:
        proc.kill()
        raise AssertionError(f"serve-env did not start: {line}{proc.stderr.read()}")
    return proc, match[1]
