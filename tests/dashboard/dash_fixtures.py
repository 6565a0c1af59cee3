"""Fixture stores for the dashboard tests: small real searches (scripted generator, line env), and
the datasets the engine builds from them (preference pairs, Agent-R revisions with a scripted judge,
AgentRefine samples from a canned model answer).

A module of its own (not conftest) so tests and the browser test can import it by name."""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from doubles import ScriptedGenerator, SnapshotLineEnv

from engine.config import SearchConfig
from engine.datasets.pairs import PairsConfig, build_pairs
from engine.datasets.refine import EXAMPLE_SCRIPT, EXAMPLE_TRAJECTORY, Persona, Script, check_script, generate
from engine.datasets.revisions import RevisionConfig, build_revisions
from engine.datasets.samples import TreeRef
from engine.envs.base import Step
from engine.llm.base import Completion, SampleRequest
from engine.search.runner import new_run
from engine.store import Store

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboard" / "app.py"
XSS = "<script>alert(1)</script>"
JUDGE_BAD = f"REASON: moving left goes away from the goal. {XSS} **bold**\nJudgement: Bad"
JUDGE_GOOD = "REASON: this moves towards the goal.\nJudgement: Good"


class XssLineEnv(SnapshotLineEnv):
    """The line env, but 'wait' answers with markup that must be shown as text, never run."""

    def step(self, command: str) -> Step:
        step = super().step(command)
        if command.strip().lower() == "wait":
            return Step(f"{XSS} **bold** [link](http://example.com) You wait at {self.pos}.",
                        step.reward, step.done, step.progress)
        return step


