"""One task of the Slurm launcher's srun step: `python -m ddlrepro.launchers.slurm_task POINT_JSON`.

srun gives every task the same environment plus Slurm's step and task variables. This turns those into what the
local launcher gives a rank, so the workloads read one convention whatever started them: torchrun's MASTER_ADDR
(the step's first node) / RANK / WORLD_SIZE / LOCAL_*, TensorFlow's TF_CONFIG (one port per task on its node, from
`DDLREPRO_TENSORFLOW_PORT`), and Horovod's gloo variables. Rank 0's task serves Horovod's rendezvous (the server
horovodrun would start) on `DDLREPRO_HOROVOD_PORT`; the other tasks wait until it listens. Then the task runs the
workload in this process. Everything comes from the step itself, which is what srun actually started.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping

from ddlrepro.launchers import horovod
from ddlrepro.launchers.local import tf_config

TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?")
RENDEZVOUS_WAIT_S = 300


def hostnames(nodelist: str) -> list[str]:
    """A Slurm node list expanded by `scontrol show hostnames` (`node[1-3]` → node1, node2, node3)."""
    listed = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return listed.stdout.split()


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's tasks-per-node notation expanded: `2(x3),1` → [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in spec.split(","):
        match = TASKS_PER_NODE.fullmatch(part)
        if not match:
            raise ValueError(f"cannot read Slurm's tasks per node {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def layout(nodelist: str, tasks: str) -> list[tuple[str, int]]:
    """(node, tasks on it) in rank order: Slurm's default block distribution fills each node before the next."""
    nodes = hostnames(nodelist)
    counts = tasks_per_node(tasks)
    if len(nodes) != len(counts):
        raise ValueError(f"{len(nodes)} nodes in {nodelist!r} but tasks per node {tasks!r}")
    return list(zip(nodes, counts, strict=True))


def task_environment(environ: Mapping[str, str], nodes: list[tuple[str, int]]) -> dict[str, str]:
    """The environment the local launcher would give this task's rank, from Slurm's task variables."""
    rank, node = int(environ["SLURM_PROCID"]), int(environ["SLURM_NODEID"])
    env = {
        "MASTER_ADDR": nodes[0][0],
        "RANK": str(rank),
        "WORLD_SIZE": str(sum(count for _, count in nodes)),
        "LOCAL_RANK": environ["SLURM_LOCALID"],
        "LOCAL_WORLD_SIZE": str(nodes[node][1]),
    }
    if "DDLREPRO_TENSORFLOW_PORT" in environ:
        base = int(environ["DDLREPRO_TENSORFLOW_PORT"])
        workers = [f"{host}:{base + local}" for host, count in nodes for local in range(count)]
        env["TF_CONFIG"] = tf_config(workers, rank)
    if "DDLREPRO_HOROVOD_PORT" in environ:
        slot = horovod.slots(nodes)[rank]
        iface = "lo" if len(nodes) == 1 else None
        env |= horovod.rank_env(slot, nodes[0][0], int(environ["DDLREPRO_HOROVOD_PORT"]), iface)
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
        with horovod.rendezvous_server(nodes, port, bind_addr=""):
            yield
        return
    wait_until_listening(environ["MASTER_ADDR"], port, RENDEZVOUS_WAIT_S)
    yield


def wait_until_listening(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError as error:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Horovod's rendezvous on {host}:{port} (rank 0) did not listen: {error}") from None
            time.sleep(0.1)


def main(argv: list[str]) -> None:
    nodes = layout(os.environ["SLURM_STEP_NODELIST"], os.environ["SLURM_STEP_TASKS_PER_NODE"])
    os.environ.update(task_environment(os.environ, nodes))
    with horovod_rendezvous(os.environ, nodes):
        from ddlrepro.workloads.__main__ import main as run_workload

        run_workload(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
