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

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from kubernetes import client

from ddlrepro.host.config import ConfigError
from ddlrepro.host.launchers.base import CpuCounter, JobSpec, RunFailed, WorkerSpec
from ddlrepro.host.launchers.hosting import peak_workers
from ddlrepro.host.redaction import redact
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point

RUN_LABEL = "ddlrepro/run"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
PYTORCHJOB = {"group": "kubeflow.org", "version": "v1", "plural": "pytorchjobs"}
POD_RUN_DIR = "/tmp/ddlrepro-run"
UNPRIVILEGED_ID = 65534  # nobody/nogroup: ranks run as no user of the image
LOG_TAIL_LINES = 20
DELETE_GRACE_S = 60
# A worker that gives up before the master is reachable: its DNS record or its listening socket is not there yet.
STARTUP_RACES = re.compile(
    r"Name or service not known|Temporary failure in name resolution|No address associated with hostname"
    r"|gai error|Connection refused"
)
IMAGE_PROBLEMS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
VOLUME_PROBLEMS = ("FailedMount", "FailedAttachVolume")
# The kubelet's and the attach-detach controller's messages name a volume as `volume "<name>"` (the pod's volume,
# or the PersistentVolume: pvc-<uid>) or list the pod's volumes: `unmounted volumes=[data cache]`.
VOLUME_IN_MESSAGE = re.compile(r'volume "([^"]+)"|unmounted volumes=\[([^\]]*)\]')
CLAIM_IN_MESSAGE = re.compile(r'persistentvolumeclaim "([^"]+)"', re.IGNORECASE)


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


class KubernetesLauncher:
    """A point's N workers as N pods of one job (see the module's docstring)."""

    name: ClassVar[str] = "kubernetes"
    elastic_runtimes: ClassVar[frozenset[str]] = frozenset()
    options_type: ClassVar[type[KubernetesOptions]] = KubernetesOptions
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
    return client.ApiClient().sanitize_for_serialization(obj)


@dataclass
class Apis:
    """The client APIs this launcher calls (real: `connect()`; the tests pass fakes with the same methods)."""

    core: client.CoreV1Api
    batch: client.BatchV1Api
    custom: client.CustomObjectsApi
    networking: client.NetworkingV1Api


