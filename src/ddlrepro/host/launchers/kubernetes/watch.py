"""A rendered job on the cluster: applied, its pods watched until they end (start-up races, pods that cannot
start, with their events read), every pod's log filed, everything it created deleted."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from ddlrepro.host.launchers.base import JobSpec, RunFailed
from ddlrepro.host.launchers.kubernetes.render import (
    INDEX_ANNOTATION,
    PYTORCHJOB,
    RUN_LABEL,
    KubernetesOptions,
    KubernetesRequest,
)
from ddlrepro.host.redaction import redact
from ddlrepro.host.rundir import OutputCollector

REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
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
        config.load_incluster_config()  # type: ignore[no-untyped-call]  # untyped in the client
    except config.ConfigException:
        config.load_kube_config(context=context)  # type: ignore[no-untyped-call]
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
    """Every manifest of the job, as the dict it was rendered as (the client serialises dicts as given; its type
    hints name its model classes only, hence the ignores)."""
    namespace = job.namespace
    for manifest in job.manifests:
        if manifest["kind"] == "NetworkPolicy":
            apis.networking.create_namespaced_network_policy(namespace, manifest)  # type: ignore[arg-type]  # dict body
        elif manifest["kind"] == "Service":
            apis.core.create_namespaced_service(namespace, manifest)  # type: ignore[arg-type]  # dict body
        elif manifest["kind"] == "Job":
            apis.batch.create_namespaced_job(namespace, manifest)  # type: ignore[arg-type]  # dict body
        else:
            apis.custom.create_namespaced_custom_object(**PYTORCHJOB, namespace=namespace, body=manifest)


def name_of(pod: client.V1Pod) -> str:
    """A listed pod's name (the client types every field of its models optional; the API server sets this one)."""
    return str(pod.metadata.name) if pod.metadata and pod.metadata.name else "(unnamed pod)"


def phase_of(pod: client.V1Pod) -> str:
    return str(pod.status.phase) if pod.status and pod.status.phase else "Unknown"


def container_statuses(pod: client.V1Pod) -> list[client.V1ContainerStatus]:
    return list(pod.status.container_statuses or []) if pod.status else []


def list_pods(apis: Apis, job: KubernetesRequest) -> list[client.V1Pod]:
    selector = f"{RUN_LABEL}={job.name}"
    return list(apis.core.list_namespaced_pod(job.namespace, label_selector=selector).items)


def pod_rank(pod: client.V1Pod) -> int:
    """Indexed Job: the completion index; PyTorchJob: Master 0, Worker i → i + 1."""
    annotations = (pod.metadata.annotations if pod.metadata else None) or {}
    labels = (pod.metadata.labels if pod.metadata else None) or {}
    if INDEX_ANNOTATION in annotations:
        return int(annotations[INDEX_ANNOTATION])
    if labels.get(REPLICA_TYPE_LABEL, "").lower() == "master":
        return 0
    if REPLICA_INDEX_LABEL in labels:
        return int(labels[REPLICA_INDEX_LABEL]) + 1
    raise RunFailed(None, f"cannot tell the rank of pod {name_of(pod)}", [])


def wait(apis: Apis, spec: JobSpec[KubernetesRequest], options: KubernetesOptions, deadline: float) -> Outcome:
    """Poll the pods until all N succeeded, one failed or did not start in time, or the deadline passed."""
    job = spec.request
    first_seen: dict[str, float] = {}  # when each pod was first listed (this machine's clock, not the API server's)
    while True:
        pods = list_pods(apis, job)
        for pod in pods:
            first_seen.setdefault(name_of(pod), time.monotonic())
        outcome = pods_outcome(apis, job, options, pods) or start_outcome(apis, job, options, pods, first_seen)
        if outcome is not None:
            return outcome
        if time.monotonic() > deadline:
            phases = ", ".join(f"{name_of(pod)} {phase_of(pod)}" for pod in pods) or "no pods"
            return Outcome(False, reason=f"timed out after {spec.timeout_s:g} s ({phases})")
        time.sleep(options.poll_interval_s)


