"""`orchard eval` (a model on held-out tasks) and `orchard iterate` (search -> data -> train -> evaluate).

Both run in this process by default (`--job` queues them instead). Wired into engine.cli by
`add_parsers(sub, common)`; only argparse is imported at start-up.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from engine.cli.common import PrintReporter
from engine.cli.common import log as _log
from engine.cli.common import split_list as _list
from engine.cli.flags import add_flags, default_help, given
from engine.config import ConfigError, read_table

EVAL_FLAGS = {"mode": "--mode", "temperature": "--temperature", "mcts_simulations": "--simulations",
              "mcts_backup": "--backup", "max_steps": "--max-steps", "max_tokens": "--max-tokens",
              "format_errors": "--format-errors", "constrained": "--constrained", "mcts_value_model": "--value-model"}

ITERATE_FLAGS = {"method": "--method", "model": "--model", "env": "--env", "iterations": "--iterations",
                 "tasks_per_iteration": "--tasks-per-iteration", "eval_tasks": "--eval-tasks", "seed": "--seed",
                 "name": "--name", "include_pending": "--include-pending", "gate_split": "--gate-split",
                 "gate_confidence": "--gate-confidence", "accumulate": "--accumulate", "theta": "--theta",
                 "min_visits": "--min-visits", "corrections": "--corrections", "renamed": "--renamed"}


def _int(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not an integer") from None


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.evaluate import eval_tasks, run_eval
    from engine.jobs.kinds import validate_job
    from engine.jobs.runner import JobRunner
    from engine.store import Store

    ev: dict[str, Any] = given(args, EVAL_FLAGS)
    if args.seeds:
        ev["seeds"] = [_int(s, "--seeds") for s in _list(args.seeds)]
    cfg = {"model": args.model, "env": args.env, "split": args.split, "tasks": args.tasks, "eval": ev,
           "recovery_runs": args.recovery_run or []}
    spec = validate_job("eval", cfg)  # its fields, and its env and task selection, before the store opens
    selection = eval_tasks(spec)
    with Store(args.db, must_exist=bool(cfg["recovery_runs"])) as store:
        if args.job:
            job = JobRunner(store).submit("eval", cfg, device=args.device)
            print(f"job {job.id} (eval) {job.state}; log {job.log_path}")
            return 0
        eval_id = run_eval(store, spec, log=_log, selection=selection)
        row = next(e for e in store.evaluations(model=args.model) if e["id"] == eval_id)
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        from engine.evaluate import format_metrics

        print(f"evaluation {eval_id} ({row['mode']})\n{format_metrics(row['metrics'])}")
    return 0


# ------------------------------------------------------------------ iterate


def cmd_iterate(args: argparse.Namespace) -> int:
    from engine.envs.registry import env_factory
    from engine.jobs.runner import JobRunner
    from engine.loop import IterateConfig, loop_tasks, run_loop
    from engine.store import Store

    data: dict[str, Any] = dict(read_table(args.config, "iterate")) if args.config else {}
    data.update(given(args, ITERATE_FLAGS))
    config = IterateConfig.from_dict(data)
    loop_tasks(config, env_factory(config.env)())  # a bad task selection is refused before the store opens
    print(f"loop {config.method}: trains on rows with a final label (approved / edited)"
          + (" and on uncurated rows (--include-pending)" if config.include_pending else
             "; uncurated rows are left out (--include-pending includes them)"), flush=True)
    with Store(args.db) as store:
        if args.job:
            from dataclasses import asdict

            job = JobRunner(store).submit("iterate", {"iterate": asdict(config)}, device=args.device)
            print(f"job {job.id} (iterate) {job.state}; log {job.log_path}")
            return 0
        loop_id = run_loop(store, config, reporter=PrintReporter())
        rows = store.iterations(loop_id)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for r in rows:
        ev = r.get("eval") or {}
        s = ev.get("success", {})
        score = f"success {s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]" if s else r.get("skipped", "")
        print(f"{loop_id} iteration {r['idx']}: {r.get('model', '')} {score}")
    return 0




def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `eval` and `iterate`."""
    from engine.evaluate import EvalConfig
    from engine.loop import IterateConfig

    e = sub.add_parser("eval", parents=[common], help="evaluate a model on held-out tasks")
    e.add_argument("--model", required=True, help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH")
    e.add_argument("--env", default="textcraft")
    e.add_argument("--tasks", default="", help="a range/ids within --split, or test | train for the whole split "
                                               "(default: every task of --split)")
    e.add_argument("--split", default="test")
    add_flags(e, EvalConfig, EVAL_FLAGS)
    e.add_argument("--seeds", help=default_help(EvalConfig, "seeds"))
    e.add_argument("--recovery-run", dest="recovery_run", action="append",
                   help="also score recovery from this run's recovery prefixes (repeatable)")
    e.add_argument("--json", action="store_true")
    e.add_argument("--job", action="store_true", help="queue as a background job instead")
    e.add_argument("--device", help="job device (with --job)")
    e.set_defaults(func=cmd_eval)

    it = sub.add_parser("iterate", parents=[common],
                        help="iterated training: search -> data -> train -> evaluate (Agent Q or Agent-R)")
    add_flags(it, IterateConfig, ITERATE_FLAGS)
    it.add_argument("--config", help="JSON file with IterateConfig fields (search/dpo/sft/eval overrides)")
    it.add_argument("--json", action="store_true")
    it.add_argument("--job", action="store_true", help="queue as a background job instead")
    it.add_argument("--device", help="job device (with --job)")
    it.set_defaults(func=cmd_iterate)
