"""A point's launch: how its ranks start and what the host must give them, as one typed, torch-free value (in the
spirit of TorchX's `Role`). Launchers, `run_point` and the workflow's rules read a point through `launch_of` only:
a new workload feature changes this module, not every launcher.

The value is derived from the point's params (the figures write them, and the point's id hashes them), so adding
it changed no point id; the params stay the workload's, and this is the one place the host side reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from ddlrepro.points import Point
from ddlrepro.rank import devicetypes
from ddlrepro.rank.elastic.schedule import largest_cluster

RankStart = Literal["ranks", "horovod-gloo", "mpirun"]
"""`ranks`: one process per rank, started by the launcher (torch, TensorFlow); `horovod-gloo`: Horovod's gloo
controller, its rendezvous served by the launcher; `mpirun`: Open MPI's launcher (Horovod over MPI, MPI's own
all-reduce)."""
Runtime = Literal["inplace", "torchrun", "ddp"]
"""The elastic runtime a resizing point runs under (launchers/hosting.py); a fixed-size point has none."""
DataSource = Literal["synthetic", "local", "s3", "s3fs"]
Network = Literal["bridge", "overlay"]


@dataclass(frozen=True)
class TestbedHosts:
    """Ranks one per testbed host (network namespaces, root), with an extra host sending competing traffic."""

    __test__ = False  # not a pytest test class despite its name

    hosts: int
    network: Network
    link_rate: str | None
    traffic: dict[str, Any] | None


@dataclass(frozen=True)
class ElasticStart:
    """How an elastic run starts and how large it grows: its runtime starts `initial_workers` with `standby` warm
    processes beside them, and acts out `schedule` (rank/elastic/schedule.py) up to `largest_cluster` workers."""

    initial_workers: int
    standby: int
    largest_cluster: int
    schedule: str | None


@dataclass(frozen=True)
class HostEnvironment:
    """Where biggan-profiles places a run (environments.py): Slurm, or a limited container, with or without a
    CPU-heavy neighbour container beside it."""

    name: str
    kind: str
    container: dict[str, Any] | None  # the container's limits (cpus, memory)
    neighbour: dict[str, Any] | None  # the neighbour's (cpus)


@dataclass(frozen=True)
class Launch:
    """How a point's ranks start, where, and what must exist or be allowed first."""

    ranks: RankStart
    tensorflow_cluster: bool  # TF_CONFIG for every rank, the ports of a TensorFlow cluster
    runtime: Runtime | None
    elastic: ElasticStart | None  # with a runtime
    peak_workers: int  # processes alive at once at most (an elastic run's start or largest cluster, standbys too)
    testbed: TestbedHosts | None
    data_source: DataSource
    nccl: bool  # needs CUDA, a GPU per rank on a host
    horovod_build: bool  # the project's Horovod build must exist first (results/software/horovod.txt)
    cifar10: bool  # CIFAR-10's files must be in its data folder first (fetched where `download` allows)
    resumes: str | None  # the id of the point whose checkpoint it continues (run first)
    checkpoint_interval: int | None  # a workload that checkpoints resumes from its own checkpoint on a retry
    environment: HostEnvironment | None
    rank_variables: tuple[dict[str, str], ...]  # per rank: what its emulated device type sets ({}: untyped)
    cpu_quotas: dict[int, float]  # the cores each throttled rank may use (emulated device types' quotas)

    @property
    def needs_namespaces(self) -> bool:
        return self.testbed is not None


def launch_of(point: Point) -> Launch:
    """The launch `point` needs, from its params (ValueError naming a value that is not one a launch knows)."""
    params = point.params
    runtime = known(params.get("elastic"), Runtime, "elastic")
    elastic = read_elastic(params) if runtime else None
    return Launch(
        ranks=rank_start(params),
        tensorflow_cluster=params.get("framework") == "tensorflow",
        runtime=runtime,
        elastic=elastic,
        peak_workers=point.workers if elastic is None else elastic_peak(elastic),
        testbed=testbed_hosts(params),
        data_source=known(params.get("data_source", "synthetic"), DataSource, "data_source") or "synthetic",
        nccl=params.get("backend") == "nccl",
        horovod_build=params.get("framework") == "horovod",
        cifar10=params.get("dataset") == "cifar10",
        resumes=params.get("resume_from"),
        checkpoint_interval=params.get("checkpoint_interval"),
        environment=host_environment(params),
        rank_variables=tuple(devicetypes.rank_environment(params, rank) for rank in range(point.workers)),
        cpu_quotas=cpu_quotas(params, point.workers),
    )


def host_environment(params: dict[str, Any]) -> HostEnvironment | None:
    if not params.get("environment_kind"):
        return None
    kind = params["environment_kind"]
    return HostEnvironment(params["environment"], kind, params.get("container"), params.get("neighbour"))


def cpu_quotas(params: dict[str, Any], workers: int) -> dict[int, float]:
    quotas = {rank: devicetypes.rank_quota(params, rank) for rank in range(workers)}
    return {rank: cores for rank, cores in quotas.items() if cores is not None}


def rank_start(params: dict[str, Any]) -> RankStart:
    if params.get("framework") == "horovod":
        return "mpirun" if params.get("horovod_controller", "gloo") == "mpi" else "horovod-gloo"
    return "mpirun" if params.get("backend") == "mpi" else "ranks"


def elastic_start(point: Point) -> ElasticStart:
    """How an elastic point starts (ValueError for a fixed-size one)."""
    elastic = launch_of(point).elastic
    if elastic is None:
        raise ValueError(f"point {point.id} is not elastic (no `elastic` runtime)")
    return elastic


def read_elastic(params: dict[str, Any]) -> ElasticStart:
    return ElasticStart(params["initial_workers"], params["standby"], largest_cluster(params), params.get("schedule"))


def elastic_peak(elastic: ElasticStart) -> int:
    """An elastic run starts its initial workers and its warm standbys; a grow takes idle standbys first and starts
    a process only for the rest, and leavers return to the pool (or, with no pool, exit), so no more processes are
    ever alive than the start's or the largest cluster's, whether a schedule or a policy resizes it."""
    return max(elastic.largest_cluster, elastic.initial_workers + elastic.standby)


def testbed_hosts(params: dict[str, Any]) -> TestbedHosts | None:
    hosts = params.get("testbed_hosts")
    if not hosts:
        return None
    network = known(params.get("network", "bridge"), Network, "network")
    return TestbedHosts(hosts, cast(Network, network), params.get("link_rate"), params.get("traffic"))


def known(value: Any, kind: Any, key: str) -> Any:
    """`value` when it is None or one of the Literal `kind`'s values; ValueError naming `key` otherwise."""
    if value is not None and value not in get_args(kind):
        raise ValueError(f"{key} {value!r}: not one of {', '.join(get_args(kind))}")
    return value
