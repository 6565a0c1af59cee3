"""Which evaluations may be compared, what differs between two that may not, and the paired
difference of a model against a baseline (the Evaluation page and its Loop view).

WHY: two evaluations under different settings (tasks, decoding, step or token limits, seeds) measure
different things; side by side they read as a gain or a loss that is not there (a model evaluated
unconstrained with 15 steps on 109 tasks beside its base constrained with 10 on 8). So every
evaluation has its score-changing settings (`settings`), the page compares within one set of
settings and names each difference (`differences`) when the user puts others beside it, and a
difference against a baseline is paired over the same tasks (engine.evaluate.paired_bootstrap_diff),
never read off two independent intervals.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from engine.evaluate import EvalConfig, by_task, paired_bootstrap_diff

# EvalConfig fields that do not change a score (only its interval), or only in one mode.
NOT_SCORED = ("bootstrap", "confidence")
MCTS_ONLY = tuple(f.name for f in fields(EvalConfig) if f.name.startswith("mcts_"))


def eval_config(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The stored evaluation's EvalConfig as a dict; fields it does not record had their defaults."""
    known = {f.name for f in fields(EvalConfig)}
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in (evaluation.get("config") or {}).items()
              if k in known}
    return {**asdict(EvalConfig()), **stored, "mode": evaluation["mode"]}


def settings(evaluation: dict[str, Any]) -> dict[str, Any]:
    """What an evaluation's scores depend on besides the model: env, split, the task set, and the
    EvalConfig fields that change episodes (temperature only when sampling, mcts_* only in mcts)."""
    cfg = eval_config(evaluation)
    out: dict[str, Any] = {"env": evaluation["env"], "split": evaluation["split"],
                           "tasks": tuple(sorted(evaluation["task_ids"])), "mode": cfg["mode"]}
    for name, value in cfg.items():
        if name in NOT_SCORED or name == "mode" or (name in MCTS_ONLY and cfg["mode"] != "mcts"):
            continue
        if name == "temperature" and cfg["mode"] == "greedy":
            continue
        out[name] = value[:1] if name == "seeds" and cfg["mode"] == "greedy" else value
    return out


def group_key(evaluation: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Evaluations with equal keys are comparable."""
    return tuple(sorted(settings(evaluation).items()))


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Each setting in which evaluation `b` differs from `a`, as 'name A vs B' ([] when comparable)."""
    sa, sb = settings(a), settings(b)
    out = []
    for name in dict.fromkeys([*sa, *sb]):
        va, vb = sa.get(name), sb.get(name)
        if va == vb:
            continue
        if name == "tasks":
            na, nb = len(va or ()), len(vb or ())
            out.append(f"tasks {na} vs {nb}" if na != nb else f"tasks: a different set of {na}")
        else:
            out.append(f"{name} {_show(va) if name in sa else '(not used)'} vs {_show(vb) if name in sb else '(not used)'}")
    return out


def per_task(evaluation: dict[str, Any], metric: str) -> dict[str, list[float]]:
    """{task (or recovery start): [one value per episode]} of `metric` (success, progress, loop_rate,
    recovery) from the evaluation's stored episodes (`Store.evaluations(with_episodes=True)`), scored
    by the engine's `by_task`."""
    recovery = metric == "recovery"
    episodes = [e for e in evaluation.get("episodes") or [] if bool(e.get("recovery")) == recovery]
    return by_task(episodes, "success" if recovery else metric, int(eval_config(evaluation)["loop_max_len"]))


def paired(baseline: dict[str, Any], other: dict[str, Any], metric: str) -> dict[str, float] | str:
    """`other` minus `baseline` on `metric`, paired over their tasks, with its bootstrap interval
    (the baseline's bootstrap size and confidence); or why there is none."""
    if set(baseline["task_ids"]) != set(other["task_ids"]):
        return f"no paired difference: different tasks ({len(other['task_ids'])} vs {len(baseline['task_ids'])})"
    a, b = per_task(baseline, metric), per_task(other, metric)
    if not a or not b:
        return "no paired difference: no per-task results stored"
    if a.keys() != b.keys():
        return "no paired difference: the two cover different tasks or recovery starts"
    cfg = eval_config(baseline)
    return paired_bootstrap_diff(a, b, n=int(cfg["bootstrap"]), confidence=float(cfg["confidence"]))


def diff_text(diff: dict[str, float] | str) -> str:
    """'+0.125 [-0.250, +0.500] (8 tasks)', or the reason there is no difference."""
    if isinstance(diff, str):
        return diff
    return f"{diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}] ({diff['n']} tasks)"


def default_baseline(evaluations: list[dict[str, Any]], iterations: list[dict[str, Any]]) -> str | None:
    """The baseline a comparison starts from: the newest loop base (iteration 0's evaluation) among
    `evaluations`, else the oldest of them (the demo's base model is evaluated first)."""
    ids = [e["id"] for e in evaluations]
    bases = [(it.get("eval") or {}).get("eval_id") for it in iterations if it.get("idx") == 0]
    found = [i for i in ids if i in set(bases)]
    return found[-1] if found else ids[0] if ids else None


def form_defaults(baseline: dict[str, Any] | None) -> dict[str, Any]:
    """The launch form's settings: the baseline's (so a new evaluation is comparable with it), else
    engine.evaluate.DEFAULT_EVAL (the demo's)."""
    from engine.evaluate import DEFAULT_EVAL

    return eval_config(baseline) if baseline is not None else asdict(DEFAULT_EVAL)
