"""Launch forms: settings read from a config dataclass, and bad input told at its field.

WHY at the field: a form's submission is checked field by field (the same checks the job repeats);
the messages are kept in session state and the page reruns, so each one is drawn just below its
field and nothing is queued or written. Messages quote user input or an exception: Markdown-safe
through `md()`.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard.text import md


def refusal(e: Exception) -> str:
    """An exception from a job submission as one Markdown-safe line; a refused server reply is told
    by its status and length only (`brief`, engine.envs.base.RemoteReplyError), never quoted."""
    return md(" ".join(str(getattr(e, "brief", None) or e).split()))


def refused(db: str, action: str = "launch_jobs") -> str | None:
    """At a submission, BEFORE its fields are checked: why the person on screen may not submit (one
    Markdown-safe line), or None. WHY first: the checks probe the network and the file system (an
    env's or a model's server, a Ray head, a model folder); run for anyone, they would let a visitor
    make this machine send requests, scan ports and test which files exist (docs/decisions.md)."""
    from dashboard.auth import NotAllowed, require

    try:
        require(db, action)
    except NotAllowed as e:
        return refusal(e)
    return None


def submit_errors() -> tuple[type[Exception], ...]:
    """The errors a submission can raise for bad input (shown at a field or under the form)."""
    from dashboard.auth import NotAllowed
    from engine.errors import user_errors

    return (*user_errors(), NotAllowed, OSError)


def form_errors(key: str) -> dict[str, str]:
    """The field messages of form `key` from its last submission (kept across the rerun that shows them)."""
    return st.session_state.setdefault(f"{key}_errors", {})


def field_error(key: str, field: str) -> None:
    """The message for `field` of form `key`, drawn where it is called (just below the field)."""
    message = form_errors(key).get(field)
    if message:
        st.error(message)


def set_errors(key: str, errors: dict[str, str]) -> None:
    st.session_state[f"{key}_errors"] = dict(errors)


def config_value(cls: type, name: str, value: Any) -> str | None:
    """None when `value` is a valid setting `name` of config dataclass `cls`, else why not (Markdown-safe)."""
    from engine.config import from_dict

    try:
        from_dict(cls, {name: value}, where="setting")
    except (ValueError, TypeError) as e:
        return refusal(e)
    return None


def settings_inputs(cls: type, form: str, prefix: str, columns: int = 4, defaults: dict[str, Any] | None = None,
                    helps: dict[str, str] | None = None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """One input per field of config dataclass `cls` (its default, its help from the source), each
    with its message from the last submission of `form`; returns {field: value}."""
    from engine.config import config_fields

    values: dict[str, Any] = {}
    cols = st.columns(columns)
    rows = [r for r in config_fields(cls) if r[0] not in skip]
    for i, (name, default, help_text) in enumerate(rows):
        default = (defaults or {}).get(name, default)
        help_text = (helps or {}).get(name, help_text)
        with cols[i % columns]:
            key, label = f"{prefix}{name}", name.replace("_", " ")
            tip = f"{help_text} (default {default})" if help_text else f"default {default}"
            if isinstance(default, bool):
                values[name] = st.checkbox(label, value=default, key=key, help=tip)
            elif isinstance(default, int):
                values[name] = st.number_input(label, value=default, step=1, key=key, help=tip)
            elif isinstance(default, float):
                values[name] = st.number_input(label, value=default, step=0.05, format="%g", key=key, help=tip)
            elif isinstance(default, tuple):
                text = st.text_input(label, value=",".join(map(str, default)), key=key, help=f"{tip}; comma-separated")
                values[name] = _tuple(text)
            else:
                values[name] = st.text_input(label, value=str(default), key=key, help=tip)
            field_error(form, name)
    return values


def _tuple(text: str) -> tuple[Any, ...] | str:
    """'0,1,2' -> (0, 1, 2); text that is not a list of numbers stays text (and is refused as a setting)."""
    try:
        return tuple(int(p) if p.strip().lstrip("-").isdigit() else float(p) for p in text.split(",") if p.strip())
    except ValueError:
        return text


def changed(cls: type[Any], values: dict[str, Any]) -> dict[str, Any]:
    """The settings that differ from the dataclass's defaults (what a job config needs to carry)."""
    fields = cls.__dataclass_fields__
    return {k: v for k, v in values.items() if k in fields and v != fields[k].default}


def check_settings(cls: type[Any], values: dict[str, Any]) -> dict[str, str]:
    """{field: why} for every value that is not a valid setting of `cls`."""
    fields = cls.__dataclass_fields__
    out = {k: why for k, v in values.items() if (why := config_value(cls, k, v))}
    for k, v in values.items():
        if isinstance(fields[k].default, tuple) and not isinstance(v, tuple):
            out[k] = md(f"{k}: expected comma-separated numbers, got {v!r}")
    return out


def check_target(problems: dict[str, str], spec: str, select: Any, model: str) -> None:
    """A launch form's env spec, task selection (`select()`, which raises EnvError naming the tasks
    or the env) and model, each problem put at its field (env, tasks, model)."""
    from engine.envs.base import EnvError
    from engine.envs.registry import env_factory
    from engine.llm.registry import check_model

    try:
        env_factory(spec)
    except submit_errors() as e:
        problems["env"] = refusal(e)
    else:
        try:
            select()
        except EnvError as e:
            problems["tasks" if "task" in str(e) else "env"] = refusal(e)
        except submit_errors() as e:
            problems["env"] = refusal(e)
    try:
        check_model(model)
    except submit_errors() as e:
        problems["model"] = refusal(e)
