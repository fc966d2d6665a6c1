"""What every workload rank shares: its place in the job, torch.distributed set-up, and machine-readable output.

Records go to stdout as `DDLREPRO {json}` lines (see records.py); the launcher files them into the run's metrics
and provenance, whatever the launcher (local processes, srun, Kubernetes pods).
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psutil
import torch
import torch.distributed as dist

from ddlrepro import startup
from ddlrepro.rank.allocation import AllocationLimits, allocation_limits
from ddlrepro.rank.taskenv import LISTEN_ADDRESS_ENV, LISTEN_BACKLOG, MASTER_LISTEN_FD_ENV, NETWORK_INTERFACES_ENV
from ddlrepro.records import emit

# What a torch optimizer loads on its first use (its methods are wrapped by torch._disable_dynamo): 835 modules,
# sympy and mpmath among them, 1.0 s of CPU here; a rank that trains loads it with its libraries (ddlrepro.startup).
OPTIMIZER_LIBRARY = "torch._dynamo"


def optimizer_libraries(params: dict[str, Any]) -> tuple[str, ...]:
    """`libraries(params)` of a workload that trains with a torch optimizer (workloads/__init__.py)."""
    return (OPTIMIZER_LIBRARY,)


def _env_int(*names: str, default: int | None = None) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    if default is None:
        raise RuntimeError(f"none of {', '.join(names)} is set: start workers through a ddlrepro launcher")
    return default


@dataclass(frozen=True)
class RankContext:
    """This process's place in the job, read from torchrun's or Open MPI's environment conventions (Slurm tasks get
    torchrun's from rank/slurm_task.py)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    threads: int
    backend: str
    device: torch.device

    @classmethod
    def from_environment(cls, threads: int, backend: str = "auto", device: str = "backend") -> RankContext:
        """`backend`: `auto` is NCCL where this host has a GPU for each of its ranks, else gloo. `device`: `backend`
        (CUDA with NCCL, else CPU), `auto` (CUDA wherever present, whatever the backend: gloo ranks may share a
        GPU) or `cpu`."""
        rank = _env_int("RANK", "OMPI_COMM_WORLD_RANK")
        world_size = _env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")
        local_rank = _env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
        local_world_size = _env_int("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", default=1)
        gpus = cuda_device_count()
        if backend == "auto":
            backend = "nccl" if 0 < local_world_size <= gpus else "gloo"
        if backend == "mpi" and not dist.is_mpi_available():
            backend = "gloo"  # PyPI's torch has no MPI backend: MPI workloads use mpi4py beside a gloo group
        if backend == "nccl" and local_rank >= gpus:  # NCCL refuses two ranks on one GPU
            raise RuntimeError(
                f"NCCL needs a GPU per rank: local rank {local_rank} of {local_world_size} on {socket.gethostname()},"
                f" which has {gpus} GPU(s)"
            )
        on_cuda = backend == "nccl" or (device == "auto" and gpus > 0)
        place = torch.device("cuda", local_rank % gpus) if on_cuda else torch.device("cpu")
        return cls(rank, world_size, local_rank, local_world_size, threads, backend, place)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def init_distributed(ctx: RankContext, details: dict[str, Any] | None = None) -> None:
    """Set threads and device, join the process group (env:// rendezvous), and announce this worker (`details`:
    more for its worker record, e.g. its emulated device type)."""
    torch.set_num_threads(ctx.threads)
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    dist.init_process_group(ctx.backend, store=rendezvous_store(ctx.rank), rank=ctx.rank, world_size=ctx.world_size)
    emit("worker", rank=ctx.rank, **describe_worker(ctx), **(details or {}))


RENDEZVOUS_TIMEOUT = timedelta(minutes=30)  # torch's default for env:// rendezvous