def connect(context: str | None = None) -> Apis:
    """The in-cluster service account when running in a pod, else the kubeconfig (its current or named context)."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(context=context)
    return Apis(client.CoreV1Api(), client.BatchV1Api(), client.CustomObjectsApi(), client.NetworkingV1Api())


def execute(spec: JobSpec[KubernetesRequest], options: KubernetesOptions, output: OutputCollector, apis: Apis) -> None:
    """Apply, wait, collect, delete; start again after a start-up race; raise RunFailed naming the failed rank."""
    job = spec.request
    deadline = time.monotonic() + spec.timeout_s
    for attempt in range(options.startup_retries + 1):
        last = attempt == options.startup_retries
        apply(apis, job, options)
        try:
            outcome = wait(apis, spec, options, deadline)
            pods = collect_logs(apis, job, output, attempt, file_lines=outcome.raced is None or last)
        finally:
            left = delete(apis, job, options)
            if left:
                output.add_line(-1, "stderr", f"could not delete {', '.join(left)}: delete them with kubectl")
        if outcome.raced is None or last:
            break
        output.add_line(-1, "stderr", f"pod {outcome.raced} failed in a start-up race; starting the job again")
    finish(job, outcome, pods)


@dataclass
class Outcome:
    """How a job ended: succeeded, or the first failed pod (and whether it failed in a start-up race)."""

    succeeded: bool
    failed_pod: str | None = None
    reason: str = ""
    raced: str | None = None


def apply(apis: Apis, job: KubernetesRequest, options: KubernetesOptions) -> None:
    """Create the objects; objects of the same name (left by a killed launcher, or still terminating) are deleted
    first, and creation waits until they are gone: the API server refuses a name that still exists (409)."""
    try:
        create(apis, job)
    except client.ApiException as error:
        if error.status != 409:
            raise
        left = delete(apis, job, options)
        if left:
            raise RunFailed(
                None, f"cannot start: objects of an earlier run are still there: {', '.join(left)}", []
            ) from None
        create(apis, job)


def create(apis: Apis, job: KubernetesRequest) -> None:
    namespace = job.namespace
    for manifest in job.manifests:
        if manifest["kind"] == "NetworkPolicy":
            apis.networking.create_namespaced_network_policy(namespace, manifest)
        elif manifest["kind"] == "Service":
            apis.core.create_namespaced_service(namespace, manifest)
        elif manifest["kind"] == "Job":
            apis.batch.create_namespaced_job(namespace, manifest)
        else:
            apis.custom.create_namespaced_custom_object(**PYTORCHJOB, namespace=namespace, body=manifest)


def list_pods(apis: Apis, job: KubernetesRequest) -> list[client.V1Pod]:
    selector = f"{RUN_LABEL}={job.name}"
    return list(apis.core.list_namespaced_pod(job.namespace, label_selector=selector).items)


def pod_rank(pod: client.V1Pod) -> int:
    """Indexed Job: the completion index; PyTorchJob: Master 0, Worker i → i + 1."""
    annotations = pod.metadata.annotations or {}
    labels = pod.metadata.labels or {}
    if INDEX_ANNOTATION in annotations:
        return int(annotations[INDEX_ANNOTATION])
    if labels.get(REPLICA_TYPE_LABEL, "").lower() == "master":
        return 0
    if REPLICA_INDEX_LABEL in labels:
        return int(labels[REPLICA_INDEX_LABEL]) + 1
    raise RunFailed(None, f"cannot tell the rank of pod {pod.metadata.name}", [])


def wait(apis: Apis, spec: JobSpec[KubernetesRequest], options: KubernetesOptions, deadline: float) -> Outcome:
    """Poll the pods until all N succeeded, one failed or did not start in time, or the deadline passed."""
    job = spec.request
    first_seen: dict[str, float] = {}  # when each pod was first listed (this machine's clock, not the API server's)
    while True:
        pods = list_pods(apis, job)
        for pod in pods:
            first_seen.setdefault(pod.metadata.name, time.monotonic())
        outcome = pods_outcome(apis, job, options, pods) or start_outcome(apis, job, options, pods, first_seen)
        if outcome is not None:
            return outcome
        if time.monotonic() > deadline:
            phases = ", ".join(f"{pod.metadata.name} {pod.status.phase}" for pod in pods) or "no pods"
            return Outcome(False, reason=f"timed out after {spec.timeout_s:g} s ({phases})")
        time.sleep(options.poll_interval_s)


def pods_outcome(
    apis: Apis, job: KubernetesRequest, options: KubernetesOptions, pods: list[client.V1Pod]
) -> Outcome | None:
    for pod in pods:
        if pod.status.phase == "Failed":
            log = read_log(apis, job, pod)
            raced = pod.metadata.name if STARTUP_RACES.search(log) else None
            return Outcome(False, pod.metadata.name, describe_failure(pod), raced)
        waiting = image_problem(pod)
        if waiting:
            secrets = ", ".join(options.image_pull_secrets) or "none"
            return Outcome(False, pod.metadata.name, f"cannot start: {waiting} (pull secrets: {secrets})")
    succeeded = [pod for pod in pods if pod.status.phase == "Succeeded"]
    return Outcome(True) if len(succeeded) >= len(job.workers) else None


def start_outcome(
    apis: Apis, job: KubernetesRequest, options: KubernetesOptions, pods: list[client.V1Pod], first_seen: dict
) -> Outcome | None:
    """The first pod still Pending `pod_start_timeout_s` after it was first listed, as a failure saying why."""
    now = time.monotonic()
    for pod in pods:
        if pod.status.phase == "Pending" and now - first_seen[pod.metadata.name] >= options.pod_start_timeout_s:
            return Outcome(False, pod.metadata.name, start_failure(apis, job, options, pod))
    return None


def start_failure(apis: Apis, job: KubernetesRequest, options: KubernetesOptions, pod: client.V1Pod) -> str:
    """Why `pod` did not start, from its events: the latest FailedMount or FailedAttachVolume with the volume and
    its claim, else the latest event."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={pod.metadata.name}"
    events = sorted(apis.core.list_namespaced_event(job.namespace, field_selector=selector).items, key=event_time)
    head = f"did not start: still {pending_state(pod)} after {options.pod_start_timeout_s:g} s"
    volume_events = [event for event in events if event.reason in VOLUME_PROBLEMS]
    if volume_events:
        event = volume_events[-1]
        volume, claim = volume_and_claim(event.message or "", pod)
        return f"{head}: {event.reason} for volume {volume} (claim {claim}): {event.message}"
    if events:
        return f"{head}; its last event: {events[-1].reason}: {events[-1].message}"
    return f"{head}; it has no events"