def pods_outcome(
    apis: Apis, job: KubernetesRequest, options: KubernetesOptions, pods: list[client.V1Pod]
) -> Outcome | None:
    for pod in pods:
        if phase_of(pod) == "Failed":
            log = read_log(apis, job, pod)
            raced = name_of(pod) if STARTUP_RACES.search(log) else None
            return Outcome(False, name_of(pod), describe_failure(pod), raced)
        waiting = image_problem(pod)
        if waiting:
            secrets = ", ".join(options.image_pull_secrets) or "none"
            return Outcome(False, name_of(pod), f"cannot start: {waiting} (pull secrets: {secrets})")
    succeeded = [pod for pod in pods if phase_of(pod) == "Succeeded"]
    return Outcome(True) if len(succeeded) >= len(job.workers) else None


def start_outcome(
    apis: Apis,
    job: KubernetesRequest,
    options: KubernetesOptions,
    pods: list[client.V1Pod],
    first_seen: dict[str, float],
) -> Outcome | None:
    """The first pod still Pending `pod_start_timeout_s` after it was first listed, as a failure saying why."""
    now = time.monotonic()
    for pod in pods:
        if phase_of(pod) == "Pending" and now - first_seen[name_of(pod)] >= options.pod_start_timeout_s:
            return Outcome(False, name_of(pod), start_failure(apis, job, options, pod))
    return None


def start_failure(apis: Apis, job: KubernetesRequest, options: KubernetesOptions, pod: client.V1Pod) -> str:
    """Why `pod` did not start, from its events: the latest FailedMount or FailedAttachVolume with the volume and
    its claim, else the latest event."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={name_of(pod)}"
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
    for status in container_statuses(pod):
        if status.state and status.state.waiting and status.state.waiting.reason:
            return f"Pending ({status.state.waiting.reason})"
    return "Pending"


def volume_and_claim(message: str, pod: client.V1Pod) -> tuple[str, str]:
    """The volume an event's message names and its PersistentVolumeClaim: the pod's volume of that name, or the
    claim the message names; a volume the pod does not know by that name (a PersistentVolume, pvc-<uid>) falls back
    to the pod's volumes' claims."""
    claims = {
        volume.name: volume.persistent_volume_claim.claim_name
        for volume in ((pod.spec.volumes if pod.spec else None) or [])
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
    for status in container_statuses(pod):
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason in IMAGE_PROBLEMS:
            return f"{waiting.reason} for image {status.image}: {waiting.message or ''}".rstrip(": ")
    return None


def describe_failure(pod: client.V1Pod) -> str:
    for status in container_statuses(pod):
        terminated = status.state.terminated if status.state else None
        if terminated and terminated.exit_code:
            return f"exited with code {terminated.exit_code} ({terminated.reason or 'Error'})"
    reason = pod.status.reason if pod.status else None
    return f"failed ({reason or 'no reason given'})"


def read_log(apis: Apis, job: KubernetesRequest, pod: client.V1Pod) -> str:
    container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else None
    return apis.core.read_namespaced_pod_log(name_of(pod), job.namespace, container=container)


def collect_logs(
    apis: Apis, job: KubernetesRequest, output: OutputCollector, attempt: int, file_lines: bool
) -> dict[str, tuple[int, list[str]]]:
    """Save every pod's log under `pods/` (secrets redacted); file its lines under its rank when `file_lines`."""
    folder = output.run_dir / "pods" / f"attempt-{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    pods: dict[str, tuple[int, list[str]]] = {}
    for pod in sorted(list_pods(apis, job), key=pod_rank):
        rank, text = pod_rank(pod), redact(read_log(apis, job, pod))
        (folder / f"{name_of(pod)}.log").write_text(text)
        lines = text.splitlines()
        pods[name_of(pod)] = (rank, lines)
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
    return left + [f"Pod {namespace}/{name_of(pod)}" for pod in list_pods(apis, job)]


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
