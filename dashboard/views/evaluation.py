"""Evaluation: success, progress and loop rate (and recovery score where measured) per model and per
iteration of a training loop, each with its bootstrap interval over tasks.

Why intervals everywhere: on a few dozen held-out tasks, a difference of a few points between two
models is usually noise; the page shows the interval next to every figure so nobody reads a gain
into overlapping bars. Everything here is read from the store (`orchard eval`, evaluation jobs and
`orchard iterate` write it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import data, figures
from engine.store import Store

path = data.db_path()
st.title("Evaluation")


@st.cache_data(show_spinner=False, max_entries=8)
def read(path: str, version: tuple[int, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with Store(path, readonly=True) as store:
        return store.evaluations(), store.iterations()


def model_label(model: str) -> str:
    """A short name: 'tiny', or the model folder's name."""
    return model if model == "tiny" or "/" not in model else Path(model).name


def interval(m: Any) -> str:
    if not isinstance(m, dict) or not isinstance(m.get("mean"), int | float) or math.isnan(m["mean"]):
        return "—"
    return f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


evaluations, iterations = read(str(path), data.db_version(path))
if not evaluations:
    st.info("No evaluations yet: run `orchard eval --model tiny --tasks test --mode greedy`, or "
            "`orchard iterate`, then reload.")
    st.stop()

left, mid, right = st.columns(3)
envs = sorted({e["env"] for e in evaluations})
env = left.selectbox("Environment", envs, key="ev_env")
splits = sorted({e["split"] for e in evaluations if e["env"] == env})
split = mid.selectbox("Split", splits, index=splits.index("test") if "test" in splits else 0, key="ev_split")
metric = right.selectbox("Metric", [k for k, _ in figures.EVAL_METRICS], key="ev_metric",
                         format_func=lambda k: dict(figures.EVAL_METRICS)[k])
chosen = [e for e in evaluations if e["env"] == env and e["split"] == split]

rows = []
for e in chosen:
    m = e["metrics"]
    rows.append({"label": f"{model_label(e['model'])} · {e['id'][:6]}", "mode": e["mode"],
                 **{k: m.get(k) for k, _ in figures.EVAL_METRICS}})
if any(isinstance(r.get(metric), dict) for r in rows):
    st.plotly_chart(figures.eval_figure(rows, metric), key="ev_chart", config={"displayModeBar": False})
else:
    st.caption(f"No evaluation here measured {dict(figures.EVAL_METRICS)[metric]}.")

st.dataframe(pd.DataFrame([{
    "id": e["id"], "model": model_label(e["model"]), "mode": e["mode"], "tasks": len(e["task_ids"]),
    "episodes": e["metrics"].get("episodes"),
    **{label: interval(e["metrics"].get(key)) for key, label in figures.EVAL_METRICS},
    "created": pd.Timestamp(e["created_at"], unit="s").floor("s"), "path": e["model"],
} for e in reversed(chosen)]), hide_index=True, key="ev_table")
st.caption("Each figure: mean [low, high] of a bootstrap interval resampling tasks.")

# --- training loops ---------------------------------------------------------------------------------------

loops: dict[str, list[dict[str, Any]]] = {}
for it in iterations:
    loops.setdefault(it["loop_id"], []).append(it)
if loops:
    st.subheader("Training loops")
    loop_id = st.selectbox("Loop", list(reversed(loops)), key="ev_loop",
                           format_func=lambda i: f"{loops[i][0]['method']} · {i} · {len(loops[i])} records")
    its = sorted(loops[loop_id], key=lambda r: r["idx"])
    scored = [{"label": f"iteration {r['idx']}" if r["idx"] else "base", "mode": "held-out",
               **{k: (r.get("eval") or {}).get(k) for k, _ in figures.EVAL_METRICS}} for r in its]
    if any(isinstance(r.get(metric), dict) for r in scored):
        st.plotly_chart(figures.eval_figure(scored, metric), key="ev_loop_chart", config={"displayModeBar": False})
    st.dataframe(pd.DataFrame([{
        "iteration": r["idx"], "model": model_label(str(r.get("model", ""))),
        **{label: interval((r.get("eval") or {}).get(key)) for key, label in figures.EVAL_METRICS[:3]},
        "note": r.get("skipped", ""), "seconds": r.get("seconds"),
    } for r in its]), hide_index=True, key="ev_loop_table")
