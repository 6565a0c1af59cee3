"""`orchard search`, `orchard runs`, `orchard export tree`: growing search trees and reading them back."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from engine.cli.common import log as _log
from engine.cli.flags import add_flags, given
from engine.errors import UsageError

SEARCH_FLAGS = {
    "simulations": "--simulations", "k": "--k", "depth_limit": "--depth", "c_exp": "--c-exp", "alpha": "--alpha",
    "temperature": "--temperature", "rollout_temperature": "--rollout-temperature", "max_tokens": "--max-tokens",
    "trees_in_flight": "--trees-in-flight", "backup": "--backup", "seed": "--seed", "constrained": "--constrained",
    "value_model": "--value-model",
}


def _search_config(args: argparse.Namespace):
    from dataclasses import replace

    from engine.config import ConfigError, SearchConfig, load_file

    base = load_file(SearchConfig, args.config) if args.config else SearchConfig()
    overrides = given(args, SEARCH_FLAGS)  # typed by argparse from the fields (engine.cli.flags)
    if args.no_critic:
        overrides["critic"] = False
    try:
        return replace(base, **overrides)
    except ConfigError as e:
        raise ConfigError(f"command line: {e}") from None


def cmd_search(args: argparse.Namespace) -> int:
    """The search stage in the foreground (its body is engine.search.stage.run_search, as for a job;
    with --ray the same spec carries the address and the trees grow on Ray workers)."""
    from engine.llm.registry import check_model, load_generator
    from engine.progress import ConsoleReporter
    from engine.search.stage import ResumeSearch, SearchJob, check_ray, run_search, search_tasks
    from engine.store import Store

    reporter = ConsoleReporter(unit="sim")
    ray = {"ray": args.ray} if args.ray is not None else {}
    # On Ray or in local shards the workers load the model: the driver's choices travel with the spec.
    workers = {"allow_http_key": bool(args.allow_http_key), "shards": args.shards}
    if args.allow_unauthenticated_ray:  # this command's driver only (engine.search.ray_search.check_auth)
        from engine.search.ray_search import ALLOW_UNAUTHENTICATED_ENV

        os.environ[ALLOW_UNAUTHENTICATED_ENV] = "1"
    check_ray(args.ray)  # a malformed address, or no Ray installed: refused before anything is opened
    if args.at is not None or args.task is not None:
        return _search_here(args)
    if args.resume:
        with Store(args.db, must_exist=True) as store:
            run_id = store.find_run(args.resume)
            info = store.run(run_id)
            if args.model is None:
                _confirm_stored_endpoint(info.model, run_id)
            if ray:  # the workers load the model; the spec is checked first (engine.search.stage)
                result = run_search(store, ResumeSearch(resume=run_id, model=args.model, **ray, **workers), reporter)
            else:
                generator = load_generator(args.model or info.model, log=_log, allow_http_key=args.allow_http_key)
                result = run_search(store, ResumeSearch(resume=run_id, **workers), reporter,
                                    prepared=(None, [], generator))
        reporter.close()
        _log(result.lines[0])
        return 0

    spec = SearchJob(env=args.env, tasks=args.tasks or "", split=args.split, model=args.model or "tiny",
                     name=args.name or f"{args.env}-{time.strftime('%Y%m%d-%H%M%S')}",
                     search=_search_config(args), **ray, **workers)
    make_env, tasks = search_tasks(spec)  # an env that cannot start is refused before anything is loaded
    if ray:  # the workers load the model: its spec is checked here, before the database is opened
        from engine.search.ray_search import connect

        check_model(spec.model)
        connect(args.ray.strip() or None)  # joined now: an address nothing answers is refused in seconds
    model = None if ray else load_generator(spec.model, log=_log, allow_http_key=args.allow_http_key)
    with Store(args.db) as store:
        result = run_search(store, spec, reporter, prepared=(make_env, tasks, model))
    reporter.close()
    _log(result.lines[0])
    return 0


def _search_here(args: argparse.Namespace) -> int:
    """`--resume RUN --task T --at NODE --simulations N`: N more simulations rooted at a node (engine/search/steer.py)."""
    from engine.cli.tree import steer
    from engine.search.steer import SearchHere

    if not args.resume or args.task is None or args.at is None:
        raise UsageError("search here needs --resume RUN, --task T and --at NODE together (and --simulations N)")
    if args.ray is not None:
        raise UsageError("--at grows one tree in this process; it does not run on Ray (drop --ray)")
    return steer(args, SearchHere(run=args.resume, task=args.task, at=args.at, simulations=args.simulations or 8,
                                  model=args.model, allow_http_key=bool(args.allow_http_key) or None))


def _confirm_stored_endpoint(spec: str, run_id: str) -> None:
    """A resumed run's model spec comes from the database, which someone else may have written:
    $OPENAI_API_KEY goes to its URL only if the user agrees (asked on a terminal) or typed the spec
    again with --model. Without a key there is nothing to leak."""
    from engine.llm.registry import parse_model_spec

    parsed = parse_model_spec(spec)  # as the loader reads it (a stored spec may start with a space)
    if parsed.kind != "openai" or not os.environ.get("OPENAI_API_KEY"):
        return
    spec, url = parsed.text, parsed.target.partition("#")[0]
    how = (f"type the spec again to send it there: orchard search --resume {run_id} --model '{spec}' "
           "(or unset OPENAI_API_KEY)")
    if not sys.stdin.isatty():
        raise UsageError(f"run {run_id}: its model URL {url} comes from the database, not from you, and "
                         f"$OPENAI_API_KEY would be sent to it; {how}")
    print(f"run {run_id} was searched with {spec} (read from the database). Send $OPENAI_API_KEY to {url}? "
          "[y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise UsageError(f"run {run_id}: not resumed, $OPENAI_API_KEY not sent to {url}")


def cmd_runs(args: argparse.Namespace) -> int:
    from engine.paths import db_exists, db_path
    from engine.store import Store

    if not db_exists(db_path(args.db)):
        runs = []
    else:
        with Store(args.db) as store:
            runs = store.runs()
    if args.json:
        print(json.dumps([r.to_dict() for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs yet (try `orchard demo` or `orchard search`)")
        return 0
    print(f"{'id':<11} {'name':<28} {'env':<10} {'model':<24} {'status':<11} {'trees':>5} {'solved':>6} "
          f"{'sims':>6} {'nodes':>7}")
    for r in runs:
        print(f"{r.id:<11} {r.name[:28]:<28} {r.env[:10]:<10} {r.model[-24:]:<24} {r.status:<11} {r.trees:>5} "
              f"{r.solved:>6} {r.simulations:>6} {r.nodes:>7}")
    return 0


def cmd_export_tree(args: argparse.Namespace) -> int:
    from engine.store import Store

    with Store(args.db, must_exist=True) as store:
        run_id = store.find_run(args.run)
        info = store.run(run_id)
        tree = store.load_tree(store.tree_id(run_id, args.task))
    if tree is None:
        raise UsageError(f"run {run_id} task {args.task}: no simulation committed yet")
    from engine.fileio import atomic_write
    from engine.search.export import tree_graphml, tree_json

    out = Path(args.output) if args.output else None
    if args.format == "json":
        text = tree_json(tree, info)
        if out:  # temp file + rename: a reader (or a kill) never sees half a tree
            atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        else:
            print(text)
    else:
        import gzip

        data = tree_graphml(tree, info)
        target = out or Path(f"{run_id}-{args.task}.graphml")
        opener = gzip.open if target.suffix == ".gz" else open  # as nx.write_graphml does by suffix

        def write(tmp: str) -> None:
            with opener(tmp, "wb") as f:
                f.write(data)

        atomic_write(target, write)
        _log(f"wrote {target}")
    return 0


def _shard_count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> Any:
    """Register `search`, `runs` and `export tree`; returns the `export` subparsers for other targets."""
    s = sub.add_parser("search", parents=[common], help="grow search trees for a set of tasks")
    s.add_argument("--env", default="textcraft", help="environment (default textcraft)")
    s.add_argument("--tasks", help="task indices START:STOP[:STEP] or ids a,b,c (default: the first 8, or all if fewer)")
    s.add_argument("--split", default="train", help="task split (default train)")
    s.add_argument("--model", help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH (default tiny)")
    s.add_argument("--name", help="run name")
    s.add_argument("--resume", metavar="RUN", help="continue an interrupted run (id or name)")
    s.add_argument("--task", help="with --resume and --at: the tree to grow at one node (\"search here\")")
    s.add_argument("--at", type=int, metavar="NODE", help="with --resume and --task: N more simulations whose "
                                                          "selection starts at this node (--simulations N, default 8)")
    s.add_argument("--config", help="TOML/JSON file with search settings")
    from engine.config import SearchConfig

    add_flags(s, SearchConfig, SEARCH_FLAGS)
    s.add_argument("--no-critic", action="store_true", help="skip AI process supervision")
    s.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="grow the trees on a Ray cluster (HOST:PORT or auto; none: start a local Ray); needs "
                        "orchard[ray]; with --resume, the rest of the run")
    s.add_argument("--shards", type=_shard_count, metavar="N",
                   help="grow the trees in N worker processes feeding this one (default: min(cores, "
                        "ceil(requests in flight / 256)) for an openai: model, else 1); with --ray, N Ray tasks")
    s.add_argument("--allow-unauthenticated-ray", action="store_true",
                   help="join a --ray cluster beyond loopback although Ray's token auth (RAY_AUTH_MODE=token) is "
                        "off (refused by default: anyone reaching it could run code there)")
    s.add_argument("--allow-http-key", dest="allow_http_key", action="store_true",
                   help="let an openai:http://... model that is not on loopback receive $OPENAI_API_KEY "
                        "unencrypted (refused by default)")
    s.set_defaults(func=cmd_search)

    r = sub.add_parser("runs", parents=[common], help="list runs")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_runs)

    e = sub.add_parser("export", help="export data")
    esub = e.add_subparsers(dest="what", required=True)
    et = esub.add_parser("tree", parents=[common], help="one task's tree as orchard.tree/1 JSON or GraphML")
    et.add_argument("run")
    et.add_argument("--task", required=True)
    et.add_argument("--format", choices=("json", "graphml"), default="json")
    et.add_argument("-o", "--output")
    et.set_defaults(func=cmd_export_tree)
    return esub