def event_time(event: client.CoreV1Event) -> float:
    """When an event last happened (a repeated event keeps one object, its count and last time raised): the API
    server lists events by name, not time."""
    when = event.last_timestamp or event.event_time or event.first_timestamp
    return when.timestamp() if when else 0.0


def pending_state(pod: client.V1Pod) -> str:
    """Pending, with its container's waiting reason (ContainerCreating) when it has one."""
    for status in pod.status.container_statuses or []:
        if status.state and status.state.waiting and status.state.waiting.reason:
            return f"Pending ({status.state.waiting.reason})"
    return "Pending"


def volume_and_claim(message: str, pod: client.V1Pod) -> tuple[str, str]:
    """The volume an event's message names and its PersistentVolumeClaim: the pod's volume of that name, or the
    claim the message names; a volume the pod does not know by that name (a PersistentVolume, pvc-<uid>) falls back
    to the pod's volumes' claims."""
    claims = {
        volume.name: volume.persistent_volume_claim.claim_name
        for volume in (pod.spec.volumes or [])
        if volume.persistent_volume_claim
    }
    named = [name for found in VOLUME_IN_MESSAGE.findall(message) for name in " ".join(found).split()]
    for name in named:
        if name in claims:
            return f'"{name}"', f'"{claims[name]}"'
    in_message = CLAIM_IN_MESSAGE.search(message)
    claim = f'"{in_message.group(1)}"' if in_message else ", ".join(f'"{claim}"' for claim in claims.values())
    volume = f'"{named[0]}"' if named else ", ".join(f'"{name}"' for name in claims) or "(not named)"
    return volume, claim or "none among the pod's volumes"


def image_problem(pod: client.V1Pod) -> str | None:
    """Why a pending pod's container cannot start (image pull, bad reference, missing secret), if it cannot."""
    for status in pod.status.container_statuses or []:
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason in IMAGE_PROBLEMS:
            return f"{waiting.reason} for image {status.image}: {waiting.message or ''}".rstrip(": ")
    return None


def describe_failure(pod: client.V1Pod) -> str:
    for status in pod.status.container_statuses or []:
        terminated = status.state.terminated if status.state else None
        if terminated and terminated.exit_code:
            return f"exited with code {terminated.exit_code} ({terminated.reason or 'Error'})"
    return f"failed ({pod.status.reason or 'no reason given'})"


def read_log(apis: Apis, job: KubernetesRequest, pod: client.V1Pod) -> str:
    container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else None
    return apis.core.read_namespaced_pod_log(pod.metadata.name, job.namespace, container=container)


