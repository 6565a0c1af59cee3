"""`orchard ...` — the command line. Heavy libraries load only inside the command that needs them.

Every user error (bad env, task range, config, model, database) is one line on stderr naming the
problem, exit code 2, and nothing is written before the inputs are known to be good.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, exit 2."""


def _search_config(args: argparse.Namespace):
    from dataclasses import asdict

    from engine.config import SearchConfig, from_dict, load_file

    base = load_file(SearchConfig, args.config) if args.config else SearchConfig()
    overrides = {
        key: getattr(args, key)
        for key in ("simulations", "k", "depth_limit", "c_exp", "alpha", "seed", "trees_in_flight",
                    "temperature", "rollout_temperature", "max_tokens", "backup")
        if getattr(args, key) is not None
    }
    if args.no_critic:
        overrides["critic"] = False
    return from_dict(SearchConfig, {**asdict(base), **overrides}, where="command line")


def _progress_bar(total: int, desc: str):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="sim", file=sys.stderr, dynamic_ncols=True)

    def update(job, sim) -> None:
        bar.update(1)
        bar.set_postfix(reward=f"{sim.reward:.2f}", refresh=False)

    return bar, update


def cmd_search(args: argparse.Namespace) -> int:
    from engine.envs.base import close_env
    from engine.envs.registry import env_factory, select_tasks
    from engine.llm.registry import load_generator
    from engine.search.runner import new_run, resume_run
    from engine.store import Store

    if args.resume:
        with Store(args.db, must_exist=True) as store:
            run_id = store.find_run(args.resume)
            info = store.run(run_id)
            if args.model is None:
                _confirm_stored_endpoint(info.model, run_id)
            generator = load_generator(args.model or info.model, log=_log, allow_http_key=args.allow_http_key)
            remaining = info.config["simulations"] * info.trees - info.simulations
            bar, update = _progress_bar(remaining, f"resume {run_id}")
            with bar:
                run_id, stats = resume_run(store, run_id, generator, progress=update)
        _log(f"run {run_id} finished: {stats.simulations} simulations in {stats.wall_s:.1f}s; db {store.path}")
        return 0

    config = _search_config(args)
    make_env = env_factory(args.env)
    env = make_env()
    try:
        tasks = select_tasks(env, args.tasks, args.split) if args.tasks else env.tasks(args.split)[:8]
        if tasks:  # an env that cannot start (no browser, no Java) is refused before anything is loaded or written
            env.reset(tasks[0].id)
    finally:
        close_env(env)  # the probe; every tree makes its own env
    generator = load_generator(args.model or "tiny", log=_log, allow_http_key=args.allow_http_key)
    name = args.name or f"{args.env}-{time.strftime('%Y%m%d-%H%M%S')}"
    with Store(args.db) as store:
        bar, update = _progress_bar(config.simulations * len(tasks), name)
        with bar:
            run_id, stats = new_run(store, args.env, tasks, generator, config, name, update, make_env)
        solved = store.run(run_id).solved
        _log(
            f"run {run_id} ({name}): {len(tasks)} trees, {stats.simulations} simulations, "
            f"{solved} solved, {stats.wall_s:.1f}s; db {store.path}"
        )
    return 0


def _confirm_stored_endpoint(spec: str, run_id: str) -> None:
    """A resumed run's model spec comes from the database, which someone else may have written:
    $OPENAI_API_KEY goes to its URL only if the user agrees (asked on a terminal) or typed the spec
    again with --model. Without a key there is nothing to leak."""
    if not spec.startswith("openai:") or not os.environ.get("OPENAI_API_KEY"):
        return
    url = spec[len("openai:") :].partition("#")[0]
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
    from engine.store import Store

    if not Path(args.db or _default_db()).exists():
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

    alpha = info.config.get("alpha", 0.5)
    out = Path(args.output) if args.output else None
    if args.format == "json":
        run = {"id": run_id, "env": info.env, "model": info.model, "config": info.config}
        text = json.dumps(tree.to_json(run, alpha), indent=1)
        if out:  # temp file + rename: a reader (or a kill) never sees half a tree
            atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        else:
            print(text)
    else:
        import gzip

        import networkx as nx

        graph = tree.to_networkx(alpha)
        target = out or Path(f"{run_id}-{args.task}.graphml")
        opener = gzip.open if target.suffix == ".gz" else open  # as nx.write_graphml does by suffix

        def write(tmp: str) -> None:
            with opener(tmp, "wb") as f:
                nx.write_graphml(graph, f)

        atomic_write(target, write)
        _log(f"wrote {target}")
    return 0


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


