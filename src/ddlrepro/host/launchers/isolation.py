"""A single-host run's own network: a network namespace holding only loopback, for the programs that listen on
every interface whatever they are told (Open MPI's out-of-band listener, TensorFlow's gRPC servers, which run any
graph sent to them). Their ranks talk over that namespace's loopback; nothing outside it can reach them.

Made as root only (`ip netns`); elsewhere such a run uses the host's network, as before, and the trust model says
so (docs/trust-model.md). A namespace is named after the process that owns it (`ddl-own-<pid>-<token>`), removed
when the run ends however it ends, and one whose owner died (a SIGKILLed run) is swept at the next start.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator

import psutil

PREFIX = "ddl-own-"
OWNED = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+$")
IP_TIMEOUT_S = 30


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "a network namespace of its own needs root"
    if shutil.which("ip") is None:
        return "a network namespace of its own needs `ip` (iproute2)"
    return None


def planned_name() -> str | None:
    """The namespace a run made by this process will have, or None where none can be made."""
    return None if unavailable_reason() else f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"


def inside(name: str | None, command: list[str]) -> list[str]:
    """`command` run in namespace `name`; as it is when there is none."""
    return ["ip", "netns", "exec", name, *command] if name else command


def _ip(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *arguments], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)


def sweep_dead_owners() -> list[str]:
    """Remove the namespaces whose owner process is gone; the names removed."""
    listed = _ip("netns", "list").stdout.split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    dead = [name for name in names if (match := OWNED.match(name)) and not psutil.pid_exists(int(match.group(1)))]
    for name in dead:
        _ip("netns", "del", name)
    return dead


@contextlib.contextmanager
def own_network(name: str | None) -> Iterator[None]:
    """Namespace `name` (loopback up) while the block runs, removed afterwards; nothing when `name` is None."""
    if name is None:
        yield
        return
    sweep_dead_owners()
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        raise RuntimeError(f"network namespace {name}: {made.stderr.strip()}")
    try:
        up = _ip("-n", name, "link", "set", "lo", "up")
        if up.returncode != 0:
            raise RuntimeError(f"network namespace {name}: loopback: {up.stderr.strip()}")
        yield
    finally:
        _ip("netns", "del", name)
