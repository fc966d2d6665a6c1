"""Keep credentials out of everything the workflow writes.

A secret is the value of an environment variable that is a secret by name (tokens, keys, passwords,
credentials: `SECRET_NAME`), or of a variable the configuration names (`redaction.variables`, passed to every job
as the names in `DDLREPRO_REDACT_VARIABLES`), or a value this process made and registered (the elastic config
server's token). Values too short or too common to be secrets are skipped (`plausible_secret`); each line of a
multi-line secret (a PEM key) is a secret of its own, since output is filed line by line. Every secret is replaced
by a marker however it is written (raw; JSON-escaped, with `\\/` or not; Python str and bytes reprs; HTML-, URL-,
shell- or CSV-quoted; base64 at any alignment, HTTP Basic credentials included; hex) in every log line, JSON file,
report and error message ddlrepro writes, and a piece of one at either end of a text (what a cut tail leaves) too;
the bundle refuses to pack a file that still contains one. Values are never recorded; the names of the secret
variables a run saw are (provenance), so that the bundle can look for their values.
"""

from __future__ import annotations

import base64
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
    """Secret values by the variable that holds them (registered values under `<registered>`; a multi-line value's
    lines under `<name> line <n>` as well)."""
    environ = os.environ if environ is None else environ
    named = named_secret_variables(environ)
    found = {
        name: value
        for name, value in environ.items()
        if (looks_secret(name) or name in named) and plausible_secret(value)
    }
    found.update({f"<registered {index}>": value for index, value in enumerate(sorted(_registered))})
    for name, value in list(found.items()):
        lines = [line.strip() for line in value.splitlines()]
        found.update(
            {f"{name} line {n}": line for n, line in enumerate(lines, 1) if len(lines) > 1 and plausible_secret(line)}
        )
    return found


def secret_variable_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables holding a secret (names only: what a run's provenance records, so that a bundle made later,
    elsewhere, knows which values to look for)."""
    environ = os.environ if environ is None else environ
    return sorted(name for name in secret_variables(environ) if name in environ)


def with_secret_variables(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment in which `names` are secret variables too (`DDLREPRO_REDACT_VARIABLES`)."""
    environ = dict(os.environ if environ is None else environ)
    environ[NAMED_SECRETS_ENV] = " ".join(sorted(named_secret_variables(environ) | set(names)))
    return environ


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
    forms["JSON-escaped (slashes escaped)"] = json.dumps(value)[1:-1].replace("/", "\\/")
    for safe in ("", "/"):
        forms[f"URL-encoded (safe={safe!r})"] = quote(value, safe=safe)
        forms[f"URL-encoded + (safe={safe!r})"] = quote_plus(value, safe=safe)
    forms["CSV-quoted"] = value.replace('"', '""')
    forms["Python bytes repr"] = repr(value.encode())[2:-1]
    forms["hex"] = value.encode().hex()
    forms["hex (upper case)"] = forms["hex"].upper()
    for offset in range(3):
        forms[f"base64 (offset {offset})"] = base64_inside(value.encode(), offset)
        forms[f"base64url (offset {offset})"] = base64_inside(value.encode(), offset).translate(URLSAFE)
    forms["raw"] = value
    return {name: form for name, form in forms.items() if form}


URLSAFE = str.maketrans("+/", "-_")
SKIPPED_BASE64_CHARACTERS = {0: 0, 1: 2, 2: 3}  # those that also carry bits of the bytes before the value


def base64_inside(data: bytes, offset: int) -> str:
    """The base64 characters that `data` alone determines when it starts `offset` bytes into a base64 stream (as
    after `user:` in an HTTP Basic header): the same in every stream holding it at that alignment."""
    encoded = base64.b64encode(bytes(offset) + data).decode()
    end = (offset + len(data)) // 3 * 4  # the last whole group: a partial one depends on what follows
    skip = SKIPPED_BASE64_CHARACTERS[offset]
    return encoded[skip:end] if end - skip >= MIN_SECRET_LENGTH else ""


@functools.lru_cache(maxsize=16)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regular expression for every form of every secret, longest first (so no form is half-replaced)."""
    forms = {form for value in secrets for form in encoded_forms(value).values()}
    if not forms:
        return None
    return re.compile("|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True)))


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with every form of every secret value replaced by the marker, and a piece of one (at least
    `MIN_SECRET_LENGTH` characters) that starts or ends the text, as a cut tail or head leaves it."""
    secrets = tuple(secret_values() if secrets is None else secrets)
    pattern = _pattern(secrets)
    return text if pattern is None else _redact_cut_ends(pattern.sub(MARKER, text), secrets)


def _redact_cut_ends(text: str, secrets: tuple[str, ...]) -> str:
    for value in secrets:
        for length in range(len(value) - 1, MIN_SECRET_LENGTH - 1, -1):
            if text.startswith(value[-length:]):
                text = MARKER + text[length:]
                break
        for length in range(len(value) - 1, MIN_SECRET_LENGTH - 1, -1):
            if text.endswith(value[:length]):
                text = text[:-length] + MARKER
                break
    return text


def redacted_tail(text: str, characters: int) -> str:
    """The last `characters` of `text`, redacted before it is cut (a cut through a secret leaves no piece of it)."""
    return redact(text)[-characters:]


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
