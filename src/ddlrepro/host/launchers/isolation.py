"""A single-host run's own network: a network namespace holding only loopback, for the programs that listen on
every interface whatever they are told (Open MPI's out-of-band listener, TensorFlow's gRPC servers, which run any
graph sent to them). Their ranks talk over that namespace's loopback; nothing outside it can reach them.

As root it is a named namespace (`ip netns`). Without root it is made in a user namespace of the run's own
(`unshare --user --map-root-user --net`, where the kernel allows unprivileged user namespaces): a holder process
keeps both alive, dies with the run (parent-death signal), and the ranks join them with `nsenter` through links in a
private folder named like the namespace; inside, the ranks' user appears as root. Where neither is possible the run
uses the host's network and the trust model says so (docs/trust-model.md). A namespace is named after the process
that owns it (`ddl-own-<pid>-<token>`), removed when the run ends however it ends, and a named one whose owner died
(a SIGKILLed run) is swept at the next start.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ddlrepro.host.owners import dead_owner

PREFIX = "ddl-own-"
OWNED = re.compile(rf"^{PREFIX}(?P<pid>\d+)-[0-9a-f]+$")
IP_TIMEOUT_S = 30


def unavailable_reason() -> str | None:
    if os.geteuid() == 0:
        return None if shutil.which("ip") else "a network namespace of its own needs `ip` (iproute2)"
    return unprivileged_unavailable_reason()


@functools.cache
def unprivileged_unavailable_reason() -> str | None:
    """Why no user and network namespace can be made without root here (tried once), or None."""
    missing = [tool for tool in ("unshare", "nsenter", "setpriv", "ip") if shutil.which(tool) is None]
    if missing:
        return f"a network namespace of its own without root needs {', '.join(missing)} (util-linux, iproute2)"
    probe = subprocess.run([*HOLDER, "ip link set lo up"], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if probe.returncode != 0:
        return f"this kernel refuses an unprivileged user and network namespace: {probe.stderr.strip()[-200:]}"
    return None


def planned_name() -> str | None:
    """The namespace a run made by this process will have, or None where none can be made."""
    return None if unavailable_reason() else f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"


def inside(name: str | None, command: list[str]) -> list[str]:
    """`command` run in namespace `name`; as it is when there is none."""
    if name is None:
        return command
    if os.geteuid() == 0:
        return ["ip", "netns", "exec", name, *command]
    links = links_folder(name)
    return ["nsenter", f"--user={links / 'user'}", f"--net={links / 'net'}", "--preserve-credentials", "--", *command]


def links_folder(name: str) -> Path:
    """Where an unprivileged namespace's links live (private to this user)."""
    return Path(tempfile.gettempdir()) / name


def _ip(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *arguments], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)


def sweep_dead_owners() -> list[str]:
    """Remove the namespaces whose owner process is gone (as root), and the links folders of unprivileged ones (the
    holder died with its owner); the names removed."""
    listed = _ip("netns", "list").stdout.split("\n") if os.geteuid() == 0 else []
    names = [line.split()[0] for line in listed if line.strip()]
    dead = [name for name in names if dead_owner(name, OWNED)]
    for name in dead:
        _ip("netns", "del", name)
    folders = [folder for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*") if dead_owner(folder.name, OWNED)]
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return [*dead, *(folder.name for folder in folders)]


@contextlib.contextmanager
def own_network(name: str | None) -> Iterator[None]:
    """Namespace `name` (loopback up) while the block runs, removed afterwards; nothing when `name` is None."""
    if name is None:
        yield
        return
    sweep_dead_owners()
    if os.geteuid() != 0:
        with unprivileged_network(name):
            yield
        return
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


# The holder: a user namespace mapping this user to root, a network namespace in it with loopback up, kept alive by
# a sleep that the kernel kills when the process that started it ends.
HOLDER = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--user", "--map-root-user", "--net", "sh", "-c"]
HOLDER_SCRIPT = "ip link set lo up && echo up && exec sleep infinity"


@contextlib.contextmanager
def unprivileged_network(name: str) -> Iterator[None]:
    """A user and network namespace of the run's own, made without root, joined through `links_folder(name)`."""
    links = links_folder(name)
    links.mkdir(mode=0o700)
    holder = subprocess.Popen([*HOLDER, HOLDER_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if holder.stdout is None or holder.stdout.readline().strip() != "up":
            holder.kill()
            raise RuntimeError(f"network namespace {name} (unprivileged): {holder.communicate()[1].strip()[-300:]}")
        for kind in ("user", "net"):
            (links / kind).symlink_to(f"/proc/{holder.pid}/ns/{kind}")
        yield
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(links, ignore_errors=True)
