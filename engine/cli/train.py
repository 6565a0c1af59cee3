"""`orchard train dpo|sft|rft|value`, `orchard jobs [cancel|show|log]`.

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
from engine.cli.flags import add_flags, default_help, given
from engine.config import read_table
from engine.errors import UsageError

# ------------------------------------------------------------------ train


TRAIN_FLAGS = {
    "learning_rate": "--lr", "epochs": "--epochs", "max_steps": "--max-steps", "batch_size": "--batch-size",
    "grad_accum": "--grad-accum", "max_length": "--max-length", "seed": "--seed", "num_threads": "--threads",
    "lora": "--lora", "precision": "--precision", "include_pending": "--include-pending", "labels": "--labels",
}
DPO_FLAGS = {**TRAIN_FLAGS, "beta": "--beta", "ref_source": "--ref-source", "min_gap": "--min-gap",
             "sft_weight": "--sft-weight"}
SFT_FLAGS = {**TRAIN_FLAGS, "format": "--format", "revision_share": "--revision-share", "loss_on": "--loss-on"}


def _train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = dict(read_table(args.config, "train")) if args.config else {}
    data.update(given(args, DPO_FLAGS if args.what == "dpo" else SFT_FLAGS))
    if args.status:
        data["statuses"] = _list(args.status)
    if args.what == "dpo":
        if args.trajectory:
            data["kinds"] = ["trajectory"]
    elif args.kind:
        data["kinds"] = _list(args.kind)
    return data


def cmd_train(args: argparse.Namespace) -> int:
    from engine.jobs.kinds import validate_job
    from engine.jobs.runner import JobRunner, resolve_job_paths
    from engine.store import Store

    config = resolve_job_paths(args.what, {"model": args.model, "output": args.out, "runs": args.run or [],
                                           "train": _train_overrides(args)})
    spec = validate_job(args.what, config)
    with Store(args.db, must_exist=True) as store:
        for run in config["runs"]:
            store.find_run(run)
        if args.foreground:
            from engine.jobs.runner import refuse_shared_output
            from engine.train.training import run_training

            refuse_shared_output(store, args.what, config)
            result = run_training(store, spec, PrintReporter())
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

    from engine.jobs.runner import JobRunner, job_summary
    from engine.paths import db_exists, db_path
    from engine.store import Store

    action = getattr(args, "action", None)
    if action is None and not db_exists(db_path(args.db)):
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
                from engine.paths import job_log

                log = job_log(store.location, job.log_path)
                if log is None and job.log_path:
                    raise UsageError(f"job {job.id}: its stored log path {job.log_path} is outside the job-log "
                                     "folder; not read")
                if args.tail < 1:
                    raise UsageError(f"--tail {args.tail}: the characters from the end to show (1 or more)")
                try:
                    text = Path(log or "").read_text(encoding="utf-8", errors="replace")
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


def cmd_train_value(args: argparse.Namespace) -> int:
    """A value model from the stored trees' backed-up returns (engine/train/value_model.py), in this process:
    a few epochs over a search's visited steps take seconds to minutes on CPU."""
    from engine.datasets.builds import run_trees
    from engine.datasets.prm import PRMConfig
    from engine.store import Store
    from engine.train.common import default_output_dir, resolve_model_path
    from engine.train.value_model import ValueTrainConfig, train_value_model, value_examples

    config = ValueTrainConfig(epochs=args.epochs, learning_rate=args.lr, num_threads=args.threads,
                              prm=PRMConfig(min_visits=args.min_visits))
    base = resolve_model_path(args.model, log=_log)
    with Store(args.db, must_exist=True) as store:
        runs = [store.find_run(r) for r in args.run] if args.run else [r.id for r in store.runs()]
        refs = [ref for run_id in runs for ref in run_trees(store, run_id)]
    examples = value_examples(refs, config.prm)
    out = args.out or str(default_output_dir("value-model"))
    meta = train_value_model(base, examples, out, config)
    losses = [h["loss"] for h in meta.get("history", [])]
    print(f"value model: {meta['examples']} visited steps ({meta['visits']} visits) from {len(refs)} trees of "
          f"{len(runs)} run(s); loss {losses[0]:.4f} -> {losses[-1]:.4f}; saved to {out} "
          f"(use it: orchard search --value-model {out}, orchard eval --mode mcts --value-model {out})")
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `train` and `jobs` on the CLI's top-level subparsers."""
    from engine.train.dpo import DPOTrainConfig
    from engine.train.sft import SFTTrainConfig

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
        config_cls = DPOTrainConfig if what == "dpo" else SFTTrainConfig
        p.add_argument("--status", help=default_help(config_cls, "statuses"))
        add_flags(p, config_cls, DPO_FLAGS if what == "dpo" else SFT_FLAGS)
        p.add_argument("--device", help="cpu | cuda:0 ... (default: cuda:0 if available, else cpu)")
        p.add_argument("--wait", action="store_true", help="follow the job until it ends")
        p.add_argument("--foreground", action="store_true", help="train in this process instead of a job")
        if what == "dpo":
            p.add_argument("--trajectory", action="store_true", help="trajectory-level DPO (baseline)")
        else:
            p.add_argument("--kind", help="sample kinds (default revision,good; rft: rft)")
        p.set_defaults(func=cmd_train)
    v = tsub.add_parser("value", parents=[common], help="a value model from the trees' backed-up returns (the "
                                                         "search's learned critic), trained in this process")
    v.add_argument("--model", required=True, help="tiny | PATH | hf:PATH (the policy whose weights it starts from)")
    v.add_argument("--run", action="append", help="only trees of this run (repeatable; default: all runs)")
    v.add_argument("--out", help="output folder (default: data/models/trained/value-model)")
    v.add_argument("--epochs", type=int, default=4)
    v.add_argument("--lr", type=float, default=1e-4)
    v.add_argument("--threads", type=int, default=2)
    v.add_argument("--min-visits", dest="min_visits", type=int, default=1,
                   help="leave out paths through a step visited fewer times")
    v.set_defaults(func=cmd_train_value)

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
