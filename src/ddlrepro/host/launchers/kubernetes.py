"""Kubernetes launcher: a point's N workers as N pods of one job, applied and watched with the kubernetes client.

Two renderings (setting `kind`): an Indexed Job (completions = parallelism = N, restartPolicy Never) with a
headless Service, so that pod 0 is reachable as `<job>-0.<service>` before it is ready; or a Kubeflow
`PyTorchJob` (one Master, N-1 Workers, container `pytorch`; the training operator sets MASTER_ADDR, RANK, …).
`execute` applies the manifests, waits for every pod with a timeout, starts the job again when a pod failed in a
known start-up race (a worker that starts before the master's DNS name resolves), files every pod's log into the
run folder, and deletes what it created. Registry credentials appear only as pull-secret *names*.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from ddlrepro.host.config import ConfigError
from ddlrepro.host.launchers.base import JobSpec, RunFailed, WorkerSpec
from ddlrepro.host.launchers.local import peak_workers
from ddlrepro.host.redaction import redact
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point

RUN_LABEL = "ddlrepro/run"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
PYTORCHJOB = {"group": "kubeflow.org", "version": "v1", "plural": "pytorchjobs"}
POD_RUN_DIR = "/tmp/ddlrepro-run"
LOG_TAIL_LINES = 20
DELETE_GRACE_S = 60
# A worker that gives up before the master is reachable: its DNS record or its listening socket is not there yet.
STARTUP_RACES = re.compile(
    r"Name or service not known|Temporary failure in name resolution|No address associated with hostname"
    r"|gai error|Connection refused"
)
IMAGE_PROBLEMS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
DEFAULTS: dict[str, Any] = {
    "namespace": "default",
    "kind": "job",
    "image": None,
    "registry": None,
    "image_pull_secrets": [],
    "service_account": None,
    "cpu_per_worker": None,
    "memory_mb_per_worker": 3000,
    "gpus_per_worker": 0,
    "port": 29500,
    "startup_retries": 2,
    "poll_interval_s": 2.0,
    "context": None,
}


def job_name(point: Point) -> str:
    """A DNS-1035 label naming the job, its service and (with the index) its pods."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"ddlrepro-{point.id}".lower()).strip("-")
    return name[:52].rstrip("-")


def image_reference(settings: dict[str, Any]) -> str:
    """`image`, prefixed with `registry` unless it names its own registry."""
    image = settings.get("image")
    if not image:
        raise ValueError("launcher.kubernetes.image is not set: name the training image the pods run")
    registry = settings.get("registry")
    first = image.split("/", 1)[0]
    has_registry = "/" in image and ("." in first or ":" in first or first == "localhost")
    return image if not registry or has_registry else f"{registry.rstrip('/')}/{image}"


def render(point: Point, timeout_s: float, run_dir: Path, settings: dict[str, Any] | None = None, **_: Any) -> JobSpec:
    """The manifests this run applies and the environment each rank gets (nothing is contacted)."""
    settings = {**DEFAULTS, **(settings or {})}
    name = job_name(point)
    master = f"{name}-0.{name}"
    rendezvous = {
        "master_addr": master,
        "master_port": settings["port"],
        "namespace": settings["namespace"],
        "kind": settings["kind"],
        "name": name,
        "image": image_reference(settings),
        "startup_retries": settings["startup_retries"],
        "poll_interval_s": settings["poll_interval_s"],
        "context": settings["context"],
        "image_pull_secrets": list(settings["image_pull_secrets"]),
    }
    if settings["kind"] == "pytorchjob":
        manifests = [pytorchjob_manifest(point, settings, name, timeout_s)]
    elif settings["kind"] == "job":
        manifests = [service_manifest(settings, name), indexed_job_manifest(point, settings, name, timeout_s)]
    else:
        raise ValueError(f"launcher.kubernetes.kind: {settings['kind']!r} is not valid; valid values: job, pytorchjob")
    workers = [
        WorkerSpec(rank, worker_command(point), {**rank_env(point, settings, master, rank), "RANK": str(rank)})
        for rank in range(point.workers)
    ]
    return JobSpec("kubernetes", workers, timeout_s, rendezvous, manifests)


def worker_command(point: Point) -> list[str]:
    return ["python", "-m", "ddlrepro.rank.workloads", point.to_json()]


