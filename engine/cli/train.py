"""`orchard train dpo|sft|rft`, `orchard jobs [cancel|show|log]`.

Wired into engine.cli by `add_parsers(sub, common)`. Only argparse is imported at start-up.
Training runs as a job in its own process by default (the command prints the job id and returns;
`--wait` follows it to the end, `--foreground` trains in this process instead, through the same
`run_training` the job worker uses). User errors raise ConfigError / StoreError / TrainError
(ValueError) / EnvError / GeneratorError: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from engine.cli.common import PrintReporter
from engine.cli.common import log as _log
from engine.cli.common import split_list as _list
from engine.config import read_table

# ------------------------------------------------------------------ train


def _train_overrides(args: argparse.Namespace) -> dict[str, Any]:

    data: dict[str, Any] = dict(read_table(args.config, "train")) if args.config else {}
    flags = {
        "learning_rate": args.lr, "epochs": args.epochs, "max_steps": args.max_steps, "batch_size": args.batch_size,
        "grad_accum": args.grad_accum, "seed": args.seed, "max_length": args.max_length,
        "num_threads": args.threads,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.lora:
        data["lora"] = True
    if args.precision:
        data["precision"] = args.precision
    if args.status:
        data["statuses"] = _list(args.status)
    if args.include_pending:
        data["include_pending"] = True
    if args.what == "dpo":
        for key in ("beta", "ref_source", "min_gap"):
            if getattr(args, key) is not None:
                data[key] = getattr(args, key)
        if args.trajectory:
            data["kinds"] = ["trajectory"]
    else:
        if args.kind:
            data["kinds"] = _list(args.kind)
        if args.format:
            data["format"] = args.format
        if args.revision_share is not None:
            data["revision_share"] = args.revision_share
    return data


def cmd_train(args: argparse.Namespace) -> int:
    from engine.store import Store
    from engine.train.jobs import JobRunner, validate_job

    config = {"model": args.model, "output": args.out, "runs": args.run or [], "train": _train_overrides(args)}
    validate_job(args.what, config)
    with Store(args.db, must_exist=True) as store:
        for run in config["runs"]:
            store.find_run(run)
        if args.foreground:
            from engine.train.training import run_training

            result = run_training(store, args.what, config, PrintReporter())
            print(f"trained {result.output} ({result.metrics.get('steps')} steps, loss "
                  f"{result.metrics.get('train_loss'):.4f})")
            return 0
        runner = JobRunner(store)
        job = runner.submit(args.what, config, device=args.device, name=args.name)
        print(f"job {job.id} ({args.what}) {job.state} on {job.device}; log {job.log_path}")
        if args.wait:
            return _follow(runner, job.id)
    return 0


def _follow(runner: Any, job_id: str) -> int:
    last = None
    while True:
        job = runner.wait(job_id, timeout=2.0)
        p = job.progress
        line = f"{job.state} {p.get('phase', '')} {p.get('step', 0)}/{p.get('total', '?')}"
        if line != last:
            _log(line)
            last = line
        if job.final:
            break
    print(f"job {job.id} {job.state}" + (f": {job.error}" if job.error else "")
          + (f" -> {job.output_path}" if job.output_path else ""))
    return 0 if job.state == "succeeded" else 1


# ------------------------------------------------------------------ jobs


def cmd_jobs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.paths import db_path
    from engine.store import Store
    from engine.train.jobs import JobRunner, job_summary

    action = getattr(args, "action", None)
    if action is None and not db_path(args.db).exists():
        print("[]" if args.json else "no jobs yet")
        return 0
    with Store(args.db, must_exist=action is not None) as store:
        runner = JobRunner(store)
        runner.poll()
        if action == "cancel":
            job = runner.cancel(store.find_job(args.id), grace_s=args.grace)
            print(f"job {job.id}: {job.state}")
            return 0
        if action in ("show", "log"):
            job = store.job(store.find_job(args.id))
            if action == "log":
                try:
                    text = Path(job.log_path or "").read_text(encoding="utf-8", errors="replace")
                    print(text[-args.tail :], end="")
                except OSError:
                    print(f"job {job.id}: no log yet ({job.log_path})")
                return 0
            data = {**job.to_dict(), "metrics": store.job_metrics(job.id)}
            if getattr(args, "json", False):
                print(json.dumps(data, indent=2))
            else:
                print(job_summary(job))
                for row in data["metrics"][-10:]:
                    print("  ", {k: v for k, v in row.items() if k != "at"})
            return 0
        jobs = store.jobs()
        if args.json:
            print(json.dumps([j.to_dict() for j in jobs], indent=2))
            return 0
        if not jobs:
            print("no jobs yet")
            return 0
        print(f"{'id':<11} {'kind':<8} {'state':<10} {'device':<7} {'created':<12} {'progress':<24} output / error")
        for j in jobs:
            print(job_summary(j))
    return 0


# ------------------------------------------------------------------ parsers


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `train`, `jobs`, `eval` and `iterate` on the CLI's top-level subparsers."""
    t = sub.add_parser("train", help="train the next policy (DPO, SFT, RFT) as a background job")
    tsub = t.add_subparsers(dest="what", required=True)
    helps = {"dpo": "step-level DPO on preference pairs (--trajectory: the trajectory-level baseline)",
             "sft": "SFT with per-turn loss masks (revision + good trajectories, refinement data)",
             "rft": "RFT baseline: SFT on successful trajectories"}
    for what, help_text in helps.items():
        p = tsub.add_parser(what, parents=[common], help=help_text)
        p.add_argument("--model", required=True, help="tiny | PATH | hf:PATH (the policy to train; the reference)")
        p.add_argument("--run", action="append", help="only data of this run (repeatable; default: all runs)")
        p.add_argument("--out", help="output model folder (default: data/models/trained/KIND-JOB)")
        p.add_argument("--name", help="job name")
        p.add_argument("--config", help="TOML/JSON file with trainer settings (a [train] table or the top level)")
        p.add_argument("--status", help="curation statuses to use (default approved,edited)")
        p.add_argument("--include-pending", dest="include_pending", action="store_true",
                       help="also train on pending (uncurated) rows")
        p.add_argument("--lr", type=float, help="learning rate")
        p.add_argument("--epochs", type=float)
        p.add_argument("--max-steps", dest="max_steps", type=int)
        p.add_argument("--batch-size", dest="batch_size", type=int)
        p.add_argument("--grad-accum", dest="grad_accum", type=int)
        p.add_argument("--max-length", dest="max_length", type=int)
        p.add_argument("--seed", type=int)
        p.add_argument("--threads", type=int, help="torch CPU threads")
        p.add_argument("--lora", action="store_true", help="train a LoRA adapter (merged into the saved model)")
        p.add_argument("--precision", choices=("auto", "fp32", "bf16"))
        p.add_argument("--device", help="cpu | cuda:0 ... (default: cuda:0 if available, else cpu)")
        p.add_argument("--wait", action="store_true", help="follow the job until it ends")
        p.add_argument("--foreground", action="store_true", help="train in this process instead of a job")
        if what == "dpo":
            p.add_argument("--beta", type=float, help="DPO beta (default 0.1)")
            p.add_argument("--ref-source", dest="ref_source", choices=("auto", "stored", "precompute", "live"),
                           help="reference log-probs: stored replay buffer where valid (auto, default), ...")
            p.add_argument("--min-gap", dest="min_gap", type=float, help="only pairs with Q gap at least this")
            p.add_argument("--trajectory", action="store_true", help="trajectory-level DPO (baseline)")
        else:
            p.add_argument("--kind", help="sample kinds (default revision,good; rft: rft)")
            p.add_argument("--format", choices=("steps", "chat"), help="per-step actor prompts (default) or chats")
            p.add_argument("--revision-share", dest="revision_share", type=float,
                           help="fraction of revision trajectories in the mix (Agent-R)")
        p.set_defaults(func=cmd_train)

    j = sub.add_parser("jobs", parents=[common], help="list training jobs; cancel, show or read the log of one")
    j.add_argument("--json", action="store_true")
    jsub = j.add_subparsers(dest="action")
    jc = jsub.add_parser("cancel", parents=[common], help="cancel a queued or running job")
    jc.add_argument("id")
    jc.add_argument("--grace", type=float, default=30.0, help="seconds to stop cleanly before a kill (default 30)")
    js = jsub.add_parser("show", parents=[common], help="a job's state, progress and latest metrics")
    js.add_argument("id")
    js.add_argument("--json", action="store_true")
    jl = jsub.add_parser("log", parents=[common], help="the end of a job's log file")
    jl.add_argument("id")
    jl.add_argument("--tail", type=int, default=4000, help="characters from the end (default 4000)")
    j.set_defaults(func=cmd_jobs)
