"""A multi-node Slurm cluster on the testbed: one slurmd per host, slurmctld on the first host, munge shared.

    python -m ddlrepro.host.testbed.slurm start --nodes N STATE_DIR   (scripts/slurm-cluster start --nodes N)
    python -m ddlrepro.host.testbed.slurm stop|status STATE_DIR
    python -m ddlrepro.host.testbed.slurm check --nodes N STATE_DIR   (refuses bad input; creates nothing)

Each slurmd runs on its testbed host (`Testbed.exec_prefix`: its network namespace, its hostname `slurm-h<i>` as
its node name, its address as NodeAddr) with its own spool folder, pid and log file. munge's socket is a path, so
the one munged of the machine serves every host. Two views of one cluster:

- the hosts see `/etc/netns/<namespace>/slurm/slurm.conf` at /etc/slurm/slurm.conf (`ip netns exec` bind-mounts
  it): the controller at its testbed address, so slurmds, job steps and srun inside jobs reach it directly;
- the root namespace sees /etc/slurm/slurm.conf (a link to STATE_DIR/slurm.conf): the controller at
  127.0.0.1:6817, where a forwarder (forward.py) carries each connection into the first host. Only users'
  commands take that path (sbatch, squeue, scontrol); nothing needs to call back into the root namespace.

`SLURM_CONF=/etc/slurm/slurm.conf` is the one setting right in both views (sbatch hands the caller's SLURM_CONF on
to the job, whose steps run on the hosts). `ip netns exec` mounts a fresh /sys for the host (its own
/sys/class/net), which hides the cgroup hierarchies slurmd initialises: they are mounted again inside, as in the
root namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ddlrepro.host.testbed import limits
from ddlrepro.host.testbed.limits import TestbedError
from ddlrepro.host.testbed.network import (
    NETNS_ETC,
    Host,
    Testbed,
    owner_alive,
    read_state,
    remove_leftovers,
    stop_owner,
)

OWNER = "slurm"
SUBNET = "198.18.0.0/24"
CONTROLLER_PORT = 6817
ROOT_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "multinode"  # in the state folder from the first step of `start --nodes` to the end of `stop`
STOP_GRACE_S = 10.0
READY_TIMEOUT_S = 60.0
# A dead slurmd is marked down (and its job failed, naming the node) after this long without an answer; the
# failed job is not requeued (JobRequeue=0): it could never start again on the nodes left, and Snakemake
# retries runs itself (launcher.retries).
SLURMD_TIMEOUT_S = 20
# Smoke points oversubscribe a small machine's cores as the local launcher does: each node declares 8 CPUs.
NODE_CPUS = 8
MOUNTS = Path("/proc/self/mounts")


def node_memory_mb(nodes: int) -> int:
    """Each node's share of the machine's memory (the nodes share it)."""
    return int(limits.meminfo_bytes("MemTotal") / 2**20 * 0.95 / nodes)


def cluster_config(state: Path, testbed: Testbed, controller_address: str) -> str:
    """slurm.conf with the controller on the first host at `controller_address`."""
    first = testbed.hosts[0]
    memory = node_memory_mb(len(testbed.hosts))
    nodes = "".join(
        f"NodeName={host.name} NodeAddr={host.address} CPUs={NODE_CPUS} RealMemory={memory} State=UNKNOWN\n"
        for host in testbed.hosts
    )
    return f"""ClusterName=ddlrepro
SlurmctldHost={first.name}({controller_address})
SlurmctldPort={CONTROLLER_PORT}
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=0
SlurmdParameters=config_overrides
SlurmdTimeout={SLURMD_TIMEOUT_S}
MinJobAge=300
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/d/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/log/slurmctld.log
SlurmdLogFile={state}/log/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def cgroup_mounts() -> str:
    """Shell commands that mount the root namespace's cgroup hierarchies again (under a host's fresh /sys)."""
    commands = []
    for line in MOUNTS.read_text().splitlines():
        _, target, kind, options, *_ = line.split()
        if target == "/sys/fs/cgroup" or target.startswith("/sys/fs/cgroup/"):
            commands.append(f"mkdir -p {target} && mount -t {kind} -o {options} {kind} {target}")
    return " && ".join(commands) or "true"