def rank_env(point: Point, settings: dict[str, Any], master: str, rank: int | None = None) -> dict[str, str]:
    """What every rank's container gets beside its RANK (the PyTorchJob operator sets the rendezvous itself)."""
    env = {
        "WORLD_SIZE": str(point.workers),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "DDLREPRO_RUN_DIR": POD_RUN_DIR,
    }
    if settings["kind"] == "job":
        env = {"MASTER_ADDR": master, "MASTER_PORT": str(settings["port"]), **env}
    return env


def resources(point: Point, settings: dict[str, Any]) -> client.V1ResourceRequirements:
    """The same requests and limits (CPU, memory, GPUs) for every worker: a Guaranteed pod, stable timings."""
    amounts = {
        "cpu": str(settings["cpu_per_worker"] or point.threads_per_worker),
        "memory": f"{settings['memory_mb_per_worker']}Mi",
    }
    if settings["gpus_per_worker"]:
        amounts["nvidia.com/gpu"] = str(settings["gpus_per_worker"])
    return client.V1ResourceRequirements(requests=dict(amounts), limits=dict(amounts))


def container(point: Point, settings: dict[str, Any], name: str, container_name: str) -> client.V1Container:
    env = [
        client.V1EnvVar(name=key, value=value) for key, value in rank_env(point, settings, f"{name}-0.{name}").items()
    ]
    if settings["kind"] == "job":
        index = client.V1ObjectFieldSelector(field_path=f"metadata.annotations['{INDEX_ANNOTATION}']")
        env.append(client.V1EnvVar(name="RANK", value_from=client.V1EnvVarSource(field_ref=index)))
    return client.V1Container(
        name=container_name,
        image=image_reference(settings),
        image_pull_policy="IfNotPresent",
        command=worker_command(point),
        env=env,
        ports=[client.V1ContainerPort(name="rendezvous", container_port=settings["port"])],
        resources=resources(point, settings),
    )


def pod_template(point: Point, settings: dict[str, Any], name: str, container_name: str) -> client.V1PodTemplateSpec:
    spec = client.V1PodSpec(
        restart_policy="Never",
        containers=[container(point, settings, name, container_name)],
        image_pull_secrets=[client.V1LocalObjectReference(name=s) for s in settings["image_pull_secrets"]] or None,
        service_account_name=settings["service_account"],
        subdomain=name if settings["kind"] == "job" else None,
        enable_service_links=False,
    )
    return client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels={RUN_LABEL: name}), spec=spec)


def metadata(settings: dict[str, Any], name: str) -> client.V1ObjectMeta:
    labels = {RUN_LABEL: name, "app.kubernetes.io/name": "ddlrepro"}
    return client.V1ObjectMeta(name=name, namespace=settings["namespace"], labels=labels)


def service_manifest(settings: dict[str, Any], name: str) -> dict[str, Any]:
    """Headless Service giving each pod of the job a DNS name, published before the pods are ready."""
    service = client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=metadata(settings, name),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            selector={RUN_LABEL: name},
            publish_not_ready_addresses=True,
            ports=[client.V1ServicePort(name="rendezvous", port=settings["port"], target_port=settings["port"])],
        ),
    )
    return serialize(service)


def indexed_job_manifest(point: Point, settings: dict[str, Any], name: str, timeout_s: float) -> dict[str, Any]:
    """N pods, indices 0..N-1 as ranks; no Kubernetes retries (a lost rank cannot rejoin a gloo/NCCL group)."""
    job = client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=metadata(settings, name),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=point.workers,
            parallelism=point.workers,
            backoff_limit=0,
            active_deadline_seconds=max(1, int(timeout_s)),
            template=pod_template(point, settings, name, "worker"),
        ),
    )
    return serialize(job)


