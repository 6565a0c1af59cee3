"""Who is using the dashboard, and what they may do (roles in engine.auth).

The rule (docs/decisions.md, "Dashboard logins"):
- logged in (a live session token in st.session_state, checked against the store on every run and
  again at every write): that user, with their role; the recorded curator is always that user;
- else, with no users defined AND the server listening on loopback only (Streamlit's
  `server.address`) AND the page opened by a loopback name (its Host header: 127.0.0.1, localhost,
  [::1]; not a rebound name): the single local user, as before logins existed (may do everything;
  the name recorded is the one typed in the sidebar, "anonymous" when empty);
- else nobody: pages can be read (viewer), every write is refused until someone logs in.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from dataclasses import dataclass

import streamlit as st

from dashboard.store import MissingStoreError, Store, StoreError
from dashboard.text import md
from engine import auth

TOKEN = "auth_token"
VIEWER = "auth_viewer"
NOTICE = "auth_notice"


@dataclass(frozen=True)
class Viewer:
    """The person at the dashboard: `local` is the single local user (no login)."""

    name: str
    role: str
    local: bool = False


def is_loopback(address: str | None) -> bool:
    """An empty address means every interface (Streamlit's default): not loopback."""
    if not address:
        return False
    if address.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_only() -> bool:
    return is_loopback(st.get_option("server.address"))


def is_loopback_host(host: str | None) -> bool:
    """Whether a Host header (NAME[:PORT] or [V6][:PORT]) names loopback: localhost, 127.0.0.0/8, [::1].
    Anything else, or anything malformed, is not."""
    if not host:
        return False
    try:
        parts = urllib.parse.urlsplit(f"//{host.strip()}")
        name, _ = parts.hostname, parts.port  # .port checks that a port is a number in range
    except ValueError:
        return False
    if name is None or parts.username is not None or parts.path or parts.query or parts.fragment:
        return False
    return is_loopback(name)


def session_host() -> str | None:
    """The Host header of this session's browser request; None where no HTTP request is behind the
    session (AppTest, bare mode): no browser there, so no page of another origin either."""
    headers = st.context.headers
    if not len(headers):
        return None
    return str(headers.get("Host") or "")


def loopback_session() -> bool:
    """Whether the page was opened by a loopback name. WHY: with DNS rebinding a page of another
    origin (its name re-resolved to 127.0.0.1) reaches a loopback-bound dashboard; its Host header
    is that other name, so it is never the single local user (docs/decisions.md)."""
    host = session_host()
    return host is None or is_loopback_host(host)


def _resolve(db: str) -> Viewer | None:
    token = st.session_state.get(TOKEN)
    try:
        with Store(db, readonly=True) as store:
            user = store.session_user(token) if token else None
            has_users = store.has_users()
    except MissingStoreError:  # no database yet (the first search creates it): no users either
        user, has_users = None, False
    except StoreError:
        return None
    if user is not None:
        return Viewer(user.name, user.role)
    if token:  # expired, ended elsewhere, or the user was removed
        st.session_state.pop(TOKEN, None)
        st.session_state[NOTICE] = "Your session has ended; log in again."
    if not has_users and loopback_only() and loopback_session():
        return Viewer(str(st.session_state.get("who") or "").strip() or "anonymous", "maintainer", local=True)
    return None


def resolve(db: str) -> Viewer | None:
    """Once per run (app.py): who is here now; pages read it with `viewer()`."""
    st.session_state[VIEWER] = _resolve(db)
    return st.session_state[VIEWER]


def viewer() -> Viewer | None:
    return st.session_state.get(VIEWER)


def may(action: str) -> bool:
    """Whether the person on screen may `action` (curate, settle, launch_jobs, manage_users)."""
    v = viewer()
    return v is not None and auth.may(v.role, action)


def acting_as(db: str, action: str) -> str | None:
    """At a write: the name to record, checked against the store again now (a session may have
    expired since the page was drawn), or None with the reason in `refusal()`."""
    v = _resolve(db)
    st.session_state[VIEWER] = v
    if v is None:
        st.session_state[NOTICE] = "Not saved: log in first (writes need a login here)."
        return None
    if not auth.may(v.role, action):
        st.session_state[NOTICE] = f"Not saved: your role ({v.role}) may not {action.replace('_', ' ')}."
        return None
    return v.name


class NotAllowed(Exception):
    """A write the person on screen may not make (no login where one is needed, or the role)."""


def require(db: str, action: str) -> str:
    """`acting_as` for code that submits jobs: the name, or NotAllowed with the reason (the forms
    catch it with the other submission errors and show it under the form)."""
    who = acting_as(db, action)
    if who is None:
        raise NotAllowed(st.session_state.pop(NOTICE, "Not allowed."))
    return who


def why_not(action: str) -> str | None:
    """A short reason the controls for `action` are off, for a caption (None: they are on)."""
    v = viewer()
    if v is None:
        return "Read only: log in (sidebar) to make changes."
    if not auth.may(v.role, action):
        return f"Read only: your role ({v.role}) may not {action.replace('_', ' ')}."
    return None


def _login(db: str) -> None:
    name = str(st.session_state.get("auth_name") or "").strip()
    password = str(st.session_state.get("auth_password") or "")
    st.session_state["auth_password"] = ""
    try:
        client = str(st.context.ip_address or "local")  # the throttle's per-client key (engine.auth)
        with Store(db) as store:
            st.session_state[TOKEN] = auth.login(store, name, password, client=client)
    except StoreError as e:
        st.session_state[NOTICE] = str(e).splitlines()[0]
        return
    st.session_state.pop(NOTICE, None)


def _logout(db: str) -> None:
    token = st.session_state.pop(TOKEN, None)
    if token:
        try:
            with Store(db) as store:
                store.end_session(token)
        except StoreError:
            pass
    st.session_state[VIEWER] = None
    st.session_state[NOTICE] = "Logged out."


def sidebar(db: str) -> Viewer | None:
    """The login form or the signed-in line with Log out; returns `resolve(db)`."""
    v = resolve(db)
    with st.sidebar:
        notice = st.session_state.pop(NOTICE, None)
        if notice:
            st.warning(md(notice))
        if v is not None and not v.local:
            st.caption(f"Logged in as **{md(v.name)}** ({md(v.role)})")
            st.button("Log out", key="auth_logout", on_click=_logout, args=(db,))
        elif v is None:
            with st.form("auth_form", border=True):
                st.text_input("User name", key="auth_name")
                st.text_input("Password", key="auth_password", type="password")
                st.form_submit_button("Log in", on_click=_login, args=(db,))
            if not loopback_only():
                st.caption("This dashboard listens beyond loopback: changes need a login "
                           "(`orchard users add NAME --role R`).")
            elif not loopback_session():
                st.caption(f"Read only: this page was opened as {md(session_host() or '(no host)')}, not as "
                           "127.0.0.1 or localhost; open it at http://127.0.0.1 to make changes, or log in.")
    return v
