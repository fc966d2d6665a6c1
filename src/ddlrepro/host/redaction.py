"""Keep credentials out of everything the workflow writes.

A secret is the value of an environment variable that is a secret by name (tokens, keys, passwords,
credentials: `SECRET_NAME`), or of a variable the configuration names (`redaction.variables`, passed to every job
as the names in `DDLREPRO_REDACT_VARIABLES`), or a value this process made and registered (the elastic config
server's token). Values too short or too common to be secrets are skipped (`plausible_secret`). Every secret is
replaced by a marker however it is written (raw, JSON-, Python-, HTML-, URL- or shell-escaped) in every log line,
JSON file, report and error message ddlrepro writes; the bundle refuses to pack a file that still contains one.
Variables themselves are never recorded.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import markupsafe

SECRET_WORDS = (
    "KEY|KEYS|APIKEY|TOKEN|TOKENS|SECRET|SECRETS|PASSWORD|PASSWORDS|PASSWD|PASS|PASSPHRASE|CREDENTIAL|CREDENTIALS"
    "|AUTH|AUTHORIZATION|BEARER|COOKIE|PAT|CONNECTION_STRING"
)
SECRET_NAME = re.compile(rf"(^|_)({SECRET_WORDS})(_|$)", re.IGNORECASE)
# Variables named like secrets whose values are not: where one is, or a socket, file or folder holding one.
NOT_SECRET_NAME = re.compile(
    r"(_REGION|_PROFILE|_LOCATION|_CA_BUNDLE|_ENDPOINT_URL|_FILE|_PATH|_DIR|_SOCK)$", re.IGNORECASE
)
NAMED_SECRETS_ENV = "DDLREPRO_REDACT_VARIABLES"
VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MIN_SECRET_LENGTH = 8
# Values of 8 characters or more that ordinary output is full of (shorter ones, `true`, `1`, are skipped anyway).
COMMON_VALUES = frozenset({"ddlrepro", "disabled", "localhost"})
MARKER = "[REDACTED]"

_registered: set[str] = set()
_registrations = 0  # changes whenever the registered set does, so holders of secret_values() know to look again


def looks_secret(name: str) -> bool:
    """Whether a variable is a secret by its name."""
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET_NAME.search(name)


def named_secret_variables(environ: Mapping[str, str]) -> set[str]:
    """The extra variable names the configuration declares secret (`DDLREPRO_REDACT_VARIABLES`)."""
    return set(environ.get(NAMED_SECRETS_ENV, "").replace(",", " ").split())


def declare_secret_variables(names: Iterable[str]) -> None:
    """Treat these variables' values as secrets here and in every process started from here (the names travel in
    `DDLREPRO_REDACT_VARIABLES`; a value never does)."""
    names = list(names)
    for index, name in enumerate(names):
        if not VARIABLE_NAME.match(name):  # not echoed: it may be a value, the secret itself
            raise ValueError(f"redaction.variables[{index}]: not an environment variable name")
    known = named_secret_variables(os.environ)
    os.environ[NAMED_SECRETS_ENV] = " ".join(sorted(known | set(names)))


def plausible_secret(value: str) -> bool:
    """False for values too short or too common to be secrets (they would redact ordinary output)."""
    text = value.strip()
    return (
        len(text) >= MIN_SECRET_LENGTH
        and text.lower() not in COMMON_VALUES
        and not _is_number(text)
        and not (os.path.isabs(text) and Path(text).exists())
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def register_secret(value: str) -> None:
    """Treat `value` (made by this process, e.g. a token it hands to workers) as a secret from now on."""
    global _registrations
    if plausible_secret(value):
        _registered.add(value)
        _registrations += 1


def forget_registered() -> None:
    """Forget every registered value (the set lives as long as the process: tests start each from none)."""
    global _registrations
    _registered.clear()
    _registrations += 1


def registrations() -> int:
    """A number that changes whenever a value is registered or the registered values are forgotten."""
    return _registrations


def secret_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Secret values by the variable that holds them (registered values under `<registered>`)."""
    environ = os.environ if environ is None else environ
    named = named_secret_variables(environ)
    found = {
        name: value
        for name, value in environ.items()
        if (looks_secret(name) or name in named) and plausible_secret(value)
    }
    found.update({f"<registered {index}>": value for index, value in enumerate(sorted(_registered))})
    return found


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret value, longest first."""
    return sorted(set(secret_variables(environ).values()), key=len, reverse=True)


def encoded_forms(value: str) -> dict[str, str]:
    """Every way `value` may be written to a file, each with what wrote it."""
    forms = {
        # shlex.quote's inside, which is also what a longer quoted word holding the value contains
        "shell-quoted": value.replace("'", "'\"'\"'"),
        "shell-escaped": re.sub(r"([^\w@%+=:,./-])", r"\\\1", value),
        "Python repr": repr(value)[1:-1],
        "Python ascii": ascii(value)[1:-1],
        "HTML-escaped": html.escape(value),
        "HTML-escaped (Jinja)": str(markupsafe.escape(value)),
    }
    for ensure_ascii in (True, False):
        once = json.dumps(value, ensure_ascii=ensure_ascii)[1:-1]
        forms[f"JSON-escaped (ensure_ascii={ensure_ascii})"] = once
        forms[f"JSON-escaped twice (ensure_ascii={ensure_ascii})"] = json.dumps(once, ensure_ascii=ensure_ascii)[1:-1]
    for safe in ("", "/"):
        forms[f"URL-encoded (safe={safe!r})"] = quote(value, safe=safe)
        forms[f"URL-encoded + (safe={safe!r})"] = quote_plus(value, safe=safe)
    forms["raw"] = value
    return forms


@functools.lru_cache(maxsize=16)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regular expression for every form of every secret, longest first (so no form is half-replaced)."""
    forms = {form for value in secrets for form in encoded_forms(value).values()}
    if not forms:
        return None
    return re.compile("|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True)))


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with every form of every secret value replaced by the marker."""
    pattern = _pattern(tuple(secret_values() if secrets is None else secrets))
    return text if pattern is None else pattern.sub(MARKER, text)


def redact_object(value: Any, secrets: Iterable[str] | None = None) -> Any:
    """A copy of a JSON-like object with every string (keys included) redacted, so that serialising it afterwards
    cannot escape a secret past the redactor."""
    secrets = tuple(secret_values() if secrets is None else secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {redact_object(key, secrets): redact_object(item, secrets) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [redact_object(item, secrets) for item in value]
    return value


def find_secret(data: bytes, environ: Mapping[str, str] | None = None) -> str | None:
    """Which secret variable `data` holds and in which form (`AWS_SECRET_ACCESS_KEY, JSON-escaped`), or None."""
    for name, value in secret_variables(environ).items():
        for form_name, form in encoded_forms(value).items():
            if form.encode() in data:
                return f"{name}, {form_name}"
    return None
