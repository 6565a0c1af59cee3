"""`orchard refine generate`: AgentRefine (arXiv 2501.01702) refinement data from a model
(docs/algorithms.md §5), or from `--model offline` (TextCraft's scripted synthesizer,
engine/datasets/refine_offline.py), into JSONL and the database's samples.

Wired by engine.cli (`add_parsers(sub, common)`); heavy imports stay inside the command. User
errors (bad --n, personas file, config file, model spec) are ConfigError / GeneratorError, which
the CLI prints as one line with exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.flags import add_flags


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `refine generate` on the top-level subparsers `sub`."""
    r = sub.add_parser("refine", help="AgentRefine refinement data (persona -> script -> trajectory)")
    rsub = r.add_subparsers(dest="refine_command", required=True)
    g = rsub.add_parser(
        "generate", parents=[common],
        help="synthesize verified DM/player trajectories with a model and write chat rows (JSONL)",
    )
    g.add_argument("--model", required=True,
                   help="offline (TextCraft's scripted synthesizer, no LLM) | tiny | PATH | hf:PATH | "
                        "openai:URL#MODEL | vllm:PATH")
    g.add_argument("--n", type=int, default=30, help="personas to sample, one trajectory attempt each (default 30)")
    g.add_argument("--out", help="output JSONL (default $ORCHARD_HOME/runs or data/runs, "
                                 "refine-TIMESTAMP.jsonl); stats go beside it as .stats.json; the rows are "
                                 "also saved in the database (--db) for the Refinement page")
    g.add_argument("--personas", help="personas JSONL of {id, persona} (default data/personas.jsonl)")
    g.add_argument("--config", help="TOML/JSON file with RefineConfig settings")
    from engine.datasets.refine import RefineConfig

    add_flags(g, RefineConfig, {"seed": "--seed"})
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """The refine stage in the foreground (its body is engine.datasets.builds.run_refine, as for a job)."""
    from engine.config import load_file
    from engine.datasets.builds import RefineJob, run_refine
    from engine.datasets.refine import RefineConfig
    from engine.progress import ConsoleReporter
    from engine.store import Store

    base = load_file(RefineConfig, args.config) if args.config else RefineConfig()
    spec = RefineJob(model=args.model, n=args.n, out=args.out, personas=args.personas, seed=args.seed, refine=base)
    spec.check()
    reporter = ConsoleReporter(unit="persona")
    with Store(args.db) as store:
        result = run_refine(spec, reporter, store=store)
    reporter.close()
    print("\n".join(result.lines))
    return 0


