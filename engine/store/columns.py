"""One column list per table: the columns the store's record reads SELECT, and the names each row is
mapped by (docs/decisions.md, "Store rows by name").

Rows stay the drivers' plain tuples (SQLite's and the PostgreSQL shim's are the same); a reader zips
a row with the list it selected (`named`), so a record is built from `row["depth"]`, never from
`row[2]`: a column added to a list, or a list reordered, cannot shift another field's value.
tests/test_architecture.py checks every list against the schema's own columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# table -> the columns read into its record (every SELECT that builds one names this list)
RUNS = ("id", "name", "env", "model", "config", "task_ids", "status", "created_at", "updated_at", "stats")
TREES = ("id", "run_id", "position", "task_id", "goal", "context", "split", "simulations", "solved")
# A node as load_tree / load_nodes build it: its own columns less the observation's hash (its text
# comes from `observations`, joined in as `observation`).
NODES = ("node_id", "parent_id", "depth", "action", "raw", "format_error", "n", "value_sum", "q_critic",
         "critic_rank", "critic_reason", "logprob", "reward", "progress", "terminal", "gen_ms", "env_ms",
         "n_tokens", "author")
# What drawing a tree needs (NodeRows, engine/tree_columns.py): numbers, no texts.
NODE_SKELETON = ("node_id", "parent_id", "depth", "n", "value_sum", "q_critic", "critic_rank", "terminal")
SIMULATIONS = ("path", "reward", "rollout")
PAIRS = ("id", "kind", "run_id", "tree_id", "task_id", "node_id", "chosen_node", "rejected_node", "prompt", "chosen",
         "rejected", "q_chosen", "q_rejected", "logprob_chosen", "logprob_rejected", "depth", "status", "version",
         "updated_at", "updated_by", "merge_key")
# What a rebuild compares with what it builds (save_pairs), in `content()`'s order.
PAIR_CONTENT = ("tree_id", "task_id", "node_id", "chosen_node", "rejected_node", "kind", "prompt", "chosen",
                "rejected", "q_chosen", "q_rejected", "logprob_chosen", "logprob_rejected", "depth")
SAMPLES = ("id", "kind", "run_id", "source", "data", "status", "version", "updated_at", "updated_by")
SAMPLE_CONTENT = ("kind", "run_id", "task_id", "source", "data")
JOBS = ("id", "kind", "name", "config", "state", "device", "pid", "created_at", "started_at", "finished_at",
        "heartbeat_at", "progress", "log_path", "output_path", "error", "cancel_requested")
MODELS = ("path", "name", "kind", "parent", "job_id", "data_ids", "config", "metrics", "created_at", "replaced_at",
          "replaced_by")
EVALUATIONS = ("id", "model", "env", "split", "task_ids", "mode", "config", "metrics", "job_id", "created_at")
ITERATIONS = ("loop_id", "idx", "method", "data", "created_at")
USERS = ("name", "role", "created_at")  # the password hash is read alone (UsersStore.password_hash)
LEASES = ("holder", "taken_at", "expires_at")
DECISIONS = ("id", "item_kind", "item_id", "run_id", "who", "role", "label", "item_version", "at")

# What each INSERT writes, in its values' order (the whole row of these tables).
RUN_ROW = RUNS
SIMULATION_ROW = ("tree_id", "idx", "path", "reward", "rollout", "created_at")
OBSERVATION_ROW = ("hash", "text")
NODE_MEDIA_ROW = ("tree_id", "node_id", "kind", "data")
JOB_METRIC_ROW = ("job_id", "seq", "step", "at", "data")
EVALUATION_ROW = ("id", "model", "env", "split", "task_ids", "mode", "config", "metrics", "episodes", "job_id",
                  "created_at")
ITERATION_ROW = ITERATIONS
HISTORY_ROW = ("version", "at", "who", "action", "before", "after")  # after the pair_id / sample_id
SAMPLE_ROW = ("id", "kind", "run_id", "task_id", "source", "data", "status", "version", "updated_at", "updated_by")

# The lists above by table, for the check against the schema (tests/test_architecture.py).
BY_TABLE: dict[str, tuple[tuple[str, ...], ...]] = {
    "runs": (RUNS,), "trees": (TREES,), "nodes": (NODES, NODE_SKELETON), "simulations": (SIMULATIONS,),
    "pairs": (PAIRS, PAIR_CONTENT), "samples": (SAMPLES, SAMPLE_CONTENT), "jobs": (JOBS,), "models": (MODELS,),
    "evaluations": (EVALUATIONS + ("episodes",),), "iterations": (ITERATIONS,), "users": (USERS,),
    "leases": (LEASES,), "decisions": (DECISIONS,),
    "observations": (OBSERVATION_ROW,), "node_media": (NODE_MEDIA_ROW,), "job_metrics": (JOB_METRIC_ROW,),
    "pair_history": (("pair_id", *HISTORY_ROW),), "sample_history": (("sample_id", *HISTORY_ROW),),
}
BY_TABLE["simulations"] += (SIMULATION_ROW,)
BY_TABLE["evaluations"] += (EVALUATION_ROW,)
BY_TABLE["samples"] += (SAMPLE_ROW,)


def insert(table: str, columns: Sequence[str], verb: str = "INSERT", values: str = "") -> str:
    """`VERB INTO table (columns) VALUES (?, ...)`: an INSERT that names what it writes, so it cannot
    write a value into the wrong column when a table gains one. `values`: the VALUES list when it is not
    all placeholders."""
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({values or ','.join('?' * len(columns))})"


def select(columns: Sequence[str], alias: str = "") -> str:
    """`columns` as a SELECT list (`a.x, a.y` with an alias)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + c for c in columns)


def named(columns: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    """A row read with SELECT `columns` (and nothing after them), by column name."""
    return dict(zip(columns, row, strict=True))