def pytorchjob_manifest(point: Point, settings: dict[str, Any], name: str, timeout_s: float) -> dict[str, Any]:
    """Kubeflow training operator job: Master is rank 0, Workers ranks 1..N-1."""
    template = serialize(pod_template(point, settings, name, "pytorch"))
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if point.workers > 1:
        replicas["Worker"] = {"replicas": point.workers - 1, "restartPolicy": "Never", "template": template}
    return {
        "apiVersion": f"{PYTORCHJOB['group']}/{PYTORCHJOB['version']}",
        "kind": "PyTorchJob",
        "metadata": serialize(metadata(settings, name)),
        "spec": {
            "runPolicy": {
                "cleanPodPolicy": "None",
                "backoffLimit": 0,
                "activeDeadlineSeconds": max(1, int(timeout_s)),
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


def connect(context: str | None = None) -> Apis:
    """The in-cluster service account when running in a pod, else the kubeconfig (its current or named context)."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(context=context)
    return Apis(client.CoreV1Api(), client.BatchV1Api(), client.CustomObjectsApi())


def execute(spec: JobSpec, output: OutputCollector, apis: Apis | None = None) -> None:
    """Apply, wait, collect, delete; start again after a start-up race; raise RunFailed naming the failed rank."""
    apis = apis or connect(spec.rendezvous.get("context"))
    retries = spec.rendezvous["startup_retries"]
    deadline = time.monotonic() + spec.timeout_s
    for attempt in range(retries + 1):
        apply(apis, spec)
        try:
            outcome = wait(apis, spec, deadline)
            pods = collect_logs(apis, spec, output, attempt, file_lines=outcome.raced is None or attempt == retries)
        finally:
            left = delete(apis, spec)
            if left:
                output.add_line(-1, "stderr", f"could not delete {', '.join(left)}: delete them with kubectl")
        if outcome.raced is None or attempt == retries:
            break
        output.add_line(-1, "stderr", f"pod {outcome.raced} failed in a start-up race; starting the job again")
    finish(spec, outcome, pods)


@dataclass
class Outcome:
    """How a job ended: succeeded, or the first failed pod (and whether it failed in a start-up race)."""

    succeeded: bool
    failed_pod: str | None = None
    reason: str = ""
    raced: str | None = None


def apply(apis: Apis, spec: JobSpec) -> None:
    """Create the objects; objects of the same name (left by a killed launcher, or still terminating) are deleted
    first, and creation waits until they are gone: the API server refuses a name that still exists (409)."""
    try:
        create(apis, spec)
    except client.ApiException as error:
        if error.status != 409:
            raise
        left = delete(apis, spec)
        if left:
            raise RunFailed(
                None, f"cannot start: objects of an earlier run are still there: {', '.join(left)}", []
            ) from None
        create(apis, spec)


def create(apis: Apis, spec: JobSpec) -> None:
    namespace = spec.rendezvous["namespace"]
    for manifest in spec.manifests:
        if manifest["kind"] == "Service":
            apis.core.create_namespaced_service(namespace, manifest)
        elif manifest["kind"] == "Job":
            apis.batch.create_namespaced_job(namespace, manifest)
        else:
            apis.custom.create_namespaced_custom_object(**PYTORCHJOB, namespace=namespace, body=manifest)


def list_pods(apis: Apis, spec: JobSpec) -> list[client.V1Pod]:
    selector = f"{RUN_LABEL}={spec.rendezvous['name']}"
    return list(apis.core.list_namespaced_pod(spec.rendezvous["namespace"], label_selector=selector).items)


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


def wait(apis: Apis, spec: JobSpec, deadline: float) -> Outcome:
    """Poll the pods until all N succeeded, one failed, or the deadline passed."""
    workers = len(spec.workers)
    while True:
        pods = list_pods(apis, spec)
        outcome = pods_outcome(apis, spec, pods, workers)
        if outcome is not None:
            return outcome
        if time.monotonic() > deadline:
            phases = ", ".join(f"{pod.metadata.name} {pod.status.phase}" for pod in pods) or "no pods"
            return Outcome(False, reason=f"timed out after {spec.timeout_s:g} s ({phases})")
        time.sleep(spec.rendezvous["poll_interval_s"])


def pods_outcome(apis: Apis, spec: JobSpec, pods: list[client.V1Pod], workers: int) -> Outcome | None:
    for pod in pods:
        if pod.status.phase == "Failed":
            log = read_log(apis, spec, pod)
            raced = pod.metadata.name if STARTUP_RACES.search(log) else None
            return Outcome(False, pod.metadata.name, describe_failure(pod), raced)
        waiting = image_problem(pod)
        if waiting:
            secrets = ", ".join(spec.rendezvous["image_pull_secrets"]) or "none"
            return Outcome(False, pod.metadata.name, f"cannot start: {waiting} (pull secrets: {secrets})")
    succeeded = [pod for pod in pods if pod.status.phase == "Succeeded"]
    return Outcome(True) if len(succeeded) >= workers else None


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


def read_log(apis: Apis, spec: JobSpec, pod: client.V1Pod) -> str:
    container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else None
    return apis.core.read_namespaced_pod_log(pod.metadata.name, spec.rendezvous["namespace"], container=container)


def collect_logs(
    apis: Apis, spec: JobSpec, output: OutputCollector, attempt: int, file_lines: bool
) -> dict[str, tuple[int, list[str]]]:
    """Save every pod's log under `pods/` (secrets redacted); file its lines under its rank when `file_lines`."""
    folder = output.run_dir / "pods" / f"attempt-{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    pods: dict[str, tuple[int, list[str]]] = {}
    for pod in sorted(list_pods(apis, spec), key=pod_rank):
        rank, text = pod_rank(pod), redact(read_log(apis, spec, pod))
        (folder / f"{pod.metadata.name}.log").write_text(text)
        lines = text.splitlines()
        pods[pod.metadata.name] = (rank, lines)
        for line in lines if file_lines else []:
            output.add_line(rank, "stdout", line)
    return pods


def delete(apis: Apis, spec: JobSpec) -> list[str]:
    """Delete the job (its pods with it, in the foreground) and the service, and wait until they are gone (they
    linger while terminating); return what is still there after DELETE_GRACE_S (e.g. held by a finalizer)."""
    namespace, name = spec.rendezvous["namespace"], spec.rendezvous["name"]
    body = client.V1DeleteOptions(propagation_policy="Foreground")
    for manifest in spec.manifests:
        if manifest["kind"] == "Service":
            _ignore_missing(apis.core.delete_namespaced_service, name, namespace)
        elif manifest["kind"] == "Job":
            _ignore_missing(apis.batch.delete_namespaced_job, name, namespace, body=body)
        else:
            _ignore_missing(apis.custom.delete_namespaced_custom_object, **PYTORCHJOB, namespace=namespace, name=name)
    until = time.monotonic() + DELETE_GRACE_S
    while (left := remaining(apis, spec)) and time.monotonic() < until:
        time.sleep(spec.rendezvous["poll_interval_s"])
    return left


def remaining(apis: Apis, spec: JobSpec) -> list[str]:
    """The run's objects and pods that still exist (terminating ones included), as 'Kind namespace/name'."""
    namespace, name = spec.rendezvous["namespace"], spec.rendezvous["name"]
    readers = {
        "Service": lambda: apis.core.read_namespaced_service(name, namespace),
        "Job": lambda: apis.batch.read_namespaced_job(name, namespace),
        "PyTorchJob": lambda: apis.custom.get_namespaced_custom_object(**PYTORCHJOB, namespace=namespace, name=name),
    }
    left = [
        f"{manifest['kind']} {namespace}/{name}" for manifest in spec.manifests if _exists(readers[manifest["kind"]])
    ]
    return left + [f"Pod {namespace}/{pod.metadata.name}" for pod in list_pods(apis, spec)]


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


def finish(spec: JobSpec, outcome: Outcome, pods: dict[str, tuple[int, list[str]]]) -> None:
    """Raise RunFailed for a job that did not succeed, naming the pod, its rank and the tail of its log."""
    if outcome.succeeded:
        return
    job = f"Kubernetes {spec.rendezvous['kind']} {spec.rendezvous['namespace']}/{spec.rendezvous['name']}"
    if outcome.failed_pod is None:
        raise RunFailed(None, f"{job} {outcome.reason}", [])
    rank, lines = pods.get(outcome.failed_pod, (None, []))
    raced = " (a start-up race; no retries left)" if outcome.raced else ""
    raise RunFailed(rank, f"pod {outcome.failed_pod} of {job} {outcome.reason}{raced}", lines[-LOG_TAIL_LINES:])


def check_cluster_limits(point: Point, kubernetes: dict[str, Any]) -> None:
    """Refuse a point needing more pods than the declared `max_pods` (checked only if set)."""
    pods = peak_workers(point)
    if pods > kubernetes.get("max_pods", pods):
        raise ConfigError(
            f"{point.figure} point {point.id}: needs {pods} pods, over launcher.kubernetes.max_pods "
            f"{kubernetes['max_pods']}"
        )
