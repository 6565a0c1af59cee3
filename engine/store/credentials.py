"""The secrets in a database location, in every form libpq accepts, hidden or taken out.

WHY one module: a PostgreSQL password can sit in a URL's userinfo (`postgresql://u:PW@h/db`), in
its query (`?password=PW`, `?sslpassword=PW`, the key percent-encoded or not) or in a key=value
conninfo string (`host=h password=PW`, `password='a b'`); every message, page and log line that
names a store goes through `redact`, and a job worker gets the secrets through its environment
(`worker_secrets`), never on its command line where `ps` shows them (docs/decisions.md).
"""

from __future__ import annotations

import re
import urllib.parse

URL_SCHEMES = ("postgresql://", "postgres://")
SECRET_KEYS = ("password", "sslpassword")
MASK = "***"
# The environment variable a worker reads each secret from: libpq reads $PGPASSWORD itself; it has
# none for the key's passphrase, which engine.store.postgres passes to the connection.
SECRET_ENV = {"password": "PGPASSWORD", "sslpassword": "ORCHARD_PGSSLPASSWORD"}
# key = value in a conninfo string: the value quoted ('...' with \' and \\ escapes) or up to a space.
_CONNINFO = re.compile(r"\b(password|sslpassword)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*|(?=\s|$))", re.IGNORECASE)
_USERINFO = re.compile(r"(://[^/@:?#]*:)[^/?#]*@")


def _is_url(text: str) -> bool:
    return text.startswith(URL_SCHEMES)


def _split_url(url: str) -> tuple[str, dict[str, str]]:
    """(the URL without any secret, {key: secret}); the userinfo password is "password"."""
    parts = urllib.parse.urlsplit(url)
    found: dict[str, str] = {}
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            user, password = user.split(":", 1)
            found["password"] = urllib.parse.unquote(password)
            netloc = f"{user}@{host}"
    kept = []
    for item in filter(None, parts.query.split("&")):
        key, _, value = item.partition("=")
        name = urllib.parse.unquote_plus(key).strip().lower()
        if name in SECRET_KEYS:
            found[name] = urllib.parse.unquote_plus(value)  # the query's wins, as in libpq
        else:
            kept.append(item)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query="&".join(kept))), found


def _unquote_conninfo(value: str) -> str:
    if value.startswith("'") and value.endswith("'") and len(value) >= 2:
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def secrets(location: object) -> dict[str, str]:
    """{key: secret} of a location (a URL or conninfo string; a file path has none)."""
    text = str(location)
    if _is_url(text):
        try:
            return _split_url(text)[1]
        except ValueError:
            return {}
    return {m.group(1).lower(): _unquote_conninfo(m.group(3)) for m in _CONNINFO.finditer(text) if m.group(3)}


def redact(location: object) -> str:
    """The location with every secret replaced by `***` (what messages, pages and logs show)."""
    text = str(location)
    if _is_url(text):
        try:
            found = _split_url(text)[1]
        except ValueError:  # not parseable as a URL: mask what looks like userinfo and query secrets
            return _CONNINFO.sub(lambda m: m.group(1) + m.group(2) + MASK, _USERINFO.sub(rf"\g<1>{MASK}@", text))
        if not found:
            return text
        parts = urllib.parse.urlsplit(text)
        netloc = parts.netloc
        if "@" in netloc and ":" in netloc.rsplit("@", 1)[0]:
            user, host = netloc.rsplit("@", 1)
            netloc = f"{user.split(':', 1)[0]}:{MASK}@{host}"
        query = "&".join(f"{item.partition('=')[0]}={MASK}"
                         if urllib.parse.unquote_plus(item.partition("=")[0]).strip().lower() in SECRET_KEYS else item
                         for item in filter(None, parts.query.split("&")))
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
    return _CONNINFO.sub(lambda m: m.group(1) + m.group(2) + (MASK if m.group(3) else ""), text)


def scrub(text: str, location: object) -> str:
    """`text` (an error message) with every secret of `location` masked, raw and percent-encoded."""
    for secret in secrets(location).values():
        if secret:
            for form in {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}:
                text = text.replace(form, MASK)
    return text


def worker_secrets(url: str) -> tuple[str, dict[str, str]]:
    """(the URL without its secrets, the environment that carries them): a job worker's command line
    names the store, its environment holds the password ($PGPASSWORD, which libpq reads)."""
    plain, found = _split_url(url)
    return plain, {SECRET_ENV[key]: value for key, value in found.items()}
