"""What every part of a bundle agrees on: its member names, its format, its errors and its hash."""

from __future__ import annotations

import hashlib

from ddlrepro.host.errors import UserError

MANIFEST = "MANIFEST.json"
MANIFEST_DIGEST = "MANIFEST.sha256"
SIGNATURE = "MANIFEST.json.sig"
SIGNING_NAMESPACE = "ddlrepro-bundle"
DIGEST_SUFFIX = ".manifest.sha256"
# 2: the tables carry the host-load columns (foreign_share, steal_share, disturbed); a format-1 bundle's do not.
BUNDLE_FORMAT = 2
INPUTS = "inputs/"  # files a simulated figure read outside results/, per figure
CAPTIONS = "report/captions/"  # the captions the report was built with, per figure (check_report)
SSH_KEYGEN_TIMEOUT_S = 60


class BundleError(UserError):
    """A bundle cannot be made, signed or read safely; the message names the file (and the member)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def figure_tables(figure: str) -> list[str]:
    """A figure's tables in results/tables: its runs', a simulated figure's simulation, its summary."""
    from ddlrepro.host.figures import is_simulated, simulated_table_name

    simulated = [simulated_table_name(figure)] if is_simulated(figure) else []
    return [f"{figure}.csv", *simulated, f"{figure}.summary.csv"]
