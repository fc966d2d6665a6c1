"""A point's job as Kubernetes manifests (an Indexed Job with its Service, or a PyTorchJob; a NetworkPolicy
for either) and the environment each rank gets; nothing here contacts a cluster."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Self, TypedDict, cast

from kubernetes import client

from ddlrepro.host.config import ConfigError
from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers.base import WorkerSpec
from ddlrepro.points import Point

RUN_LABEL = "ddlrepro/run"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


class CustomResource(TypedDict):
    group: str
    version: str
    plural: str


PYTORCHJOB = CustomResource(group="kubeflow.org", version="v1", plural="pytorchjobs")
POD_RUN_DIR = "/tmp/ddlrepro-run"
UNPRIVILEGED_ID = 65534  # nobody/nogroup: ranks run as no user of the image


@dataclass(frozen=True)
class KubernetesOptions:
    """`launcher` (timeout) and `launcher.kubernetes`."""

    timeout_s: float
    namespace: str
    context: str | None
    kind: str
    image: str | None
    registry: str | None
    image_pull_secrets: list[str]
    service_account: str | None
    cpu_per_worker: float | None
    memory_mb_per_worker: int
    gpus_per_worker: int
    max_pods: int | None
    port: int
    startup_retries: int
    poll_interval_s: float
    pod_start_timeout_s: float

    @classmethod
    def from_config(cls, config: dict[str, Any], image: dict[str, Any] | None = None) -> Self:
        """The pods run `launcher.kubernetes.image` (pushed by you), not an image the workflow builds."""
        if config["images"]["build"] == "apptainer":
            raise ConfigError(
                "images.build: apptainer images are not run by the kubernetes launcher (launcher.name); use slurm, "
                "or images.build: podman, docker or null"
            )
        return cls(timeout_s=config["launcher"]["timeout_s"], **config["launcher"]["kubernetes"])


@dataclass(frozen=True)
class KubernetesRequest:
    """What a run applies: the manifests (in the namespace, through the context), the job's name and kind, the
    image its pods run, and the environment each rank gets (for the record: the manifests set it)."""

    namespace: str
    context: str | None
    kind: str
    name: str
    image: str
    master_addr: str
    master_port: int
    manifests: list[dict[str, Any]]
    workers: list[WorkerSpec]


def job_name(point: Point) -> str:
    """A DNS-1035 label naming the job, its service and (with the index) its pods."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"ddlrepro-{point.id}".lower()).strip("-")
    return name[:52].rstrip("-")


def image_reference(options: KubernetesOptions) -> str:
    """`image`, prefixed with `registry` unless it names its own registry."""
    if not options.image:
        raise ValueError("launcher.kubernetes.image is not set: name the training image the pods run")
    first = options.image.split("/", 1)[0]
    has_registry = "/" in options.image and ("." in first or ":" in first or first == "localhost")
    if not options.registry or has_registry:
        return options.image
    return f"{options.registry.rstrip('/')}/{options.image}"


def request(point: Point, options: KubernetesOptions) -> KubernetesRequest:
    name = job_name(point)
    master = f"{name}-0.{name}"
    if options.kind == "pytorchjob":
        manifests = [network_policy_manifest(options, name), pytorchjob_manifest(point, options, name)]
    else:
        manifests = [
            network_policy_manifest(options, name),
            service_manifest(options, name),
            indexed_job_manifest(point, options, name),
        ]
    workers = [
        WorkerSpec(rank, worker_command(point), {**rank_env(point, options, master), "RANK": str(rank)})
        for rank in range(point.workers)
    ]
    return KubernetesRequest(
        namespace=options.namespace,
        context=options.context,
        kind=options.kind,
        name=name,
        image=image_reference(options),
        master_addr=master,
        master_port=options.port,
        manifests=manifests,
        workers=workers,
    )


def worker_command(point: Point) -> list[str]:
    return ["python", "-m", "ddlrepro.rank.workloads", point.to_json()]


def rank_env(point: Point, options: KubernetesOptions, master: str) -> dict[str, str]:
    """What every rank's container gets beside its RANK (the PyTorchJob operator sets the rendezvous itself)."""
    env = {
        "WORLD_SIZE": str(point.workers),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "DDLREPRO_RUN_DIR": POD_RUN_DIR,
        "HOME": "/tmp",  # the unprivileged user has no home of its own in the image
    }
    if options.kind == "job":
        env = {"MASTER_ADDR": master, "MASTER_PORT": str(options.port), **env}
    return env


def resources(point: Point, options: KubernetesOptions) -> client.V1ResourceRequirements:
    """The same requests and limits (CPU, memory, GPUs) for every worker: a Guaranteed pod, stable timings."""
    amounts = {
        "cpu": str(options.cpu_per_worker or point.threads_per_worker),
        "memory": f"{options.memory_mb_per_worker}Mi",
    }
    if options.gpus_per_worker:
        amounts["nvidia.com/gpu"] = str(options.gpus_per_worker)
    return client.V1ResourceRequirements(requests=dict(amounts), limits=dict(amounts))