def collect_logs(
    apis: Apis, job: KubernetesRequest, output: OutputCollector, attempt: int, file_lines: bool
) -> dict[str, tuple[int, list[str]]]:
    """Save every pod's log under `pods/` (secrets redacted); file its lines under its rank when `file_lines`."""
    folder = output.run_dir / "pods" / f"attempt-{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    pods: dict[str, tuple[int, list[str]]] = {}
    for pod in sorted(list_pods(apis, job), key=pod_rank):
        rank, text = pod_rank(pod), redact(read_log(apis, job, pod))
        (folder / f"{pod.metadata.name}.log").write_text(text)
        lines = text.splitlines()
        pods[pod.metadata.name] = (rank, lines)
        for line in lines if file_lines else []:
            output.add_line(rank, "stdout", line)
    return pods


def delete(apis: Apis, job: KubernetesRequest, options: KubernetesOptions) -> list[str]:
    """Delete the job (its pods with it, in the foreground) and the service, and wait until they are gone (they
    linger while terminating); return what is still there after DELETE_GRACE_S (e.g. held by a finalizer)."""
    namespace, name = job.namespace, job.name
    body = client.V1DeleteOptions(propagation_policy="Foreground")
    for manifest in job.manifests:
        if manifest["kind"] == "NetworkPolicy":
            _ignore_missing(apis.networking.delete_namespaced_network_policy, name, namespace)
        elif manifest["kind"] == "Service":
            _ignore_missing(apis.core.delete_namespaced_service, name, namespace)
        elif manifest["kind"] == "Job":
            _ignore_missing(apis.batch.delete_namespaced_job, name, namespace, body=body)
        else:
            _ignore_missing(apis.custom.delete_namespaced_custom_object, **PYTORCHJOB, namespace=namespace, name=name)
    until = time.monotonic() + DELETE_GRACE_S
    while (left := remaining(apis, job)) and time.monotonic() < until:
        time.sleep(options.poll_interval_s)
    return left


def remaining(apis: Apis, job: KubernetesRequest) -> list[str]:
    """The run's objects and pods that still exist (terminating ones included), as 'Kind namespace/name'."""
    namespace, name = job.namespace, job.name
    readers = {
        "NetworkPolicy": lambda: apis.networking.read_namespaced_network_policy(name, namespace),
        "Service": lambda: apis.core.read_namespaced_service(name, namespace),
        "Job": lambda: apis.batch.read_namespaced_job(name, namespace),
        "PyTorchJob": lambda: apis.custom.get_namespaced_custom_object(**PYTORCHJOB, namespace=namespace, name=name),
    }
    left = [
        f"{manifest['kind']} {namespace}/{name}" for manifest in job.manifests if _exists(readers[manifest["kind"]])
    ]
    return left + [f"Pod {namespace}/{pod.metadata.name}" for pod in list_pods(apis, job)]


def _exists(read: Any) -> bool:
    try:
        read()
    except client.ApiException as error:
        if error.status != 404:
            raise
        return False
    return True


def _ignore_missing(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except client.ApiException as error:
        if error.status != 404:
            raise


def finish(request: KubernetesRequest, outcome: Outcome, pods: dict[str, tuple[int, list[str]]]) -> None:
    """Raise RunFailed for a job that did not succeed, naming the pod, its rank and the tail of its log."""
    if outcome.succeeded:
        return
    job = f"Kubernetes {request.kind} {request.namespace}/{request.name}"
    if outcome.failed_pod is None:
        raise RunFailed(None, f"{job} {outcome.reason}", [])
    rank, lines = pods.get(outcome.failed_pod, (None, []))
    raced = " (a start-up race; no retries left)" if outcome.raced else ""
    raise RunFailed(rank, f"pod {outcome.failed_pod} of {job} {outcome.reason}{raced}", lines[-LOG_TAIL_LINES:])


def check_cluster_limits(point: Point, options: KubernetesOptions) -> None:
    """Refuse a point needing more pods than the declared `max_pods` (checked only if set)."""
    pods = peak_workers(point)
    if options.max_pods is not None and pods > options.max_pods:
        raise ConfigError(
            f"{point.figure} point {point.id}: needs {pods} pods, over launcher.kubernetes.max_pods {options.max_pods}"
        )