def check_can_start(nodes: int, state: Path) -> None:
    """Refuse, before anything is made: a node count the machine cannot hold, a testbed or controller port taken,
    an /etc/slurm/slurm.conf that is not a link (another cluster's)."""
    limits.require_available()
    if not isinstance(nodes, int) or nodes < 1:
        raise TestbedError(f"--nodes must be a whole number ≥ 1, got {nodes!r}")
    limits.check_hosts(nodes, limits.check_subnet(SUBNET))
    testbed_state = read_state(OWNER)
    if testbed_state and owner_alive(testbed_state):
        raise TestbedError(
            f"testbed {OWNER!r} is already running (pid {testbed_state['pid']}), not started from {state}: "
            "stop that cluster first (scripts/slurm-cluster stop with its state folder)"
        )
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", CONTROLLER_PORT))
        except OSError:
            raise TestbedError(
                f"127.0.0.1:{CONTROLLER_PORT} is in use (a single-node cluster? scripts/slurm-cluster stop): the "
                "multi-node cluster's controller is reached there"
            ) from None
    if ROOT_CONF.exists() and not ROOT_CONF.is_symlink():
        raise TestbedError(f"{ROOT_CONF} belongs to another cluster (not a link this script made): not replacing it")


def running(state: Path) -> bool:
    testbed_state = read_state(OWNER)
    return bool(testbed_state and owner_alive(testbed_state)) and (state / "nodes.conf").exists()


# The one multi-node cluster of the machine is claimed by the state folder that starts it: check and start run under
# a lock (two starts cannot both pass the check), and `stop` from another folder leaves a live cluster alone.
CLAIMS = Path("/run/ddlrepro")