def container(point: Point, options: KubernetesOptions, name: str, container_name: str) -> client.V1Container:
    env = [
        client.V1EnvVar(name=key, value=value) for key, value in rank_env(point, options, f"{name}-0.{name}").items()
    ]
    if options.kind == "job":
        index = client.V1ObjectFieldSelector(field_path=f"metadata.annotations['{INDEX_ANNOTATION}']")
        env.append(client.V1EnvVar(name="RANK", value_from=client.V1EnvVarSource(field_ref=index)))
    return client.V1Container(
        name=container_name,
        image=image_reference(options),
        image_pull_policy="IfNotPresent",
        command=worker_command(point),
        env=env,
        ports=[client.V1ContainerPort(name="rendezvous", container_port=options.port)],
        resources=resources(point, options),
        security_context=client.V1SecurityContext(
            allow_privilege_escalation=False, capabilities=client.V1Capabilities(drop=["ALL"])
        ),
    )


def pod_template(point: Point, options: KubernetesOptions, name: str, container_name: str) -> client.V1PodTemplateSpec:
    spec = client.V1PodSpec(
        restart_policy="Never",
        containers=[container(point, options, name, container_name)],
        image_pull_secrets=[client.V1LocalObjectReference(name=s) for s in options.image_pull_secrets] or None,
        service_account_name=options.service_account,
        subdomain=name if options.kind == "job" else None,
        enable_service_links=False,
        # Ranks need no API access, no root and no privilege: training writes only under /tmp.
        automount_service_account_token=False,
        security_context=client.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=UNPRIVILEGED_ID,
            run_as_group=UNPRIVILEGED_ID,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
    )
    return client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels={RUN_LABEL: name}), spec=spec)


def metadata(options: KubernetesOptions, name: str) -> client.V1ObjectMeta:
    labels = {RUN_LABEL: name, "app.kubernetes.io/name": "ddlrepro"}
    return client.V1ObjectMeta(name=name, namespace=options.namespace, labels=labels)


def service_manifest(options: KubernetesOptions, name: str) -> dict[str, Any]:
    """Headless Service giving each pod of the job a DNS name, published before the pods are ready."""
    service = client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=metadata(options, name),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            selector={RUN_LABEL: name},
            publish_not_ready_addresses=True,
            ports=[client.V1ServicePort(name="rendezvous", port=options.port, target_port=options.port)],
        ),
    )
    return serialize(service)


def network_policy_manifest(options: KubernetesOptions, name: str) -> dict[str, Any]:
    """Only the run's own pods reach the run's pods (the rendezvous port and the ports gloo's pairs pick alike);
    where the cluster's network plugin enforces NetworkPolicies, no other pod of the namespace can."""
    own_pods = client.V1LabelSelector(match_labels={RUN_LABEL: name})
    policy = client.V1NetworkPolicy(
        api_version="networking.k8s.io/v1",
        kind="NetworkPolicy",
        metadata=metadata(options, name),
        spec=client.V1NetworkPolicySpec(
            pod_selector=own_pods,
            policy_types=["Ingress"],
            ingress=[client.V1NetworkPolicyIngressRule(_from=[client.V1NetworkPolicyPeer(pod_selector=own_pods)])],
        ),
    )
    return serialize(policy)


def indexed_job_manifest(point: Point, options: KubernetesOptions, name: str) -> dict[str, Any]:
    """N pods, indices 0..N-1 as ranks; no Kubernetes retries (a lost rank cannot rejoin a gloo/NCCL group)."""
    job = client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=metadata(options, name),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=point.workers,
            parallelism=point.workers,
            backoff_limit=0,
            active_deadline_seconds=max(1, int(options.timeout_s)),
            template=pod_template(point, options, name, "worker"),
        ),
    )
    return serialize(job)


def pytorchjob_manifest(point: Point, options: KubernetesOptions, name: str) -> dict[str, Any]:
    """Kubeflow training operator job: Master is rank 0, Workers ranks 1..N-1."""
    template = serialize(pod_template(point, options, name, "pytorch"))
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if point.workers > 1:
        replicas["Worker"] = {"replicas": point.workers - 1, "restartPolicy": "Never", "template": template}
    return {
        "apiVersion": f"{PYTORCHJOB['group']}/{PYTORCHJOB['version']}",
        "kind": "PyTorchJob",
        "metadata": serialize(metadata(options, name)),
        "spec": {
            "runPolicy": {
                "cleanPodPolicy": "None",
                "backoffLimit": 0,
                "activeDeadlineSeconds": max(1, int(options.timeout_s)),
            },
            "pytorchReplicaSpecs": replicas,
        },
    }


def serialize(obj: Any) -> dict[str, Any]:
    """A typed client object as the JSON the API server receives (camelCase keys, no nulls)."""
    serialised = client.ApiClient().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]  # untyped in the client
    return cast("dict[str, Any]", serialised)


def check_cluster_limits(point: Point, options: KubernetesOptions) -> None:
    """Refuse a point needing more pods than the declared `max_pods` (checked only if set)."""
    pods = launch_of(point).peak_workers
    if options.max_pods is not None and pods > options.max_pods:
        raise ConfigError(
            f"{point.figure} point {point.id}: needs {pods} pods, over launcher.kubernetes.max_pods {options.max_pods}"
        )
