"""`orchard serve-env` (an env over AgentGym's HTTP protocol) and `orchard demo` (the offline end to end)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.common import log as _log


def cmd_serve_env(args: argparse.Namespace) -> int:
    from engine.envs.serve import serve

    try:
        serve(args.env, args.host, args.port, args.split, args.style, args.max_envs, log=_log)
    except KeyboardInterrupt:
        _log("stopped")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from engine.demo import DEMO, run_demo

    settings = DEMO
    if args.tasks is not None:
        settings = replace(settings, tasks=args.tasks)
    if args.simulations is not None:
        settings = replace(settings, search=replace(settings.search, simulations=args.simulations))
    if args.train_steps is not None:
        settings = replace(settings, train_steps=args.train_steps)
    if args.eval_tasks is not None:
        settings = replace(settings, eval_tasks=args.eval_tasks)
    run_demo(db=args.db, log=_log, settings=settings)
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `serve-env` and `demo`."""
    se = sub.add_parser("serve-env", help="serve an env over AgentGym's HTTP env-server protocol")
    se.add_argument("env", help="env spec, e.g. textcraft or babyai:GoToLocal")
    se.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    se.add_argument("--port", type=int, default=36001, help="port (default 36001; 0 picks a free one)")
    se.add_argument("--split", default="train", help="the split that data_idx indexes (default train)")
    se.add_argument("--style", choices=("id", "env_idx"), default="id",
                    help="answer /create and /reset as AgentGym's id-style or env_idx-style servers do")
    se.add_argument("--max-envs", dest="max_envs", type=int, default=64, help="live env instances at most")
    se.set_defaults(func=cmd_serve_env)

    d = sub.add_parser(
        "demo", parents=[common],
        help="the whole loop on the tiny offline model: search, pairs, revisions, a short DPO job, evaluation",
    )
    d.add_argument("--tasks", help="train tasks searched (default: the demo's, e.g. 0:8)")
    d.add_argument("--simulations", type=int, help="MCTS simulations per task")
    d.add_argument("--train-steps", dest="train_steps", type=int, help="SFT optimizer steps at most")
    d.add_argument("--eval-tasks", dest="eval_tasks", help="held-out tasks both models are evaluated on (e.g. 0:8)")
    d.set_defaults(func=cmd_demo)
