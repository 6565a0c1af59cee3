"""Shared by the loop benches (inference_search, agentq_iteration, agentr_iteration, baselines): the
options every one takes, the held-out tasks, and the table that compares arms on the SAME tasks
with the same evaluation, with the paired bootstrap interval of each difference
(`engine.evaluate.paired_bootstrap_diff`, docs/algorithms.md §7).

WHY one module: the benches' claims are only comparable if they select tasks, score episodes and
print intervals identically. Model selection never looks at the test split: every bench trains
with fixed settings and reports the model it ends with.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.evaluate import EvalConfig, by_task, evaluate, paired_bootstrap_diff

METRICS = ("success", "progress", "loop_rate")


def add_common_args(ap: argparse.ArgumentParser, test_tasks: int) -> None:
    """--model (a spec or folder: plug in any policy), held-out task count, evaluation limits, seed."""
    ap.add_argument("--model", default="tiny", help="the base policy: 'tiny', a model folder, hf:/vllm:/openai: spec")
    ap.add_argument("--test-tasks", type=int, default=test_tasks,
                    help="the first N held-out (test) tasks every arm is evaluated on (0 = all 109)")
    ap.add_argument("--split", choices=("test", "val"), default="test",
                    help="the held-out tasks: test (the reported figures) or val (43 train tasks held out of the "
                         "tiny model's data and of every search here: choose settings on these, never on test)")
    ap.add_argument("--max-steps", type=int, default=15, help="evaluation: model steps per episode")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of tasks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--constrained", action="store_true",
                    help="decode every actor completion (search and evaluation) under the action grammar")


def add_loop_args(ap: argparse.ArgumentParser, tasks: int = 16, simulations: int = 12) -> None:
    """The search budget (B train tasks x simulations, K, backup) and training settings of a loop bench."""
    ap.add_argument("--tasks", type=int, default=tasks, help="B train tasks searched (per iteration)")
    ap.add_argument("--simulations", type=int, default=simulations, help="MCTS simulations per task")
    ap.add_argument("--k", type=int, default=4, help="candidate actions per expansion")
    ap.add_argument("--temperature", type=float, default=1.0, help="expansion sampling temperature")
    ap.add_argument("--backup", choices=("reward", "progress"), default="reward")
    ap.add_argument("--depth-limit", type=int, default=10,
                    help="search depth limit D (a failing branch ends, as a bad leaf, only at D)")
    ap.add_argument("--lr", type=float, default=5e-5, help="learning rate of the training step")
    ap.add_argument("--epochs", type=float, default=2.0)


def held_out(n: int, split: str = "test") -> list[Any]:
    """The first `n` TextCraft tasks of `split` ("test" or "val"; all for 0); the same list for every arm.
    Searched train tasks come from "fit" (train minus val), so a val run never searches its own tasks."""
    from engine.envs.textcraft import TextCraftEnv

    tasks = TextCraftEnv().tasks(split)
    return tasks[:n] if n else tasks


def fit_pool(unseen_every: int = 0) -> list[Any]:
    """The fit tasks a loop bench may search: all of them, or with `unseen_every` N only those a tiny base built
    with `TinyConfig.val_every = N` held out of its rows (`tiny_data.validation_tasks(N)` minus val). The shipped
    base trained on every fit goal, so its search finds what it was shown; such a base's loop searches goals it has
    never seen, as a user's base would (docs/experiments.md 2026-12-07 (later))."""
    from engine.envs.textcraft import TextCraftEnv
    from engine.llm.tiny_data import validation_tasks

    fit = TextCraftEnv().tasks("fit")
    if unseen_every <= 0:
        return fit
    unseen = {t.id for t in validation_tasks(unseen_every)}
    return [t for t in fit if t.id in unseen]


def undrawn_fit(drawn: list[Any], unseen_every: int = 0) -> list[Any]:
    """The tasks of `fit_pool(unseen_every)` not in `drawn` (the tasks a bench searched): with val's 43, a larger
    selection set than val alone (`--select-fit`), still never the test split and never a task the data came from."""
    ids = {t.id for t in drawn}
    return [t for t in fit_pool(unseen_every) if t.id not in ids]


def print_val_alone(table: Table, pairs: Sequence[tuple[str, str]]) -> None:
    """With `--select-fit`, the paired differences on val's tasks alone: the fit tasks were held out of the
    search, not of the shipped base (its build trained on every fit goal), and gains there need not carry to
    unseen goals (docs/experiments.md 2026-12-07)."""
    table.print_diffs(pairs, only={t.id for t in held_out(0, "val")},
                      label="val alone (the goals the base never trained on)")


