"""Faults in the `ps` workload: a worker or parameter server killed for real, and the chief's checkpoints.

`fault: {role, task, at_step, signal}` (first attempt only: a retry resumes, unharmed). The faulted task's
TensorFlow server runs in a child process of its rank (`python -m ddlrepro.rank.workloads.ps_faults`): the signal
goes to that child's real pid, the process that serves `/job:<role>/task:<task>`, while the rank itself stays in the
torch group, so the chief can still announce phases to every rank and the launcher sees no rank fail for a fault the
run is meant to survive. The chief sends the signal once it has scheduled and joined `at_step` steps.

A killed worker: the ClusterCoordinator puts the closures that failed on it back in its queue and the other workers
run them; TensorFlow counts them (`recoverable_worker_failure_count`, read here from its coordinator metrics). A
killed parameter server: the coordinator raises UnavailableError (`PSUnavailableError`), whose message names the
task or its address; the chief raises `ParameterServerLost` naming `/job:ps/task:<k>`, and the run fails. The chief
writes a `tf.train.Checkpoint` every `checkpoint_interval` steps into the run folder's `checkpoint/`; the host sets a
failed attempt's folder aside (attempts/<time>/) and hands the next attempt its checkpoint (`resume_checkpoint`).
"""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # a task's server starting: no collections while it loads TensorFlow (startup.py)
    startup.pause_collection()

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM}
READY = "ddlrepro-ps-server-listening"
TASK_IN_DEVICE = re.compile(r"/job:ps/replica:\d+/task:(\d+)|/job:ps/task:(\d+)")


class ParameterServerLost(RuntimeError):
    """The cluster lost a parameter server: the run cannot go on (it resumes from a checkpoint on a retry)."""

    def __init__(self, task: int | None, error: BaseException) -> None:
        who = f"/job:ps/task:{task}" if task is not None else "a parameter server (task not named by TensorFlow)"
        super().__init__(f"lost {who}: {type(error).__name__}: {telling_line(error)}")


def telling_line(error: BaseException) -> str:
    """The line of TensorFlow's (long) message that says what happened to the connection, else its first."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    telling = [line for line in lines if re.search(r"unavailable|socket closed|connect", line, re.IGNORECASE)]
    return (telling or lines)[0][:300]


def active_fault(params: dict[str, Any]) -> dict[str, Any] | None:
    """The point's fault if this attempt injects it: the first attempt only (a retry resumes unharmed)."""
    fault = params.get("fault")
    return fault if fault and int(params.get("attempt", "1")) == 1 else None


def is_fault_target(params: dict[str, Any], role: str, task: int) -> bool:
    fault = active_fault(params)
    return fault is not None and fault["role"] == role and fault.get("task", 0) == task


def start_server_process() -> subprocess.Popen:
    """This rank's TensorFlow server in a child process (TF_CONFIG inherited), once it listens."""
    child = subprocess.Popen(
        [sys.executable, "-m", "ddlrepro.rank.workloads.ps_faults"], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert child.stdout is not None
    line = child.stdout.readline().strip()  # bounded: the child exits (EOF) if its server cannot start
    if line != READY:
        child.kill()
        raise RuntimeError(f"the TensorFlow server's process did not start (it printed {line!r})")
    return child


def serve_forever() -> None:
    """The child: a TensorFlow server for TF_CONFIG's task, until it is killed."""
    import tensorflow as tf

    startup.resume_collection()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc"
    )
    print(READY, flush=True)
    server.join()


def pid_space() -> str:
    """Which machine and PID namespace a pid is valid in: the kernel's boot id and the PID namespace (a testbed
    host has its own network namespace and host name, but shares both)."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}/{os.readlink('/proc/self/ns/pid')}"


def gather_servers(role: str, task: int, pid: int) -> list[tuple[str, int, str, int]]:
    """Every rank's (role, task, pid space, pid of the process serving its task), gathered over the torch group:
    also the barrier after which every server listens."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (role, task, pid_space(), pid))
    return [tuple(entry) for entry in gathered]


def deliver(fault: dict[str, Any], servers: list[tuple[str, int, str, int]]) -> str:
    """Send the fault's signal to the process serving its task; what was done, for the record. The target must be
    on the chief's machine and PID namespace (testbed hosts share them): a pid means nothing elsewhere."""
    role, task = fault["role"], fault.get("task", 0)
    matches = [(host, pid) for each_role, each_task, host, pid in servers if (each_role, each_task) == (role, task)]
    if len(matches) != 1:
        raise RuntimeError(f"fault: no single /job:{role}/task:{task} among the cluster's servers {servers}")
    space, pid = matches[0]
    if space != pid_space():
        raise RuntimeError(f"fault: /job:{role}/task:{task} runs on another machine ({space}); cannot signal it")
    name = fault.get("signal", "SIGKILL")
    os.kill(pid, SIGNALS[name])
    return f"{name} to /job:{role}/task:{task} (pid {pid})"


def lost_ps_task(error: BaseException, ps_addresses: list[str]) -> int | None:
    """The parameter server an UnavailableError is about: its device name in the message (/job:ps/replica:0/task:1),
    else its address; None if neither is there."""
    text = str(error) + str(getattr(error, "original_exception", ""))
    found = TASK_IN_DEVICE.search(text)
    if found:
        return int(found.group(1) or found.group(2))
    named = [task for task, address in enumerate(ps_addresses) if address in text]
    return named[0] if len(named) == 1 else None


def recoverable_worker_failures() -> int:
    """Closures the coordinator put back in its queue after they failed on a lost worker (each ran again on another
    worker): TensorFlow's own counter (its coordinator metrics; 0 before any closure was scheduled)."""
    from tensorflow.python.distribute.coordinator import metric_utils

    try:
        return int(metric_utils.get_metric_summary("worker_failures"))
    except KeyError:
        return 0


if __name__ == "__main__":
    serve_forever()
