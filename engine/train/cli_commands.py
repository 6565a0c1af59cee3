"""`orchard train dpo|sft|rft`, `orchard jobs [cancel|show|log]`, `orchard eval`, `orchard iterate`.

Wired into engine/cli.py by `add_parsers(sub, common)`. Only argparse is imported at start-up.
Training runs as a job in its own process by default (the command prints the job id and returns;
`--wait` follows it to the end, `--foreground` trains in this process instead). `eval` and
`iterate` run in this process by default (`--job` queues them instead). User errors raise
ConfigError / StoreError / TrainError (ValueError) / EnvError / GeneratorError: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from engine.config import read_table


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _list(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _int(text: str, flag: str) -> int:
    from engine.config import ConfigError

    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not an integer") from None


class _PrintReporter:
    """A Reporter for foreground commands: log lines and a progress line on stderr."""

    def __init__(self) -> None:
        self._last = 0.0

    def progress(self, data: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last >= 2.0 or data.get("step") == data.get("total"):
            self._last = now
            eta = f", ETA {data['eta_s']:.0f}s" if data.get("eta_s") is not None else ""
            _log(f"{data.get('phase', '')} {data.get('step', 0)}/{data.get('total', '?')}{eta}")

    def metrics(self, step: int, data: dict[str, Any]) -> None:
        keys = [k for k in ("loss", "rewards/margins", "rewards/accuracies", "mean_token_accuracy") if k in data]
        if keys:
            _log(f"step {step}: " + ", ".join(f"{k}={data[k]:.4g}" for k in keys))

    def should_stop(self) -> bool:
        return False

    def log(self, message: str) -> None:
        _log(message)


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
    from engine.train.jobs import JobRunner, train_config, validate_job

    config = {"model": args.model, "output": args.out, "runs": args.run or [], "train": _train_overrides(args)}
    validate_job(args.what, config)
    with Store(args.db, must_exist=True) as store:
        for run in config["runs"]:
            store.find_run(run)
        if args.foreground:
            from engine.train.common import default_output_dir, resolve_model_path
            from engine.train.worker import _register_model

            reporter = _PrintReporter()
            train = train_config(args.what, config["train"])
            base = resolve_model_path(args.model, log=_log)
            out = args.out or str(default_output_dir(f"{args.what}-{time.strftime('%Y%m%d-%H%M%S')}"))
            if args.what == "dpo":
                from engine.train.dpo import select_pairs, train_dpo

                pairs = select_pairs(store, train, config["runs"])
                tokens = store.node_token_counts([(p.tree_id, n) for p in pairs for n in (p.chosen_node, p.rejected_node)])
                result = train_dpo(base, pairs, train, out, reporter, node_tokens=tokens)
            else:
                from engine.train.sft import select_samples, train_sft

                result = train_sft(base, select_samples(store, train, config["runs"]), train, out, reporter,
                                   kind=args.what)
            job = store.create_job(args.what, config, train.device, name=f"{args.what}-foreground")
            store.finish_job(job.id, "succeeded", output_path=str(result.output), expect=("queued",))
            _register_model(store, store.job(job.id), result, str(base))
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

    from engine.store import Store, default_db_path
    from engine.train.jobs import JobRunner, job_summary

    action = getattr(args, "action", None)
    if action is None and not Path(args.db or default_db_path()).exists():
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


# ------------------------------------------------------------------ eval


def run_eval(store: Any, cfg: dict[str, Any], log: Any = _log, job_id: str | None = None,
             selection: tuple[str, Any, str, list[Any]] | None = None) -> str:
    """Evaluate per an eval job config; returns the evaluation id. `selection`: `eval_tasks(cfg)`
    when the caller has it already."""
    from engine.evaluate import evaluate_and_store, format_metrics, recovery_starts
    from engine.llm.registry import load_generator
    from engine.train.jobs import eval_config

    config = eval_config(cfg.get("eval") or {})
    env_spec, make_env, split, tasks = selection or eval_tasks(cfg)
    recovery = []
    for run in cfg.get("recovery_runs") or []:
        recovery.extend(recovery_starts(store.samples(run_id=store.find_run(run), kind="recovery")))
    generator = load_generator(cfg["model"], log=log)
    result = evaluate_and_store(store, generator, env_spec, split, tasks, config, recovery=recovery,
                                model=cfg["model"], job_id=job_id, make_env=make_env)
    log(f"evaluation {result.eval_id}: {cfg['model']} on {len(tasks)} {split} tasks, mode {config.mode}\n"
        + format_metrics(result.metrics))
    return str(result.eval_id)


def eval_tasks(cfg: dict[str, Any]) -> tuple[str, Any, str, list[Any]]:
    """(env spec, env factory, split, tasks) of an eval job config; EnvError for a bad selection."""
    from engine.envs.registry import env_factory, select_tasks

    env_spec = cfg.get("env") or "textcraft"
    make_env = env_factory(env_spec)
    env = make_env()
    split, tasks_spec = cfg.get("split") or "test", cfg.get("tasks") or ""
    if tasks_spec in ("train", "test"):
        split, tasks_spec = tasks_spec, ""
    tasks = select_tasks(env, tasks_spec, split) if tasks_spec else env.tasks(split)
    return env_spec, make_env, split, tasks


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.store import Store
    from engine.train.jobs import JobRunner, validate_job

    ev: dict[str, Any] = {"mode": args.mode, "max_steps": args.max_steps, "max_tokens": args.max_tokens}
    if args.seeds:
        ev["seeds"] = [_int(s, "--seeds") for s in _list(args.seeds)]
    if args.temperature is not None:
        ev["temperature"] = args.temperature
    if args.simulations is not None:
        ev["mcts_simulations"] = args.simulations
    if args.backup is not None:
        ev["mcts_backup"] = args.backup
    if args.format_errors is not None:
        ev["format_errors"] = args.format_errors
    cfg = {"model": args.model, "env": args.env, "split": args.split, "tasks": args.tasks, "eval": ev,
           "recovery_runs": args.recovery_run or []}
    validate_job("eval", cfg)
    selection = eval_tasks(cfg)  # a bad env or task selection is refused before the store opens
    with Store(args.db, must_exist=bool(cfg["recovery_runs"])) as store:
        if args.job:
            job = JobRunner(store).submit("eval", cfg, device=args.device)
            print(f"job {job.id} (eval) {job.state}; log {job.log_path}")
            return 0
        eval_id = run_eval(store, cfg, selection=selection)
        row = next(e for e in store.evaluations(model=args.model) if e["id"] == eval_id)
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        from engine.evaluate import format_metrics

        print(f"evaluation {eval_id} ({args.mode})\n{format_metrics(row['metrics'])}")
    return 0


# ------------------------------------------------------------------ iterate


def cmd_iterate(args: argparse.Namespace) -> int:
    from engine.envs.registry import env_factory
    from engine.store import Store
    from engine.train.iterate import IterateConfig, loop_tasks, run_loop
    from engine.train.jobs import JobRunner

    data: dict[str, Any] = dict(read_table(args.config, "iterate")) if args.config else {}
    flags = {"method": args.method, "model": args.model, "env": args.env, "iterations": args.iterations,
             "tasks_per_iteration": args.tasks_per_iteration, "eval_tasks": args.eval_tasks, "seed": args.seed,
             "name": args.name}
    data.update({k: v for k, v in flags.items() if v is not None})
    config = IterateConfig.from_dict(data)
    loop_tasks(config, env_factory(config.env)())  # a bad task selection is refused before the store opens
    with Store(args.db) as store:
        if args.job:
            from dataclasses import asdict

            job = JobRunner(store).submit("iterate", {"iterate": asdict(config)}, device=args.device)
            print(f"job {job.id} (iterate) {job.state}; log {job.log_path}")
            return 0
        loop_id = run_loop(store, config, reporter=_PrintReporter())
        rows = store.iterations(loop_id)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for r in rows:
        ev = r.get("eval") or {}
        s = ev.get("success", {})
        score = f"success {s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]" if s else r.get("skipped", "")
        print(f"{loop_id} iteration {r['idx']}: {r.get('model', '')} {score}")
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

    e = sub.add_parser("eval", parents=[common], help="evaluate a model on held-out tasks")
    e.add_argument("--model", required=True, help="tiny | PATH | hf:PATH | openai:URL#MODEL | vllm:PATH")
    e.add_argument("--env", default="textcraft")
    e.add_argument("--tasks", default="", help="a range/ids within --split, or test | train for the whole split "
                                               "(default: every task of --split)")
    e.add_argument("--split", default="test")
    e.add_argument("--mode", choices=("greedy", "sampled", "mcts"), default="greedy")
    e.add_argument("--seeds", help="episodes per task for sampled/mcts, e.g. 0,1,2 (default 0)")
    e.add_argument("--temperature", type=float, help="sampled mode temperature (default 1.0)")
    e.add_argument("--simulations", type=int, help="mcts mode: simulations per real step (default 8)")
    e.add_argument("--backup", choices=("reward", "progress"),
                   help="mcts mode: value backed up, the terminal reward (default) or max(reward, latched progress)")
    e.add_argument("--max-steps", dest="max_steps", type=int, default=15)
    e.add_argument("--format-errors", dest="format_errors", choices=("terminal", "observe"),
                   help="an unreadable action ends the episode (terminal, default) or is answered with an "
                        "error observation and the episode goes on (observe, as AgentGym servers do)")
    e.add_argument("--max-tokens", dest="max_tokens", type=int, default=256, help="tokens per action (default 256)")
    e.add_argument("--recovery-run", dest="recovery_run", action="append",
                   help="also score recovery from this run's recovery prefixes (repeatable)")
    e.add_argument("--json", action="store_true")
    e.add_argument("--job", action="store_true", help="queue as a background job instead")
    e.add_argument("--device", help="job device (with --job)")
    e.set_defaults(func=cmd_eval)

    it = sub.add_parser("iterate", parents=[common],
                        help="iterated training: search -> data -> train -> evaluate (Agent Q or Agent-R)")
    it.add_argument("--method", choices=("agentq", "agentr"))
    it.add_argument("--model", help="starting policy (default tiny)")
    it.add_argument("--env")
    it.add_argument("--iterations", type=int)
    it.add_argument("--tasks-per-iteration", dest="tasks_per_iteration", type=int, help="B train tasks per iteration")
    it.add_argument("--eval-tasks", dest="eval_tasks", help="range/ids in the test split (default all)")
    it.add_argument("--seed", type=int)
    it.add_argument("--name", help="loop id")
    it.add_argument("--config", help="JSON file with IterateConfig fields (search/dpo/sft/eval overrides)")
    it.add_argument("--json", action="store_true")
    it.add_argument("--job", action="store_true", help="queue as a background job instead")
    it.add_argument("--device", help="job device (with --job)")
    it.set_defaults(func=cmd_iterate)
