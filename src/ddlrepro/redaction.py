"""Keep credentials out of everything the workflow writes.

The values of environment variables whose names look like secrets (keys, tokens, passwords, cloud credentials)
are replaced by a marker in every log line, JSON file, report and error message ddlrepro writes; the bundle
refuses to pack a file that still contains one. Variables themselves are never recorded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SECRET_NAME = re.compile(
    r"(^|_)(KEY|KEYS|TOKEN|SECRET|SECRETS|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|CREDENTIALS|AUTH|COOKIE|PAT)(_|$)"
    r"|^(AWS|AZURE|GOOGLE|GCP|GCLOUD|ALIBABA|ALICLOUD|IBM|COS|OCI|DO|DIGITALOCEAN|HF|HUGGING_FACE|WANDB|MLFLOW)_",
    re.IGNORECASE,
)
NOT_SECRET_NAME = re.compile(r"(_REGION|_PROFILE|_LOCATION|_CA_BUNDLE|_ENDPOINT_URL)$", re.IGNORECASE)
MIN_SECRET_LENGTH = 6
MARKER = "[REDACTED]"


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET_NAME.search(name)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-looking variables, longest first (short values such as `1` are never treated as secrets)."""
    environ = os.environ if environ is None else environ
    values = {value for name, value in environ.items() if looks_secret(name) and len(value) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every secret value replaced by the marker."""
    for value in secret_values() if secrets is None else secrets:
        text = text.replace(value, MARKER)
    return text
