"""`orchard refine generate`: AgentRefine (arXiv 2501.01702) refinement data from a model
(docs/algorithms.md §5) into JSONL.

Wired by engine.cli (`add_parsers(sub, common)`); heavy imports stay inside the command. User
errors (bad --n, personas file, config file, model spec) are ConfigError / GeneratorError, which
the CLI prints as one line with exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from engine.cli.common import log as _log
from engine.cli.flags import add_flags
from engine.paths import runs_dir


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `refine generate` on the top-level subparsers `sub`."""
    r = sub.add_parser("refine", help="AgentRefine refinement data (persona -> script -> trajectory)")
    rsub = r.add_subparsers(dest="refine_command", required=True)
    g = rsub.add_parser(
        "generate", parents=[common],
        help="synthesize verified DM/player trajectories with a model and write chat rows (JSONL)",
    )
    g.add_argument("--model", required=True, help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH")
    g.add_argument("--n", type=int, default=30, help="personas to sample, one trajectory attempt each (default 30)")
    g.add_argument("--out", help="output JSONL (default $ORCHARD_HOME/runs or data/runs, "
                                 "refine-TIMESTAMP.jsonl); stats go beside it as .stats.json")
    g.add_argument("--personas", help="personas JSONL of {id, persona} (default data/personas.jsonl)")
    g.add_argument("--config", help="TOML/JSON file with RefineConfig settings")
    from engine.datasets.refine import RefineConfig

    add_flags(g, RefineConfig, {"seed": "--seed"})
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from engine.config import ConfigError, from_dict, load_file
    from engine.datasets.refine import (
        DEFAULT_PERSONAS,
        RefineConfig,
        generate,
        load_personas,
        sample_personas,
        to_row,
    )
    from engine.llm.registry import load_generator

    base = load_file(RefineConfig, args.config) if args.config else RefineConfig()
    overrides = {"seed": args.seed} if args.seed is not None else {}
    config = from_dict(RefineConfig, {**asdict(base), **overrides}, where="command line")
    personas = sample_personas(load_personas(args.personas or DEFAULT_PERSONAS), args.n, config.seed)
    out = Path(args.out) if args.out else runs_dir() / f"refine-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name")
    generator = load_generator(args.model, log=_log)

    out.parent.mkdir(parents=True, exist_ok=True)
    # Streamed to a side file, so an interrupted run keeps what it verified there and never
    # touches an existing `out`; renamed into place once the run is complete.
    partial = out.with_name(f"{out.name}.partial")
    written = 0
    try:
        with partial.open("w", encoding="utf-8") as f:

            def write(sample: Any) -> None:
                nonlocal written
                f.write(json.dumps(to_row(sample), ensure_ascii=False) + "\n")
                f.flush()
                written += 1

            result = generate(generator, personas, config, on_sample=write)
    except BaseException:
        if written:
            _log(f"refine: stopped; the {written} verified rows so far are in {partial}")
        else:
            partial.unlink(missing_ok=True)
        raise
    os.replace(partial, out)
    stats = result.stats.to_dict()
    stats_path = out.with_name(out.name.removesuffix(".jsonl") + ".stats.json")
    stats_path.write_text(
        json.dumps({"model": generator.name, "personas": [p.id for p in personas], "config": asdict(config),
                    "stats": stats, "failures": result.failures}, indent=1, ensure_ascii=False),
        encoding="utf-8",
    )
    for line in summary(stats):
        print(line)
    print(f"wrote {out} ({stats['rows']} rows) and {stats_path}")
    return 0


def summary(s: dict[str, Any]) -> list[str]:
    """Human-readable counts, costs and rejections of one run (`s`: `RefineStats.to_dict()`)."""

    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

    head = f"refine: {s['personas']} personas -> {s['rows']} rows, {s['failed']} failed"
    cost = f"cost: {s['calls']} model calls in {s['batches']} batches ({counts(s['calls_by_stage'])})"
    tokens = f"{s['completion_tokens']} completion tokens, {s['prompt_chars']} prompt chars"
    retries = f"retries: {s['script_retries']} script, {s['continuations']} continuations"
    return [
        f"{head} ({counts(s['failures_by_stage'])}) in {s['wall_s']:.1f}s",
        f"{cost}; {tokens}",
        f"{retries}, {s['regenerations']} regenerations; {s['scripts_kept']} scripts kept",
        f"rejections: script [{counts(s['script_rejections'])}]; trajectory [{counts(s['trajectory_rejections'])}]",
    ]




