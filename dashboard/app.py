"""Orchard dashboard: `streamlit run dashboard/app.py` (database: $ORCHARD_DB, else the engine default).

The entry point only registers pages, checks that the database can be shown and says who is here
(dashboard.auth: a login, or the single local user on loopback when no users exist); each page reads
through `dashboard.data` (the engine's Store API). The Data pages write curation decisions through
the Store's versioned curation calls, recorded under the logged-in user; Training launches jobs
(maintainers only).
"""

from __future__ import annotations

import streamlit as st

from dashboard import auth, data

st.set_page_config(page_title="Orchard", page_icon="🌳", layout="wide")

# One section per stage of the data flow.
PAGES: dict[str, list[st.Page]] = {
    "Search": [
        st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", default=True),
        st.Page("views/tree_explorer.py", title="Tree explorer", icon=":material/account_tree:", url_path="tree"),
    ],
    "Data": [
        st.Page("views/trajectories.py", title="Trajectories", icon=":material/alt_route:",
                url_path="trajectories"),
        st.Page("views/pairs.py", title="Preference pairs", icon=":material/compare_arrows:",
                url_path="pairs"),
        st.Page("views/refinement.py", title="Refinement data", icon=":material/edit_note:",
                url_path="refinement"),
        st.Page("views/review.py", title="Review queue", icon=":material/group:", url_path="review"),
    ],
    "Models": [
        st.Page("views/training.py", title="Training", icon=":material/model_training:", url_path="training"),
        st.Page("views/evaluation.py", title="Evaluation", icon=":material/leaderboard:", url_path="evaluation"),
    ],
}
CURATION_PAGES = {p.url_path for p in PAGES["Data"]}
RUNLESS_PAGES = {"refinement", "training", "evaluation", "review"}  # their data can exist before any search run
LAUNCH_PAGES = {""}  # the Runs page (default): it starts the first search, so it opens on an empty database

page = st.navigation(PAGES)
path = data.db_path()
problem = data.db_problem(path, need_runs=page.url_path not in RUNLESS_PAGES)
if problem is not None and not (problem[0] == "empty" and page.url_path in LAUNCH_PAGES):
    kind, message = problem
    if kind == "empty":
        st.info(message)
    else:
        # The message names the file and may quote the file's own contents: shown as text.
        st.error("This database cannot be opened by Orchard.")
        st.code(message, language=None, wrap_lines=True)
    st.caption("Database (set `ORCHARD_DB` to choose another):")
    st.code(data.shown_db(path), language=None)
    st.stop()

viewer = auth.sidebar(str(path))
if viewer is not None and viewer.local and page.url_path in CURATION_PAGES:
    # The single local user (no users, loopback only): the name recorded in every history entry,
    # kept for the whole session across pages. With users, the recorded name is the login's.
    st.sidebar.text_input("Your name", key="who", placeholder="anonymous", persist_state="session",
                          help="Recorded with every decision you make on these pages (empty: anonymous).")

data.store_errors_shown(page.run)()  # a row the store cannot read: one line, no traceback (fragments: their own)