def rendezvous_store(rank: int, timeout: timedelta = RENDEZVOUS_TIMEOUT) -> dist.TCPStore:
    """The job's rendezvous store at MASTER_ADDR:MASTER_PORT, as env:// makes it, except that rank 0's listens on
    MASTER_ADDR's address only: torch binds a master store to every interface whatever MASTER_ADDR says, and the
    store has no authentication. So rank 0 binds the socket itself (127.0.0.1 for a job on one host, the
    rendezvous host's own address for a multi-node one: `LISTEN_ADDRESS_ENV`) and hands it over."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout)
    handed = os.environ.pop(MASTER_LISTEN_FD_ENV, None)  # bound by the launcher before any rank started
    if handed is not None:
        return store_on(int(handed), host, port, timeout)
    return listening_store(os.environ.get(LISTEN_ADDRESS_ENV, host), port, timeout)


def listening_store(host: str, port: int, timeout: timedelta) -> dist.TCPStore:
    """A master TCPStore whose socket listens on `host`'s address only (bound here, then handed over)."""
    listener = socket.create_server((host, port), backlog=LISTEN_BACKLOG)
    return store_on(listener.detach(), host, port, timeout)


def store_on(listening_fd: int, host: str, port: int, timeout: timedelta) -> dist.TCPStore:
    """A master TCPStore serving on an already listening socket, which it owns and closes from here on."""
    return dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False, timeout=timeout, master_listen_fd=listening_fd
    )


def network_group(network: str | None) -> dist.ProcessGroup | None:
    """A gloo group whose ranks talk over `network`'s interface of their testbed host, when that is not the
    default group's (None); a collective call, in the same order on every rank. Gloo picks its interface from
    GLOO_SOCKET_IFNAME when a group is made, so it is set around the call."""
    interfaces = json.loads(os.environ.get(NETWORK_INTERFACES_ENV, "{}"))
    if network is None or (not interfaces and network == "host"):
        return None
    if network not in interfaces:
        raise ValueError(f"network {network!r}: this rank's host has {sorted(interfaces) or ['host']} only")
    default = os.environ.get("GLOO_SOCKET_IFNAME")
    if interfaces[network] == default:
        return None
    os.environ["GLOO_SOCKET_IFNAME"] = interfaces[network]
    try:
        return dist.new_group(backend="gloo")
    finally:
        if default is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = default


def describe_worker(ctx: RankContext) -> dict[str, Any]:
    """Provenance that only the worker itself can see: host, torch build, device, threads."""
    gpu = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "backend": ctx.backend,
        "device": str(ctx.device),
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "collector": startup.collector_state(),
    }


def cuda_device_count() -> int:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES applied); 0 without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class GpuProbe:
    """GPU utilisation and device memory (used, and as % of the device's) from NVML, which sees every process's
    use of the device; torch's `memory_allocated` is only this process's tensors, not what the device holds.

    The device is found by its UUID: NVML numbers every GPU of the node and ignores CUDA_VISIBLE_DEVICES (which
    Slurm and container runtimes set), so CUDA's device 0 need not be NVML's."""

    def __init__(self, device: torch.device) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(device_uuid(device))

    def sample(self) -> dict[str, float]:
        utilisation = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return {
            "gpu_utilization_percent": float(utilisation.gpu),
            "gpu_memory_bytes": float(memory.used),
            "gpu_memory_percent": 100.0 * memory.used / memory.total,
        }


def device_uuid(device: torch.device) -> str:
    """A CUDA device's UUID as NVML writes it (`GPU-…`)."""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def gpu_probe(device: torch.device) -> GpuProbe | None:
    """NVML's view of a CUDA device; None on CPU, or where NVML cannot be loaded (said once on stderr)."""
    if device.type != "cuda":
        return None
    try:
        return GpuProbe(device)
    except Exception as error:  # pynvml.NVMLError subclasses per cause; any of them means no NVML samples
        print(f"resource sampler: no GPU samples, NVML unavailable: {error}", file=sys.stderr)
        return None


def next_tick(now: float, interval_s: float) -> float:
    """The next wall-clock multiple of `interval_s` after `now`: every worker samples at the same instants."""
    return (math.floor(now / interval_s) + 1) * interval_s


