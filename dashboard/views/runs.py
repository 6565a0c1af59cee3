"""Runs: every search run in the database with its key settings; pick one to explore its trees."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data

TREE_PAGE = "views/tree_explorer.py"

st.title("Runs")

path = data.db_path()
runs = list(reversed(data.list_runs(str(path), data.db_version(path))))  # newest first

rows = []
for r in runs:
    cfg = r.config
    rows.append({
        "id": r.id,
        "name": r.name,
        "env": r.env,
        "model": r.model,
        "status": r.status,
        "trees": r.trees,
        "solved": r.solved,
        "success rate": r.solved / r.trees if r.trees else None,
        "simulations": r.simulations,
        "nodes": r.nodes,
        "created": pd.Timestamp(r.created_at, unit="s").floor("s"),
        "k": cfg.get("k"),
        "sims/task": cfg.get("simulations"),
        "depth": cfg.get("depth_limit"),
        "alpha": cfg.get("alpha"),
    })
table = pd.DataFrame(rows)

st.caption("Select a row to open the run in the Tree explorer.")
event = st.dataframe(
    table,
    hide_index=True,
    key="runs_table",
    on_select="rerun",
    selection_mode="single-row",
    column_config={
        "success rate": st.column_config.ProgressColumn(
            "success rate", help="solved / trees", min_value=0.0, max_value=1.0, format="percent"
        ),
        "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm:ss"),
        "sims/task": st.column_config.NumberColumn("sims/task", help="MCTS simulations per task (T)"),
        "depth": st.column_config.NumberColumn("depth", help="depth limit D"),
        "k": st.column_config.NumberColumn("k", help="candidates sampled per expansion (K)"),
        "alpha": st.column_config.NumberColumn("alpha", help="eq. 10 weight of Q~ against Q^"),
    },
)
if event.selection.rows:
    st.switch_page(TREE_PAGE, query_params={"run": table.iloc[event.selection.rows[0]]["id"]})

# The same choice without the table (keyboard users, and scripted tests).
by_id = {r.id: r for r in runs}
left, right = st.columns([3, 1], vertical_alignment="bottom")
chosen = left.selectbox(
    "Run", list(by_id), format_func=lambda i: f"{by_id[i].name} · {i} · {by_id[i].env}", key="runs_pick"
)
if right.button("Open in Tree explorer", key="runs_open", type="primary", disabled=chosen is None):
    st.switch_page(TREE_PAGE, query_params={"run": chosen})
