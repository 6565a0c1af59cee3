"""`orchard tree add-action|more-candidates`: steering a stored tree at one node (engine/search/steer.py);
`orchard search --resume RUN --task T --at NODE --simulations N` ("search here") is in engine/cli/runs.py."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.common import log as _log


def steer(args: argparse.Namespace, spec: Any) -> int:
    """Run a steering spec in the foreground: every check before the model is loaded, then the job's body."""
    from engine.progress import ConsoleReporter
    from engine.search.steer import check_steer, generator_for, open_target, run_steer
    from engine.store import Store

    reporter = ConsoleReporter(unit="sim")
    with Store(args.db, must_exist=True) as store:
        check_steer(store, spec)  # the node, the action, the env: refused before a model is loaded
        target = open_target(store, spec.run, spec.task, spec.at)
        generator = generator_for(target, spec, reporter)
        result = run_steer(store, spec, reporter, generator=generator)
    reporter.close()
    _log(result.lines[0])
    return 0


def cmd_add_action(args: argparse.Namespace) -> int:
    from engine.search.steer import HumanBranch

    return steer(args, HumanBranch(run=args.run, task=args.task, at=args.at, action=args.action, model=args.model,
                                   allow_http_key=bool(args.allow_http_key) or None))


def cmd_more_candidates(args: argparse.Namespace) -> int:
    from engine.search.steer import MoreCandidates

    return steer(args, MoreCandidates(run=args.run, task=args.task, at=args.at, k=args.k, model=args.model,
                                      allow_http_key=bool(args.allow_http_key) or None))


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    t = sub.add_parser("tree", help="grow a stored tree at one node (human branch, more candidates)")
    tsub = t.add_subparsers(dest="what", required=True)

    def target(p: argparse.ArgumentParser) -> None:
        p.add_argument("run", help="run id, id prefix or name")
        p.add_argument("--task", required=True, help="the tree's task id")
        p.add_argument("--at", required=True, type=int, metavar="NODE", help="node id in that tree")
        p.add_argument("--model", help="the model that rolls out (default: the run's own)")
        p.add_argument("--allow-http-key", dest="allow_http_key", action="store_true",
                       help="let an openai:http://... model beyond loopback receive $OPENAI_API_KEY unencrypted")

    a = tsub.add_parser("add-action", parents=[common],
                        help="add a human-authored child at a node (a command or a whole composite action), "
                             "then back its value up through a rollout")
    target(a)
    a.add_argument("--action", required=True, help='a command ("get 1 oak log") or a composite action '
                                                   "(THOUGHT:/ACTION:/EXPLANATION:/STATUS: lines)")
    a.set_defaults(func=cmd_add_action)
    m = tsub.add_parser("more-candidates", parents=[common],
                        help="K more policy proposals at a node, ranked by the critic with its other children")
    target(m)
    m.add_argument("--k", type=int, help="proposals to sample (default: the run's K)")
    m.set_defaults(func=cmd_more_candidates)
