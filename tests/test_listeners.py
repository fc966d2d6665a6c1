"""Nothing a run starts listens beyond loopback or its own testbed: while a run of each framework and runtime goes
on, `ss` lists the listening TCP sockets of this test's descendant processes (those it held before the run left
out), and every one is on 127.0.0.1 or ::1, or inside a network namespace of the run's own.

Covered: torch DDP ranks (env:// rendezvous: rank 0's TCPStore, gloo's pairs), Horovod over gloo and over MPI,
TensorFlow MultiWorkerMirroredStrategy, the in-place elastic runtime and torchrun (its agents' c10d store too), and
TensorFlow's parameter-server cluster. Open MPI's and TensorFlow's servers bind every interface whatever they are
told: a single-host run of them gets a network namespace holding only loopback (`isolated:` below; as root), and
the parameter-server roles run on testbed hosts, whose namespaces hold only the testbed's 198.18.0.0/15 addresses
(`testbed:`). Horovod's rendezvous of a Slurm step listens on its first node's address only."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from conftest import REPO, tiny_point
from test_elastic import elastic_point

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import wikimedia_ps
from ddlrepro.host.launchers import isolation
from ddlrepro.host.launchers.base import RunFailed
from ddlrepro.host.launchers.local import free_loopback_port
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.host.testbed.limits import unavailable_reason as testbed_unavailable_reason
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point
from ddlrepro.rank import slurm_task
from ddlrepro.rank.taskenv import LISTEN_ADDRESS_ENV

LOOPBACK = re.compile(r"^(isolated:.*|testbed:.*|127(\.\d+){3}:\d+|\[::1\]:\d+|\[::ffff:127(\.\d+){3}\]:\d+)$")
SAMPLE_INTERVAL_S = 0.05
TESTBED = ipaddress.ip_network("198.18.0.0/15")
OWN_NETWORK = os.readlink("/proc/self/ns/net")


def listening(pids: set[int]) -> set[str]:
    """`address:port` of every listening TCP socket that one of `pids` holds; one in a network namespace of its own
    as `isolated:address:port` when that namespace holds nothing but loopback (nothing outside can reach it), as
    `testbed:address:port` when its only other addresses are the testbed's (198.18.0.0/15: reachable from the
    run's own testbed hosts only)."""
    found = set()
    namespaces = {network_of(pid): pid for pid in pids}
    others = [pid for namespace, pid in namespaces.items() if namespace not in (None, OWN_NETWORK)]
    for pid in [None, *others]:
        enter = ["nsenter", f"--net=/proc/{pid}/ns/net"] if pid else []
        script = "ip -o link; echo ---; ip -o -4 addr; echo ---; ss -ltnpH"  # one entry: the process may end meanwhile
        parts = subprocess.run([*enter, "sh", "-c", script], capture_output=True, text=True, timeout=10).stdout
        links, addresses, sockets = [*parts.split("---\n"), "", ""][:3]
        label = "" if not pid else namespace_label(links, addresses)
        for line in sockets.splitlines():
            owners = {int(owner) for owner in re.findall(r"pid=(\d+)", line)}
            if owners & pids:
                found.add(label + line.split()[3])
    return found


def namespace_label(links: str, addresses: str) -> str:
    names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    if names == {"lo"}:
        return "isolated:"
    held = [ipaddress.ip_interface(line.split()[3]) for line in addresses.splitlines() if " lo " not in line]
    if held and all(address.ip in TESTBED for address in held):
        return "testbed:"
    return f"namespace with {sorted(names)}:"


def network_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def listeners_during(run: Callable[[], dict]) -> tuple[dict, set[str]]:
    """What `run` returned, and every listening address its processes held while it ran (sampled)."""
    seen: set[str] = set()
    outcome: dict = {}
    me = psutil.Process()
    # What this test's process tree held before the run is not the run's (an earlier test's leftover on this
    # pytest worker, say): only what appeared while it ran is judged.
    before = listening(tree_of(me))
    worker = threading.Thread(target=lambda: outcome.update(run()))
    worker.start()
    deadline = time.monotonic() + 300
    while worker.is_alive() and time.monotonic() < deadline:
        seen |= listening(tree_of(me))
        time.sleep(SAMPLE_INTERVAL_S)
    worker.join(timeout=60)
    return outcome, seen - before


def tree_of(process: psutil.Process) -> set[int]:
    return {child.pid for child in process.children(recursive=True)} | {process.pid}


def parameter_server_point() -> Point:
    """A tiny TensorFlow parameter-server cluster (chief, worker, PS), one testbed host per role."""
    config = load_config(REPO / "config" / "config.yaml")
    point = wikimedia_ps.points(config["figures"][wikimedia_ps.ID], config["launcher"])[0]
    roles = {"ps_workers": 1, "ps": 1, "evaluators": 0, "testbed_hosts": 3, "epochs": 1, "probe_steps": 2}
    return replace(point, workers=3, params={**point.params, **roles, "hidden": [16]})


