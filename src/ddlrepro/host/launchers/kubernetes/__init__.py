"""Kubernetes launcher: a point's N workers as N pods of one job, applied and watched with the kubernetes client.

Two renderings (setting `kind`): an Indexed Job (completions = parallelism = N, restartPolicy Never) with a
headless Service, so that pod 0 is reachable as `<job>-0.<service>` before it is ready; or a Kubeflow
`PyTorchJob` (one Master, N-1 Workers, container `pytorch`; the training operator sets MASTER_ADDR, RANK, …).
`execute` applies the manifests, waits for every pod with a timeout, starts the job again when a pod failed in a
known start-up race (a worker that starts before the master's DNS name resolves), files every pod's log into the
run folder, and deletes what it created. Registry credentials appear only as pull-secret *names*. A pod still
Pending after `pod_start_timeout_s` fails the run with its events read (`start_failure`): a FailedMount or
FailedAttachVolume names the volume and the PersistentVolumeClaim behind it.
Elastic runs cannot be hosted here yet (no runtime starts workers as pods on a resize).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from ddlrepro.host.launchers.base import CpuCounter, JobSpec, Options
from ddlrepro.host.launchers.kubernetes.render import (
    KubernetesOptions,
    KubernetesRequest,
    check_cluster_limits,
    image_reference,
    job_name,
    request,
)
from ddlrepro.host.launchers.kubernetes.watch import Apis, connect, execute
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point

__all__ = ["Apis", "KubernetesLauncher", "KubernetesOptions", "KubernetesRequest", "image_reference", "job_name"]


class KubernetesLauncher:
    """A point's N workers as N pods of one job (see the package's docstring)."""

    name: ClassVar[str] = "kubernetes"
    elastic_runtimes: ClassVar[frozenset[str]] = frozenset()
    options_type: ClassVar[type[Options]] = KubernetesOptions
    resource_names: tuple[str, ...] = ()

    def __init__(self, options: KubernetesOptions, apis: Apis | None = None) -> None:
        """`apis`: the cluster's client APIs (connected on first use unless given)."""
        self.options = options
        self.apis = apis

    def render(self, point: Point, run_dir: Path) -> JobSpec[KubernetesRequest]:
        """The manifests this run applies and the environment each rank gets (nothing is contacted)."""
        return JobSpec(self.name, self.options.timeout_s, request(point, self.options))

    def execute(self, spec: JobSpec[KubernetesRequest], output: OutputCollector) -> None:
        self.apis = self.apis or connect(self.options.context)
        execute(spec, self.options, output, self.apis)

    def check_fits(self, point: Point) -> None:
        check_cluster_limits(point, self.options)

    def host_cores(self, point: Point, workflow_cores: Callable[[], int]) -> int:
        """The pods run on the cluster; here only the launcher that watches them."""
        return 1

    def resources(self, point: Point) -> dict[str, Any]:
        return {}

    def own_cpu_counter(self, spec: JobSpec[Any]) -> CpuCounter:
        return "unknown: the ranks run in pods on the cluster's nodes, not on this host", None