class ResourceSampler(threading.Thread):
    """Samples, at wall-clock multiples of `interval_s` (so different workers' series align), this process's CPU
    and memory (absolute, % of the node, % of its allocation), the node's CPU % and memory %, and with CUDA the
    GPU's utilisation and memory (NVML), into metric records; CPU from the second tick on, so that every CPU sample
    covers one whole interval. The allocation's limits are recorded once."""

    def __init__(self, ctx: RankContext, interval_s: float, limits: AllocationLimits | None = None) -> None:
        super().__init__(name="resource-sampler", daemon=True)
        self.ctx = ctx
        self.interval_s = interval_s
        self.process = psutil.Process()
        self.stopped = threading.Event()
        self.limits = limits or allocation_limits()
        self.node_cpus = psutil.cpu_count() or 1
        self.node_memory = float(psutil.virtual_memory().total)
        self.gpu = gpu_probe(ctx.device)

    def run(self) -> None:
        self.emit_limits()
        # CPU is first read on the second tick, against a baseline taken on the first, not at start: a first
        # sample over the part of an interval left before a tick weighs as much as a whole one in a run's mean,
        # and under a CFS quota a process can spend a 100-ms period's leftover quota in it (one read 0.936 cores
        # under a 0.75-core quota, 2026-11-29). Memory is a level, not a rate: sampled from the first tick.
        if self.wait_for_tick():
            return
        self.process.cpu_percent(None)
        psutil.cpu_percent(None)
        self.emit_samples(self.level_sample())
        while not self.wait_for_tick():
            self.emit_samples(self.sample())

    def wait_for_tick(self) -> bool:
        """Sleep until the next tick; True where the sampler was stopped meanwhile."""
        return self.stopped.wait(max(0.0, next_tick(time.time(), self.interval_s) - time.time()))

    def emit_samples(self, values: dict[str, float]) -> None:
        for metric, value in values.items():
            emit("metric", rank=self.ctx.rank, metric=metric, value=value, iteration=None)

    def emit_limits(self) -> None:
        limits = {
            "node_cpus": (float(self.node_cpus), "psutil"),
            "node_memory_bytes": (self.node_memory, "psutil"),
            "allocation_cpu_cores": (self.limits.cpu_cores, self.limits.cpu_source),
            "allocation_memory_bytes": (self.limits.memory_bytes, self.limits.memory_source),
        }
        for metric, (value, source) in limits.items():
            if value is not None:
                emit("metric", rank=self.ctx.rank, metric=metric, value=value, iteration=None, detail=source)

    def sample(self) -> dict[str, float]:
        """CPU since the last call (this process's and the node's) and the levels of `level_sample`."""
        cores = self.process.cpu_percent(None) / 100
        values = {
            "cpu_percent": 100 * cores,
            "cpu_percent_of_node": 100 * cores / self.node_cpus,
            "node_cpu_percent": psutil.cpu_percent(None),
        }
        if self.limits.cpu_cores:
            values["cpu_percent_of_allocation"] = 100 * cores / self.limits.cpu_cores
        return values | self.level_sample()

    def level_sample(self) -> dict[str, float]:
        """Memory (this process's and the node's) and, with CUDA, the GPU's utilisation and memory."""
        values = self.memory()
        values |= {
            "memory_percent_of_node": 100 * values["rss_bytes"] / self.node_memory,
            "node_memory_percent": psutil.virtual_memory().percent,
        }
        if self.limits.memory_bytes:
            values["memory_percent_of_allocation"] = 100 * values["rss_bytes"] / self.limits.memory_bytes
        if self.gpu is not None:
            values |= self.gpu.sample()
            values["torch_allocated_bytes"] = float(torch.cuda.memory_allocated(self.ctx.device))
        return values

    def memory(self) -> dict[str, float]:
        """RSS and PSS; RSS alone (PSS left out, not recorded) where reading this process's smaps is denied."""
        # PSS (smaps_rollup) charges each shared page (libtorch) to its sharers in part: summed over a job's
        # processes it counts those pages once, where RSS counts them in every process. Locked-down containers
        # may deny smaps; the exception would end this thread and lose RSS too.
        try:
            memory = self.process.memory_full_info()
        except psutil.AccessDenied:
            return {"rss_bytes": float(self.process.memory_info().rss)}
        return {"rss_bytes": float(memory.rss), "pss_bytes": float(memory.pss)}

    def __enter__(self) -> ResourceSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join()