@contextlib.contextmanager
def claim_lock() -> Iterator[None]:
    CLAIMS.mkdir(parents=True, exist_ok=True)
    with (CLAIMS / "slurm-multinode.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def claimant() -> Path | None:
    """The state folder that started the running (or last) multi-node cluster, if one claimed it."""
    try:
        return Path((CLAIMS / "slurm-multinode.claim").read_text().strip())
    except FileNotFoundError:
        return None


def start(nodes: int, state: Path) -> None:
    with claim_lock():
        if running(state):
            print(f"slurm-cluster: already running ({state})", file=sys.stderr)
            return
        check_can_start(nodes, state)
        (CLAIMS / "slurm-multinode.claim").write_text(f"{state}\n")
        started = time.monotonic()
        # Before anything exists: `stop` on this folder finds the multi-node cluster even if this start is killed.
        state.mkdir(parents=True, exist_ok=True)
        (state / MARKER).write_text(f"{nodes}\n")
        try:
            testbed = start_testbed(nodes)
            write_configs(state, testbed)
            start_daemons(state, testbed)
            wait_idle(len(testbed.hosts), state)
        except BaseException:
            stop(state)
            raise
    print(f"slurm-cluster: {nodes} nodes idle after {time.monotonic() - started:.1f} s", file=sys.stderr)


def start_testbed(nodes: int) -> Testbed:
    """The testbed, held by its keeper process (scripts/testbed start) so that it outlives this command."""
    command = [sys.executable, "-m", "ddlrepro.host.testbed", "start", "--owner", OWNER, "--hosts", str(nodes)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TestbedError(f"the testbed did not start: {done.stderr.strip()}")
    return Testbed.attach(OWNER)


def write_configs(state: Path, testbed: Testbed) -> None:
    for folder in ("ctld", "log", *(f"{kind}/{host.name}" for kind in ("d", "pmix") for host in testbed.hosts)):
        (state / folder).mkdir(parents=True, exist_ok=True)
    (state / "nodes.conf").write_text(cluster_config(state, testbed, testbed.hosts[0].address))
    (state / "slurm.conf").write_text(cluster_config(state, testbed, "127.0.0.1"))
    for host in testbed.hosts:
        etc = NETNS_ETC / host.namespace / "slurm"
        etc.mkdir(parents=True, exist_ok=True)
        shutil.copy(state / "nodes.conf", etc / "slurm.conf")
        # The hosts share one /tmp, where Slurm's PMIx plugin makes each step's folder under the same name.
        (etc / "mpi.conf").write_text(f"PMIxCliTmpDirBase={state}/pmix/{host.name}\n")
    ROOT_CONF.parent.mkdir(parents=True, exist_ok=True)
    ROOT_CONF.unlink(missing_ok=True)
    ROOT_CONF.symlink_to(state / "slurm.conf")


def start_daemons(state: Path, testbed: Testbed) -> None:
    """slurmctld on the first host, a slurmd on every host, the forwarder into the first host."""
    first = testbed.hosts[0]
    on_host(testbed, first, "slurmctld", ["slurmctld"], state)
    mounts = cgroup_mounts()
    for host in testbed.hosts:
        on_host(testbed, host, "slurmd", ["sh", "-c", f"{mounts} && exec slurmd -N {host.name}"], state)
    forward = [sys.executable, "-m", "ddlrepro.host.testbed.forward", str(CONTROLLER_PORT)]
    log = state / "log" / "forward.log"
    with log.open("w") as errors:
        forwarder = subprocess.Popen(
            [*forward, first.namespace, first.address, str(CONTROLLER_PORT)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,
        )
    # The forwarder moves itself into the first host: the testbed's teardown ends it with the daemons.
    if forwarder.stdout is None or forwarder.stdout.readline().strip() != "forwarding":
        raise TestbedError(f"the forwarder to {first.name}:{CONTROLLER_PORT} did not start; see {log}")


def on_host(testbed: Testbed, host: Host, daemon: str, command: list[str], state: Path) -> None:
    """Start a daemon on a host (it forks into the background); a failure names the host and the log."""
    done = subprocess.run([*testbed.exec_prefix(host), *command], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TestbedError(
            f"{daemon} did not start on {host.name} ({done.stderr.strip() or f'exit {done.returncode}'}); "
            f"see {state}/log/"
        )


def sinfo(*args: str) -> subprocess.CompletedProcess[str]:
    """sinfo in the root namespace's view; a controller that does not answer in time is a failed call."""
    env = {**os.environ, "SLURM_CONF": str(ROOT_CONF)}
    try:
        return subprocess.run(["sinfo", *args], capture_output=True, text=True, env=env, check=False, timeout=30)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["sinfo", *args], 1, "", "sinfo: no answer from the controller in 30 s")


def wait_idle(nodes: int, state: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen = ""
    while time.monotonic() < deadline:
        answer = sinfo("-h", "-N", "-o", "%N %t")
        seen = answer.stdout.strip() or answer.stderr.strip()
        states = answer.stdout.split()[1::2]
        if len(states) == nodes and all(each in ("idle", "mix", "alloc") for each in states):
            return
        time.sleep(0.2)
    raise TestbedError(
        f"the {nodes} nodes did not become idle in {READY_TIMEOUT_S:g} s (last seen: {seen!r}); see {state}/log/"
    )


def stop(state: Path) -> None:
    """Stop the daemons, the forwarder and the testbed (its teardown ends every process on the hosts), and the
    root namespace's link to this cluster's configuration; also after a crash, and when nothing runs.
    (scripts/slurm-cluster then makes the stopped configuration fail at once, as for a single-node cluster.) A live
    cluster another state folder claimed is left alone (TestbedError naming that folder); this folder's own files
    go in any case."""
    holder, testbed_state = claimant(), read_state(OWNER)
    if testbed_state and owner_alive(testbed_state) and holder not in (None, state):
        (state / "nodes.conf").unlink(missing_ok=True)
        (state / MARKER).unlink(missing_ok=True)
        raise TestbedError(f"the running multi-node cluster was started from {holder}, not {state}: stop it from there")
    stop_owner(OWNER, STOP_GRACE_S)
    remove_leftovers(OWNER)
    (CLAIMS / "slurm-multinode.claim").unlink(missing_ok=True)
    if ROOT_CONF.is_symlink() and ROOT_CONF.resolve() == (state / "slurm.conf").resolve():
        ROOT_CONF.unlink()
    (state / "nodes.conf").unlink(missing_ok=True)
    (state / MARKER).unlink(missing_ok=True)


def status(state: Path) -> int:
    if not running(state):
        print("slurm-cluster: not running", file=sys.stderr)
        return 3
    # %t marks a node whose slurmd does not answer with `*` (idle*, down*); %E says why a node is down.
    answer = sinfo("-N", "-o", "%N %n %o %t %E")
    print(answer.stdout, end="")
    if answer.returncode != 0:
        print(f"slurm-cluster: the controller does not answer: {answer.stderr.strip()}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/slurm-cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("check", "start", "stop", "status"))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("state", nargs="?", default=".slurm")
    args = parser.parse_intermixed_args(argv)
    state = Path(args.state).resolve()
    action: Callable[[int, Path], int | None] = ACTIONS[args.action]
    return limits.exit_code("slurm-cluster", lambda: action(args.nodes, state))


def start_and_say(nodes: int, state: Path) -> None:
    start(nodes, state)
    print(f"export SLURM_CONF={ROOT_CONF}")


ACTIONS = {
    "check": lambda nodes, state: check_can_start(nodes, state),
    "start": start_and_say,
    "stop": lambda nodes, state: stop(state),
    "status": lambda nodes, state: status(state),
}


if __name__ == "__main__":
    sys.exit(main())