def _default_db() -> Path:
    from engine.store import default_db_path

    return default_db_path()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orchard", description="MCTS over LLM-agent episodes -> training data.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", help="database file (default: $ORCHARD_HOME/orchard.db or data/orchard.db)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("search", parents=[common], help="grow search trees for a set of tasks")
    s.add_argument("--env", default="textcraft", help="environment (default textcraft)")
    s.add_argument("--tasks", help="task indices START:STOP[:STEP] or ids a,b,c (default: the first 8, or all if fewer)")
    s.add_argument("--split", default="train", help="task split (default train)")
    s.add_argument("--model", help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH (default tiny)")
    s.add_argument("--name", help="run name")
    s.add_argument("--resume", metavar="RUN", help="continue an interrupted run (id or name)")
    s.add_argument("--config", help="TOML/JSON file with search settings")
    s.add_argument("--simulations", type=int, help="simulations per task (T, default 16)")
    s.add_argument("--k", type=int, help="candidates per expansion (default 4)")
    s.add_argument("--depth", dest="depth_limit", type=int, help="depth limit (D, default 12)")
    s.add_argument("--c-exp", dest="c_exp", type=float, help="UCB1 exploration constant (default 1.0)")
    s.add_argument("--alpha", type=float, help="eq. 10 weight of the MCTS value (default 0.5)")
    s.add_argument("--temperature", type=float, help="expansion sampling temperature (default 1.0)")
    s.add_argument("--rollout-temperature", dest="rollout_temperature", type=float,
                   help="rollout temperature, 0 = greedy (default 1.0)")
    s.add_argument("--max-tokens", dest="max_tokens", type=int, help="tokens per composite action")
    s.add_argument("--trees-in-flight", dest="trees_in_flight", type=int, help="trees batched together")
    s.add_argument("--backup", choices=("reward", "progress"),
                   help="value backed up (eq. 8): the terminal reward (default) or max(reward, latched progress)")
    s.add_argument("--seed", type=int)
    s.add_argument("--no-critic", action="store_true", help="skip AI process supervision")
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

    from engine.datasets.cli_commands import add_export_parsers, add_parsers

    add_export_parsers(esub, common)  # export pairs | sft | agentgym
    add_parsers(sub, common)  # pairs build, revisions build, import

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
    d.add_argument("--train-steps", dest="train_steps", type=int, help="DPO optimizer steps")
    d.add_argument("--eval-tasks", dest="eval_tasks", help="held-out tasks both models are evaluated on (e.g. 0:8)")
    d.set_defaults(func=cmd_demo)

    from engine.datasets.refine_cli import add_parser as add_refine_parser

    add_refine_parser(sub, common)

    from engine.train.cli_commands import add_parsers as add_train_parsers

    add_train_parsers(sub, common)  # train dpo|sft|rft, jobs [cancel|show|log], eval, iterate
    return p


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix and say so in one line (exit 2 here; a job logs the line).
    Imported when called, so `orchard --help` stays fast."""
    from engine.config import ConfigError
    from engine.datasets.samples import DatasetError
    from engine.envs.base import EnvError
    from engine.fileio import OutputError
    from engine.llm.base import GeneratorError
    from engine.store import StoreError

    return (UsageError, ConfigError, DatasetError, EnvError, GeneratorError, StoreError, OutputError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    errors = user_errors()
    try:
        return args.func(args)
    except errors as e:
        print(f"orchard: error: {' '.join(str(e).split())}", file=sys.stderr)  # one line, whatever e quotes
        return EXIT_USAGE
    except BrokenPipeError:  # `orchard jobs | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("orchard: interrupted (resume with `orchard search --resume RUN`)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
