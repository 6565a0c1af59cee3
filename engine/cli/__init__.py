"""`orchard ...` — the command line: it parses arguments, calls the domain packages and prints.

Nothing outside this package imports it. One module per command group (runs: search/runs/export
tree; data: pairs/revisions/import/export; refine; train: train/jobs; evaluate: eval/iterate; serve:
serve-env/demo; db: db copy; users: dashboard logins; tree: steering a stored tree), each with `add_parsers(sub, common)`. Heavy libraries load only inside the command
that needs them.

Every user error (bad env, task range, config, model, database) is one line on stderr naming the
problem, exit code 2, and nothing is written before the inputs are known to be good.
"""

from __future__ import annotations

import argparse
import os
import sys

from engine.errors import UsageError, user_errors

EXIT_USAGE = 2

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from engine.cli import data, db, evaluate, refine, runs, serve, train, tree, users

    p = argparse.ArgumentParser(prog="orchard", description="MCTS over LLM-agent episodes -> training data.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", help="database file (default: $ORCHARD_DB, else $ORCHARD_HOME/orchard.db, else data/orchard.db)"
    )
    sub = p.add_subparsers(dest="command", required=True)
    export_sub = runs.add_parsers(sub, common)  # search, runs, export tree
    data.add_export_parsers(export_sub, common)  # export pairs | sft | agentgym
    data.add_parsers(sub, common)  # pairs build, revisions build, import
    serve.add_parsers(sub, common)  # serve-env, demo
    refine.add_parsers(sub, common)  # refine generate
    train.add_parsers(sub, common)  # train dpo|sft|rft, jobs [cancel|show|log]
    evaluate.add_parsers(sub, common)  # eval, iterate
    db.add_parsers(sub, common)  # db copy
    users.add_parsers(sub, common)  # users add|list|remove
    tree.add_parsers(sub, common)  # tree add-action|more-candidates
    return p


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