def greedy_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The held-out evaluation every arm of a bench shares (an IterateConfig's `eval` table)."""
    return {"mode": "greedy", "max_steps": args.max_steps, "max_tokens": args.max_tokens,
            "bootstrap": args.bootstrap, "constrained": args.constrained}


def greedy_config(args: argparse.Namespace, **overrides: Any) -> EvalConfig:
    return EvalConfig(**{**greedy_settings(args), "seeds": (args.seed,), **overrides})


def loop_search(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The search settings of a loop bench (`add_loop_args`), critic on (an IterateConfig's `search`)."""
    return {"simulations": args.simulations, "k": args.k, "temperature": args.temperature, "depth_limit": args.depth_limit,
            "max_tokens": args.max_tokens, "backup": args.backup, "critic": True,
            "constrained": args.constrained, **extra}


def stored_episodes(store: Any, eval_id: str, recovery: bool = False) -> list[dict[str, Any]]:
    """The episode rows of one stored evaluation (task episodes, or its recovery episodes)."""
    for ev in store.evaluations(with_episodes=True):
        if ev["id"] == eval_id:
            return [e for e in ev["episodes"] if bool(e.get("recovery")) == recovery]
    raise KeyError(f"evaluation {eval_id!r} is not in {store.path}")


def ci(m: dict[str, float], signed: bool = False) -> str:
    f = "+.3f" if signed else ".3f"
    return f"{m['mean']:{f}} [{m['low']:{f}}, {m['high']:{f}}]"


@dataclass
class Arm:
    name: str
    metrics: dict[str, Any]
    episodes: list[Any]
    seconds: float
    note: str = ""


@dataclass
class Table:
    """Arms evaluated on the same tasks, printed with their intervals and paired differences."""

    title: str
    settings: dict[str, Any]
    bootstrap: int = 2000
    confidence: float = 0.95
    seed: int = 0
    constrained: bool = False  # printed: every figure is reported with and without the grammar
    arms: dict[str, Arm] = field(default_factory=dict)
    began: float = field(default_factory=time.perf_counter)
    began_cpu: float = field(default_factory=time.process_time)

    def header(self) -> None:
        print(self.title)
        print("  " + ", ".join(f"{k} {v}" for k, v in self.settings.items()))
        print(f"  decoding {'constrained (engine/grammar.py)' if self.constrained else 'unconstrained'}")
        print(f"  command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}", flush=True)

    def add(self, name: str, metrics: dict[str, Any], episodes: list[Any], seconds: float, note: str = "") -> Arm:
        arm = self.arms[name] = Arm(name, metrics, episodes, seconds, note)
        print(f"  {name:<22} success {ci(metrics['success'])}  progress {ci(metrics['progress'])}  "
              f"loop rate {ci(metrics['loop_rate'])}  fmt err/step {metrics['format_error_rate']:.3f}  "
              f"{seconds:.0f} s{'  ' + note if note else ''}", flush=True)
        return arm

    def annotate(self, name: str, note: str) -> None:
        """A note on an arm already printed (what only its evaluation tells, or its training's cost), printed
        under it: a note set on the arm after `add` would otherwise never be shown."""
        self.arms[name].note = note
        print(f"  {name:<22} {note}", flush=True)

    def evaluate(self, name: str, generator: Any, make_env: Callable[[], Any], tasks: Sequence[Any],
                 config: EvalConfig, note: str = "") -> Arm:
        t = time.perf_counter()
        result = evaluate(generator, make_env, tasks, config)
        return self.add(name, result.metrics, result.episodes, time.perf_counter() - t, note)

    def diff(self, before: str, after: str, metric: str, only: Collection[str] | None = None) -> dict[str, float]:
        a, b = self.arms[before].episodes, self.arms[after].episodes
        if only is not None:  # a subset of the tasks, by id
            a, b = ([e for e in eps if e.task_id in only] for eps in (a, b))
        return paired_bootstrap_diff(by_task(a, metric), by_task(b, metric), self.bootstrap, self.confidence,
                                     self.seed)

    def print_diffs(self, pairs: Sequence[tuple[str, str]], only: Collection[str] | None = None,
                    label: str = "") -> dict[tuple[str, str], dict[str, Any]]:
        """`after - before` per metric, paired over tasks (`only`: those of these ids, named by `label`);
        '*' marks an interval that excludes 0."""
        out = {}
        print(f"paired differences{' on ' + label if label else ''} (after - before, {self.confidence:.0%} bootstrap "
              f"over the same tasks, {self.bootstrap} resamples):")
        for before, after in pairs:
            d = out[(before, after)] = {m: self.diff(before, after, m, only) for m in METRICS}
            cells = "  ".join(f"{m} {ci(d[m], signed=True)}{'*' if excludes_zero(d[m]) else ' '}" for m in METRICS)
            print(f"  {after} - {before}: {cells}", flush=True)
        return out

    def footer(self) -> None:
        print(f"wall time {time.perf_counter() - self.began:.0f} s (cpu {time.process_time() - self.began_cpu:.0f} s in "
              "this process: the compute, whatever else shares the cores)", flush=True)


def excludes_zero(m: dict[str, float]) -> bool:
    return m["low"] > 0 or m["high"] < 0


def ordering(table: Table, names: Sequence[str], metric: str = "success") -> str:
    """Arms by mean `metric`, best first (ties by progress), as 'a > b = c'."""
    ranked = sorted(names, key=lambda n: (-table.arms[n].metrics[metric]["mean"],
                                          -table.arms[n].metrics["progress"]["mean"]))
    text = ranked[0]
    for prev, cur in itertools.pairwise(ranked):
        same = all(table.arms[prev].metrics[k]["mean"] == table.arms[cur].metrics[k]["mean"]
                   for k in (metric, "progress"))
        text += f" {'=' if same else '>'} {cur}"
    return text
