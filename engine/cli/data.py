"""`orchard pairs build`, `orchard revisions build`, `orchard export pairs|sft|agentgym`, `orchard import`.

Wired into engine.cli by `add_parsers(sub, common)` (the `pairs`, `revisions` and `import`
commands) and `add_export_parsers(export_sub, common)` (targets of the existing `export` group).
Only argparse is imported at start-up; every command imports what it needs when it runs. User
errors raise `DatasetError` (a ValueError), `ConfigError`, `EnvError`, `GeneratorError` or
`StoreError`, which the CLI prints as one line (exit 2). Each command prints what it counted and
where it wrote, on stdout.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from engine.cli.flags import add_flags, given

if TYPE_CHECKING:
    from engine.datasets.pairs import Pair
    from engine.datasets.samples import Sample

SAMPLE_KINDS = "revision,good,rft,recovery,refine,imported,exit,visits,hindsight"
PAIRS_FLAGS = {"theta": "--theta", "trajectory_pairs": "--trajectory-pairs", "min_visits": "--min-visits"}
REVISION_FLAGS = {"alpha_good": "--alpha-good", "beta_gap": "--beta-gap", "max_per_task": "--max-per-task",
                  "noop_command": "--noop-command", "judge_max_tokens": "--judge-max-tokens"}
EXPORT_STATUSES = "pending,approved,edited"


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_pairs_build(args: argparse.Namespace) -> int:
    """The pairs stage in the foreground (its body is engine.datasets.builds.run_pairs, as for a job)."""
    from engine.config import from_dict
    from engine.datasets.builds import PairsJob, run_pairs, who_am_i
    from engine.progress import ConsoleReporter
    from engine.store import Store

    spec = from_dict(PairsJob, {"run": args.run, "alpha": args.alpha, **given(args, PAIRS_FLAGS)}, where="command line")
    with Store(args.db, must_exist=True) as store:
        reporter = ConsoleReporter(unit="tree")
        result = run_pairs(store, spec, reporter, who=who_am_i())
        reporter.close()
    print("\n".join(result.lines))
    return 0


def cmd_revisions_build(args: argparse.Namespace) -> int:
    """The revisions stage in the foreground (its body is engine.datasets.builds.run_revisions, as for a job)."""
    from engine.config import from_dict
    from engine.datasets.builds import RevisionsJob, run_revisions, who_am_i
    from engine.progress import ConsoleReporter
    from engine.store import Store

    spec = from_dict(RevisionsJob, {"run": args.run, "model": args.model, **given(args, REVISION_FLAGS)},
                     where="command line")
    with Store(args.db, must_exist=True) as store:
        reporter = ConsoleReporter(unit="tree")
        result = run_revisions(store, spec, reporter, who=who_am_i())
        reporter.close()
    print("\n".join(result.lines))
    return 0


def _known(flag: str, values: list[str], known: tuple[str, ...]) -> None:
    from engine.config import ConfigError

    unknown = [v for v in values if v not in known]
    if unknown:
        raise ConfigError(f"{flag}: unknown value(s) {', '.join(map(repr, unknown))} (known: {', '.join(known)})")


def cmd_export(args: argparse.Namespace) -> int:
    from engine.datasets import formats
    from engine.datasets.pairs import PAIR_KINDS
    from engine.datasets.samples import KINDS as SAMPLE_KINDS
    from engine.store import CURATION_STATUSES, Store

    statuses = _list(args.status)
    _known("--status", statuses, CURATION_STATUSES)
    if args.kind:
        _known("--kind", _list(args.kind), PAIR_KINDS if args.what == "pairs" else SAMPLE_KINDS)
    with Store(args.db, must_exist=True) as store:
        run_id = store.find_run(args.run) if args.run else None
        items: list[Pair] | list[Sample]
        if args.what == "pairs":
            kinds = _list(args.kind) if args.kind else ["step"]
            items = store.pairs(run_id=run_id, status=statuses, kind=kinds, task_id=args.task,
                                min_gap=args.min_gap)
            rows = formats.dpo_rows(items)
        else:
            kinds = _list(args.kind) if args.kind else ["revision", "good"]
            items = store.samples(run_id=run_id, status=statuses, kind=kinds, task_id=args.task)
            if args.what == "agentgym":
                rows = formats.agentgym_rows(items)
            else:
                rows = formats.step_rows(items) if args.per_step else formats.sft_rows(items)
        out = formats.write_rows(rows, args.out)
    what = {"pairs": "DPO rows", "sft": "per-step SFT rows" if getattr(args, "per_step", False) else "SFT rows",
            "agentgym": "AgentGym rows"}[args.what]
    print(f"exported {len(rows)} {what} from {len(items)} {'pairs' if args.what == 'pairs' else 'samples'} "
          f"(kind {','.join(kinds)}, status {','.join(statuses)}) to {out}")
    return 0


def cmd_export_prm(args: argparse.Namespace) -> int:
    """Per-step labels from the trees' backed-up returns (engine/datasets/prm.py), for a process reward model."""
    from engine.datasets import formats
    from engine.datasets.builds import run_trees
    from engine.datasets.prm import PRMConfig, prm_rows
    from engine.store import Store

    config = PRMConfig(threshold=args.threshold, min_visits=args.min_visits)
    with Store(args.db, must_exist=True) as store:
        runs = [store.find_run(args.run)] if args.run else [r.id for r in store.runs()]
        rows = []
        for run_id in runs:
            rows += [r for r in prm_rows(run_trees(store, run_id), config) if not args.task or r["task_id"] == args.task]
        out = formats.write_rows(rows, args.out)
    good = sum(sum(r["labels"]) for r in rows)
    steps = sum(len(r["labels"]) for r in rows)
    print(f"exported {len(rows)} PRM rows ({steps} steps, {good} labelled good at Q~ >= {config.threshold}, "
          f"min visits {config.min_visits}) from {len(runs)} run(s) to {out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from engine.datasets.builds import who_am_i
    from engine.datasets.formats import read_samples
    from engine.store import Store

    result = read_samples(args.file, kind=args.kind)
    styles = ", ".join(f"{n} {style}" for style, n in sorted(result.formats.items()))
    if args.dry_run:
        print(f"{args.file}: {result.records} valid records ({styles}), {len(result.samples)} distinct; "
              "nothing written (dry run)")
        return 0
    with Store(args.db) as store:
        report = store.save_samples(result.samples, who=who_am_i())
        print(f"imported {args.file}: {result.records} records ({styles}), {result.duplicates} duplicates in the "
              f"file, as kind {args.kind}: {report}; db {store.path}")
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `pairs`, `revisions` and `import` on the CLI's top-level subparsers."""
    from engine.datasets.pairs import PairsConfig
    from engine.datasets.revisions import RevisionConfig

    p = sub.add_parser("pairs", help="preference pairs (Agent Q) from a run's trees")
    psub = p.add_subparsers(dest="action", required=True)
    pb = psub.add_parser("build", parents=[common],
                         help="step pairs, trajectory pairs and RFT rows from RUN; keeps curation on rebuild")
    pb.add_argument("run", help="run id, id prefix or name")
    pb.add_argument("--alpha", type=float, help="eq. 10 weight of the MCTS value (default: the run's alpha)")
    add_flags(pb, PairsConfig, PAIRS_FLAGS)
    pb.set_defaults(func=cmd_pairs_build)

    r = sub.add_parser("revisions", help="revision trajectories (Agent-R) from a run's trees")
    rsub = r.add_subparsers(dest="action", required=True)
    rb = rsub.add_parser("build", parents=[common],
                         help="revision, good and recovery samples from RUN, first errors judged by --model")
    rb.add_argument("run", help="run id, id prefix or name")
    rb.add_argument("--model", required=True, help="the judge: tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH")
    add_flags(rb, RevisionConfig, REVISION_FLAGS)
    rb.set_defaults(func=cmd_revisions_build)

    i = sub.add_parser("import", parents=[common],
                       help="import AgentGym / AgentRefine / chat-messages data (JSONL, JSON, Parquet) for curation")
    i.add_argument("file")
    i.add_argument("--kind", default="imported", choices=_list(SAMPLE_KINDS),
                   help="sample kind to file them under (default imported)")
    i.add_argument("--dry-run", dest="dry_run", action="store_true", help="validate only, write nothing")
    i.set_defaults(func=cmd_import)


def add_export_parsers(export_sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `pairs`, `sft` and `agentgym` as targets of the existing `export` subparsers."""
    helps = {
        "pairs": "preference pairs as TRL conversational DPO rows",
        "sft": "samples as chat `messages` with per-message train flags (or --per-step rows)",
        "agentgym": "samples as AgentGym `conversations` with loss true/false/null",
    }
    for what, help_text in helps.items():
        e = export_sub.add_parser(what, parents=[common], help=help_text)
        e.add_argument("run", nargs="?", help="only this run (id, prefix or name); default: all")
        e.add_argument("--out", required=True, help="output file, .jsonl or .parquet")
        e.add_argument("--status", default=EXPORT_STATUSES,
                       help=f"curation statuses to include (default {EXPORT_STATUSES}: all but rejected)")
        e.add_argument("--task", help="only this task id")
        if what == "pairs":
            e.add_argument("--kind", help="step,trajectory (default step)")
            e.add_argument("--min-gap", dest="min_gap", type=float, help="only pairs with Q gap at least this")
        else:
            e.add_argument("--kind", help=f"sample kinds among {SAMPLE_KINDS} (default revision,good)")
            if what == "sft":
                e.add_argument("--per-step", dest="per_step", action="store_true",
                               help="one prompt/completion row per trained turn, in the policy's inference format")
        e.set_defaults(func=cmd_export, what=what)
    e = export_sub.add_parser("prm", parents=[common], help="per-step value labels from the trees' backed-up returns "
                                                             "(TRL stepwise supervision: prompt, completions, labels)")
    e.add_argument("run", nargs="?", help="only this run (id, prefix or name); default: all")
    e.add_argument("--out", required=True, help="output file, .jsonl or .parquet")
    e.add_argument("--task", help="only this task id")
    e.add_argument("--threshold", type=float, default=0.5, help="a step is good when its Q~ reaches this")
    e.add_argument("--min-visits", dest="min_visits", type=int, default=1,
                   help="leave out paths through a step visited fewer times")
    e.set_defaults(func=cmd_export_prm, what="prm")
