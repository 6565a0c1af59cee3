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
    from engine.demo import run_demo

    return run_demo(db=args.db, log=_log)


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
        "demo", parents=[common], help="build the tiny offline model if needed and search TextCraft with it"
    )
    d.set_defaults(func=cmd_demo)