class Judge:
    """First-error judge double: 'left' is Bad (with markup in its reason), everything else Good."""

    name = "judge-double"

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        out = []
        for req in requests:
            found = re.search(r"CURRENT ACTION:\n.*?^ACTION: ([^\n]*)", req.prompt[-1]["content"],
                              re.DOTALL | re.MULTILINE)
            command = found.group(1).strip() if found else ""
            out.append([Completion(JUDGE_BAD if command == "left" else JUDGE_GOOD)] * req.n)
        return out

    def logprobs(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[None]:
        return [None] * len(completions)


def refine_trajectories() -> list[list[dict]]:
    """Two verified AgentRefine trajectories: the engine's example, and one with markup in the DM's text."""
    second = copy.deepcopy(EXAMPLE_TRAJECTORY)
    second[0]["observation"] = "You wake up at the counter of a small bakery."
    second[4]["observation"] = f"{XSS} **Nothing** happens."
    return [copy.deepcopy(EXAMPLE_TRAJECTORY), second]


class RefineModel:
    """Plays the Dungeon Master and the player: the i-th prompt of a batch gets trajectory i."""

    name = "refine-double"

    def sample(self, requests: Sequence[SampleRequest]) -> list[list[Completion]]:
        answers = refine_trajectories()
        return [[Completion(json.dumps(answers[i % len(answers)]), n_tokens=50)] * req.n
                for i, req in enumerate(requests)]

    def logprobs(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[None]:
        return [None] * len(completions)


def build_datasets(store: Store, runs: dict[str, str]) -> None:
    """Pairs and revision / good / recovery samples of every run (what `orchard pairs build` and
    `orchard revisions build` write), and two refinement samples (what `orchard refine` writes)."""
    env = XssLineEnv()
    for run_id in runs.values():
        refs = [TreeRef(store.load_tree(tid), run_id, tid, env.describe())
                for tid, _ in store.tree_ids(run_id)]
        built = build_pairs(refs, PairsConfig(alpha=store.run(run_id).config.get("alpha", 0.5)))
        store.save_pairs(run_id, [*built.step, *built.trajectory])
        store.save_samples(built.rft)
        store.save_samples(build_revisions(refs, Judge(), RevisionConfig()).samples)
    script = check_script(EXAMPLE_SCRIPT)
    assert isinstance(script, Script)
    personas = [Persona("baker", "A baker who loves bread."),
                Persona("apprentice", "A new apprentice baker.")]
    result = generate(RefineModel(), personas, scripts=[script, script])
    assert len(result.samples) == 2, result.failures
    store.save_samples(result.samples)


def build_store(path: Path) -> dict[str, str]:
    """Two runs; the second has three tasks with format errors and the XSS observation. Plus the
    datasets of `build_datasets`."""
    with Store(path) as store:
        env = XssLineEnv()
        first, _ = new_run(store, "line", env.tasks()[:1], ScriptedGenerator(), SearchConfig(simulations=3, k=2,
                           depth_limit=3), "small-run", make_env=XssLineEnv)
        second, _ = new_run(store, "line", env.tasks()[2:5], ScriptedGenerator(p_right=0.4, p_garbage=0.15),
                            SearchConfig(simulations=10, k=3, depth_limit=5, alpha=0.3), "fixture-run",
                            make_env=XssLineEnv)
        runs = {"small": first, "main": second}
        build_datasets(store, runs)
    return runs


@functools.cache
def bench_dashboard() -> Any:
    """bench/dashboard.py as a module (its synthetic MCTS-shaped trees, its page scripts), loaded once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_dashboard", ROOT / "bench" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_tree(n_nodes: int, seed: int = 1) -> Any:
    """A synthetic MCTS-shaped tree of about `n_nodes` nodes (bench/dashboard.py's)."""
    return bench_dashboard().synthetic_tree(n_nodes, seed=seed)


def copy_store(source: Path, target: Path) -> Path:
    """A private copy of a fixture database (with its WAL, if any), for tests that write."""
    for suffix in ("", "-wal", "-shm"):
        if (src := source.with_name(source.name + suffix)).exists():
            shutil.copyfile(src, target.with_name(target.name + suffix))
    return target


def grow_tree(path: Path, run_id: str, task_id: str, parent: int, n: int) -> list[int]:
    """What a running search commits: `n` new children of `parent` and one simulation through the
    last of them (values backpropagated), in one transaction. Returns the new node ids."""
    from engine.actions import CompositeAction
    from engine.tree_nodes import Simulation

    with Store(path) as store:
        tree_id = store.tree_id(run_id, task_id)
        tree = store.load_tree(tree_id)
        first_new = len(tree.nodes)
        for i in range(n):
            tree.add_child(tree.nodes[parent], observation=f"live observation {first_new + i}",
                           action=CompositeAction(thought="t", command=f"live {first_new + i}"), critic_rank=i)
        leaf = tree.nodes[-1]
        path_ids = tuple(p.id for p in tree.path(leaf))
        tree.backpropagate(list(path_ids), 0.5)
        sim = Simulation(path_ids, 0.5)
        tree.simulations.append(sim)
        store.save_simulation(tree_id, tree, sim, first_new)
        return list(range(first_new, len(tree.nodes)))


def tree_chart(at: Any) -> Any:
    """The Tree explorer's tree chart element on an AppTest page (the one with the "nodes" layer; the run
    overview is a Vega-Lite chart too, and so are the two trees of a comparison)."""
    charts = [c for c in at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart")
              if any(layer.get("name") == "nodes" for layer in json.loads(c.proto.spec).get("layer", []))
              and "description" not in json.loads(c.proto.spec)]  # not a compared tree (dashboard.tree_compare)
    (chart,) = charts
    return chart


def overview_chart(at: Any) -> tuple[dict, Any]:
    """The Tree explorer's run overview on an AppTest page: (spec, rows as a DataFrame)."""
    import pyarrow as pa

    charts = [c for c in at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart")
              if any(layer.get("name") == "tiles" for layer in json.loads(c.proto.spec).get("layer", []))]
    (chart,) = charts
    return json.loads(chart.proto.spec), pa.ipc.open_stream(chart.proto.data.data).read_all().to_pandas()


def tree_chart_of(at: Any) -> tuple[dict, Any, str]:
    """The Tree explorer's Vega-Lite chart on an AppTest page: (spec, rows as a DataFrame, element id)."""
    import pyarrow as pa

    chart = tree_chart(at)
    rows = pa.ipc.open_stream(chart.proto.data.data).read_all().to_pandas()
    return json.loads(chart.proto.spec), rows, chart.proto.id


def chart_datasets(at: Any) -> dict[str, Any]:
    """The Tree explorer chart's named datasets (dashboard.tree_chart SUBSETS and SELECTION), as
    DataFrames; "" is the main rows' Arrow bytes (for comparing them as Streamlit does)."""
    import pyarrow as pa

    chart = tree_chart(at)
    out: dict[str, Any] = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets}
    out[""] = chart.proto.data.data
    return out


def open_app(page: str, **params: str):
    """The app switched to `page`, with `params` as its URL's query, run once (streamlit's AppTest)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(page)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()
