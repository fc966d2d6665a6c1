"""Names of what a run makes on this host outside its run folder, each holding the pid of the process that owns it,
so that what a dead owner left can be told from what a live one holds (leftovers.py sweeps the first)."""

from __future__ import annotations

import os
import re

import psutil

KINDS = ("store", "s3fs", "quota")
OWNED = re.compile(rf"^ddlrepro-({'|'.join(KINDS)})-(?P<pid>\d+)-")
OWNER_LABEL = "ddlrepro.owner"  # a container's owner


def owned_name(kind: str, rest: str = "") -> str:
    """The name of a `kind` thing this process makes (a prefix when `rest` is empty)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of owned thing {kind!r}: one of {KINDS}")
    return f"ddlrepro-{kind}-{os.getpid()}-{rest}"


def dead_owner(name: str, pattern: re.Pattern[str] = OWNED) -> bool:
    """Whether `name` is an owned name (`pattern`, its owner's pid in the group `pid`) whose owner process is gone."""
    match = pattern.match(name)
    return match is not None and not psutil.pid_exists(int(match.group("pid")))


def container_labels() -> list[str]:
    """`podman run` / `docker run` options naming this process the container's owner."""
    return ["--label", f"{OWNER_LABEL}={os.getpid()}"]
