"""Orchard dashboard: `streamlit run dashboard/app.py` (database: $ORCHARD_DB, else the engine default).

The entry point only registers pages and checks that the database can be shown; each page reads
through `dashboard.data` (the engine's Store API) and never writes.
"""

from __future__ import annotations

import streamlit as st

from dashboard import data

st.set_page_config(page_title="Orchard", page_icon="🌳", layout="wide")

# One section per stage of the data flow. Later stages (Trajectories, Preference pairs, Refinement
# data, Training, Evaluation) add their page files here when their engine parts exist.
PAGES: dict[str, list[st.Page]] = {
    "Search": [
        st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", default=True),
        st.Page("views/tree_explorer.py", title="Tree explorer", icon=":material/account_tree:", url_path="tree"),
    ],
}

page = st.navigation(PAGES)

path = data.db_path()
problem = data.db_problem(path)
if problem is not None:
    kind, message = problem
    if kind == "empty":
        st.info(message)
    else:
        # The message names the file and may quote the file's own contents: shown as text.
        st.error("This database cannot be opened by Orchard.")
        st.code(message, language=None, wrap_lines=True)
    st.caption("Database (set `ORCHARD_DB` to choose another):")
    st.code(str(path), language=None)
    st.stop()

page.run()
