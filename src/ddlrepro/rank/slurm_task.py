"""One task of the Slurm launcher's srun step: `python -m ddlrepro.rank.slurm_task POINT_JSON`.

srun gives every task the same environment plus Slurm's step and task variables. This turns those into what the
local launcher gives a rank, so the workloads read one convention whatever started them: torchrun's MASTER_ADDR
(the step's first node) / RANK / WORLD_SIZE / LOCAL_*, TensorFlow's TF_CONFIG (one port per task on its node, from
`DDLREPRO_TENSORFLOW_PORT`), Horovod's gloo variables, and an emulated device type's kernel variables
(devicetypes.py; its CPU quota is not applied under Slurm, and the rank records so). Rank 0's task serves
Horovod's rendezvous (the server horovodrun would start) on `DDLREPRO_HOROVOD_PORT`, on the one address the other
tasks reach it at (horovodrun's binds every interface; the server has no authentication); the other tasks wait until
it listens. Then the task runs the workload in this process. Everything comes from the step itself, which is what
srun actually started.
"""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # a rank starting: no collections while it loads its libraries (startup.py)
    startup.pause_collection()

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping

import hostlist

from ddlrepro.points import Point
from ddlrepro.rank import devicetypes, taskenv
from ddlrepro.rank.taskenv import LISTEN_ADDRESS_ENV
from ddlrepro.shutdown import run_rank

RENDEZVOUS_WAIT_S = 300


def layout(nodelist: str, tasks: str) -> list[tuple[str, int]]:
    """(node, tasks on it) in rank order, from Slurm's node list (`gpu[01-02]`) and tasks per node (`2(x2)`),
    read with python-hostlist (scontrol may be missing in a container). The step runs with `--distribution=block`:
    each node's ranks follow on from the previous node's."""
    try:
        nodes, counts = hostlist.expand_hostlist(nodelist), hostlist.parse_slurm_tasks_per_node(tasks)
    except hostlist.BadHostlist as error:
        raise ValueError(f"cannot read Slurm's node list {nodelist!r} / tasks per node {tasks!r}: {error}") from None
    if len(nodes) != len(counts):
        raise ValueError(f"{len(nodes)} nodes in {nodelist!r} but tasks per node {tasks!r}")
    return list(zip(nodes, counts, strict=True))


def task_environment(environ: Mapping[str, str], nodes: list[tuple[str, int]]) -> dict[str, str]:
    """The environment the local launcher would give this task's rank, from Slurm's task variables."""
    rank, node, local = int(environ["SLURM_PROCID"]), int(environ["SLURM_NODEID"]), int(environ["SLURM_LOCALID"])
    if sum(count for _, count in nodes[:node]) + local != rank:
        raise RuntimeError(
            f"task {rank} is local task {local} of node {node} of {nodes}: not a block distribution of ranks, "
            "which the Horovod slots and TF_CONFIG addresses assume (run the step with --distribution=block)"
        )
    env = {
        "MASTER_ADDR": nodes[0][0],
        "RANK": str(rank),
        "WORLD_SIZE": str(sum(count for _, count in nodes)),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(nodes[node][1]),
    }
    if "DDLREPRO_TENSORFLOW_PORT" in environ:
        base = int(environ["DDLREPRO_TENSORFLOW_PORT"])
        workers = [f"{host}:{base + local}" for host, count in nodes for local in range(count)]
        env["TF_CONFIG"] = taskenv.tf_config(workers, rank)
    if "DDLREPRO_HOROVOD_PORT" in environ:
        slot = taskenv.slots(nodes)[rank]
        iface = "lo" if len(nodes) == 1 else None
        env |= taskenv.rank_env(slot, nodes[0][0], int(environ["DDLREPRO_HOROVOD_PORT"]), iface)
    return env


@contextlib.contextmanager
def horovod_rendezvous(environ: Mapping[str, str], nodes: list[tuple[str, int]]) -> Iterator[None]:
    """Rank 0 serves Horovod's rendezvous while its workload runs; the others first wait until it listens
    (Horovod's own client gives up after three tries, 1.5 s)."""
    if "DDLREPRO_HOROVOD_PORT" not in environ:
        yield
        return
    port = int(environ["DDLREPRO_HOROVOD_PORT"])
    if environ["RANK"] == "0":
        with taskenv.rendezvous_server(nodes, port, bind_addr=environ[LISTEN_ADDRESS_ENV]):
            yield
        return
    wait_until_listening(environ["MASTER_ADDR"], port, RENDEZVOUS_WAIT_S)
    yield


def rendezvous_address(nodes: list[tuple[str, int]]) -> str:
    """The address of this node (the step's first) that the other tasks reach: on one node what its name resolves
    to (MASTER_ADDR, which they connect to); across nodes the address this node sends from towards the second node
    (its name may resolve to 127.0.1.1 here, as Debian's /etc/hosts has it, but not on the others)."""
    try:
        if len(nodes) == 1:
            return socket.gethostbyname(nodes[0][0])
        return taskenv.address_towards(socket.gethostbyname(nodes[1][0]))
    except OSError as error:
        raise RuntimeError(f"Horovod's rendezvous: cannot find this node's address for {nodes}: {error}") from None


def wait_until_listening(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError as error:
            if isinstance(error, socket.gaierror) or time.monotonic() > deadline:
                raise RuntimeError(f"Horovod's rendezvous on {host}:{port} (rank 0) did not listen: {error}") from None
            time.sleep(0.1)


def main(argv: list[str]) -> None:
    step = ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID")
    missing = [name for name in step if name not in os.environ]
    if missing:
        sys.exit(f"slurm_task runs as a task of an srun step; {', '.join(missing)} not set")
    nodes = layout(os.environ["SLURM_STEP_NODELIST"], os.environ["SLURM_STEP_TASKS_PER_NODE"])
    os.environ.update(task_environment(os.environ, nodes))
    if os.environ["RANK"] == "0":  # its rendezvous store and Horovod's server listen there only
        os.environ[LISTEN_ADDRESS_ENV] = rendezvous_address(nodes)
    # A device type's kernels are chosen by variables read when torch loads: set before the workload imports it.
    if argv:
        os.environ.update(devicetypes.rank_environment(Point.from_json(argv[0]).params, int(os.environ["RANK"])))
    with horovod_rendezvous(os.environ, nodes):
        from ddlrepro.rank.workloads.__main__ import main as run_workload

        run_workload(argv)


if __name__ == "__main__":
    run_rank(main)