POINTS = {
    "torch-ddp": tiny_point(workers=2, iterations=12),
    "horovod-gloo": tiny_point(workers=2, iterations=12, framework="horovod", horovod_controller="gloo"),
    "horovod-mpi": tiny_point(workers=2, iterations=12, framework="horovod", horovod_controller="mpi"),
    "tensorflow": tiny_point(workers=2, iterations=12, framework="tensorflow"),
    "inplace": elastic_point("6:2,12:0"),
    "torchrun": elastic_point("6:2,12:0", runtime="torchrun"),
    "tensorflow-ps": parameter_server_point(),
}


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
@pytest.mark.parametrize("name", list(POINTS))
def test_a_run_listens_on_loopback_or_its_own_testbed_only(tmp_path: Path, name: str) -> None:
    point: Point = POINTS[name]
    if point.params.get("testbed_hosts") and testbed_unavailable_reason():
        pytest.skip(testbed_unavailable_reason() or "")
    result, addresses = listeners_during(lambda: run_point(point, tmp_path / "run", local_launcher(240)))
    assert result.get("status") == "ok", result
    assert addresses, "no listening socket seen: the sampling missed the run"
    beyond = sorted(address for address in addresses if not LOOPBACK.match(address))
    assert not beyond, f"{name} listened beyond loopback: {beyond}"


@pytest.mark.skipif(isolation.unavailable_reason() is not None, reason=isolation.unavailable_reason() or "")
def test_a_dead_runs_namespace_is_swept_and_a_live_ones_is_kept() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, alive = f"{isolation.PREFIX}{gone.pid}-aaaaaa", f"{isolation.PREFIX}{os.getpid()}-bbbbbb"
    for name in (dead, alive):
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        assert dead in isolation.sweep_dead_owners()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert dead not in listed and alive in listed
    finally:
        for name in (dead, alive):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def test_horovod_rendezvous_of_a_slurm_step_listens_on_the_first_nodes_address_only() -> None:
    pytest.importorskip("horovod.runner.http.http_server")
    nodes = [("localhost", 2)]
    port = free_loopback_port()
    environ = {
        "DDLREPRO_HOROVOD_PORT": str(port),
        "RANK": "0",
        LISTEN_ADDRESS_ENV: slurm_task.rendezvous_address(nodes),
    }
    with slurm_task.horovod_rendezvous(environ, nodes):
        addresses = listening({os.getpid()})
    assert environ[LISTEN_ADDRESS_ENV] == "127.0.0.1"
    assert f"127.0.0.1:{port}" in addresses, addresses
    assert all(LOOPBACK.match(address) for address in addresses), addresses


def test_a_rendezvous_port_taken_after_it_was_chosen_fails_the_run_before_any_rank_starts(tmp_path: Path) -> None:
    """The launcher binds the rendezvous port itself and hands it to rank 0: a process that takes the port between
    the run's render and its start cannot pose as the store while the ranks import torch."""
    launcher = local_launcher(120)
    spec = launcher.render(tiny_point(workers=2, iterations=4), tmp_path)
    port = spec.request.master_port
    assert spec.request.master_bound_here
    taken = rf"rendezvous port 127\.0\.0\.1:{port} was taken before any rank started"
    with (
        socket.create_server(("127.0.0.1", port)),
        OutputCollector(tmp_path) as output,
        pytest.raises(RunFailed, match=taken),
    ):
        launcher.execute(spec, output)
    assert not (tmp_path / "log.txt").read_text(), "a rank started"


UNPRIVILEGED_PROBE = """
import subprocess, sys
from ddlrepro.host.launchers import isolation
reason = isolation.unavailable_reason()
if reason:
    print("unavailable:", reason)
    sys.exit(0)
name = isolation.planned_name()
server = ("import socket; s = socket.create_server(('0.0.0.0', 0)); print(s.getsockname()[1], flush=True); "
          "c, _ = s.accept(); c.sendall(b'hi'); c.close()")
with isolation.own_network(name):
    listener = subprocess.Popen(isolation.inside(name, [sys.argv[1], "-c", server]), stdout=subprocess.PIPE, text=True)
    port = listener.stdout.readline().strip()
    host = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout.strip()
    client = f"import socket; print(socket.create_connection(('127.0.0.1', {port})).recv(2).decode())"
    reply = subprocess.run(isolation.inside(name, [sys.argv[1], "-c", client]), capture_output=True, text=True)
    links = subprocess.run(isolation.inside(name, ["ip", "-o", "link"]), capture_output=True, text=True).stdout
    listener.wait(timeout=30)
print("host sees:", host or "nothing")
print("reply:", reply.stdout.strip(), reply.stderr.strip()[-300:])
print("links:", " ".join(line.split(":")[1].strip() for line in links.splitlines()))
print("left:", isolation.links_folder(name).exists())
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="drops to user nobody: needs root")
def test_without_root_a_run_gets_a_namespace_of_its_own_all_its_commands_share() -> None:
    """What a run without root gets for Open MPI and TensorFlow: a user and network namespace of its own, holding
    only loopback, joined by every command of the run; nothing in it is seen from the host; nothing is left after.
    (The commands inside run the system's python3: a checkout's environment may sit where `nobody` cannot read.)"""
    inner = shutil.which("python3", path="/usr/bin:/bin")
    if inner is None:
        pytest.skip("needs a python3 in /usr/bin that user nobody can run")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    allowed = subprocess.run([*drop, "unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True)
    if allowed.returncode != 0:
        pytest.skip(f"this kernel refuses unprivileged user namespaces: {allowed.stderr.decode().strip()}")
    environment = {"PATH": os.environ["PATH"], "HOME": "/tmp"}
    done = subprocess.run(
        [*drop, sys.executable, "-c", UNPRIVILEGED_PROBE, inner],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        cwd="/tmp",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not done.stdout.startswith("unavailable:"), done.stdout  # the kernel allows it (checked above)
    assert "host sees: nothing" in done.stdout, done.stdout
    assert "reply: hi" in done.stdout, done.stdout
    assert "links: lo\n" in done.stdout, done.stdout
    assert "left: False" in done.stdout, done.stdout
