"""The Kubernetes launcher: its manifests (schema-valid for Kubernetes 1.30+, and semantically right), and its
apply / wait / collect / delete logic against recorded-shaped API responses (no cluster can run here)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import REPO, tiny_point
from kubernetes import client

from ddlrepro.host.cli import main
from ddlrepro.host.config import ConfigError, load_config, validate_config
from ddlrepro.host.figures import figure_points
from ddlrepro.host.launchers import check_points, configured_launcher, kubernetes
from ddlrepro.host.launchers.base import JobSpec, RunFailed
from ddlrepro.host.launchers.kubernetes.render import PYTORCHJOB
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.host.tables import tidy_table

RECORDED = json.loads((Path(__file__).parent / "data" / "kubernetes" / "pods.json").read_text())
VERSIONS = [f"1.{minor}.0" for minor in range(30, 38)]
SETTINGS = {
    "namespace": "ml-bench",
    "image": "ml/ddlrepro:cpu",
    "registry": "registry.example.org",
    "image_pull_secrets": ["regcred"],
    "memory_mb_per_worker": 4000,
    "gpus_per_worker": 1,
    "poll_interval_s": 0.01,
}
LOG_LINE = re.compile(r"^\[rank (\d+)(?: stderr)?\] (.*)$")


def launcher(kind: str, timeout_s: float = 600, **settings: Any) -> kubernetes.KubernetesLauncher:
    section = {**SETTINGS, "kind": kind, **settings}
    return configured_launcher({"launcher": {"name": "kubernetes", "timeout_s": timeout_s, "kubernetes": section}})


def rendered(kind: str, workers: int = 4, **settings: Any) -> JobSpec[kubernetes.KubernetesRequest]:
    return launcher(kind, **settings).render(tiny_point(workers=workers), Path("run"))


def by_kind(spec: JobSpec[kubernetes.KubernetesRequest]) -> dict[str, dict[str, Any]]:
    return {manifest["kind"]: manifest for manifest in spec.request.manifests}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def validated_objects(spec: JobSpec[kubernetes.KubernetesRequest]) -> list[dict[str, Any]]:
    """What the schemas can check: the manifests, and a PyTorchJob's pod templates as PodTemplates."""
    objects = []
    for manifest in spec.request.manifests:
        if manifest["kind"] != "PyTorchJob":
            objects.append(manifest)
            continue
        for role, replica in manifest["spec"]["pytorchReplicaSpecs"].items():
            name = f"{manifest['metadata']['name']}-{role.lower()}"
            objects.append(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": replica["template"]}
            )
    return objects


@pytest.mark.parametrize("kind", ["job", "pytorchjob"])
@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate_strictly(kind: str, version: str) -> None:
    for manifest in validated_objects(rendered(kind)):
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("kind", ["job", "pytorchjob"])
def test_pods_run_unprivileged_without_an_api_token_and_only_their_own_pods_reach_them(kind: str) -> None:
    manifests = by_kind(rendered(kind))
    if kind == "job":
        template = manifests["Job"]["spec"]["template"]
    else:
        template = manifests["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    pod = template["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    run = template["metadata"]["labels"]
    policy = manifests["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == {"matchLabels": run} and policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"from": [{"podSelector": {"matchLabels": run}}]}]


ROLE = REPO / "profiles" / "kubernetes" / "role.yaml"
API_GROUPS = {"core": "", "batch": "batch", "networking": "networking.k8s.io", "custom": PYTORCHJOB["group"]}
VERBS = {"create": "create", "read": "get", "get": "get", "list": "list", "delete": "delete"}
API_RESOURCES = {"network_policy": "networkpolicies", "pod_log": "pods/log", "custom_object": PYTORCHJOB["plural"]}


def launcher_api_calls() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every Kubernetes API call in the launcher's code (`apis.batch.create_...`)."""
    calls = set()
    for source in (REPO / "src" / "ddlrepro" / "host" / "launchers" / "kubernetes").glob("*.py"):
        for api, verb, resource in re.findall(r"apis\.(\w+)\.(\w+?)_namespaced_(\w+)", source.read_text()):
            calls.add((API_GROUPS[api], API_RESOURCES.get(resource, f"{resource}s"), VERBS[verb]))
    return calls


def test_the_documented_role_grants_exactly_what_the_launcher_calls() -> None:
    role = yaml.safe_load(ROLE.read_text())
    kubernetes_validate.validate(role, VERSIONS[-1], strict=True)
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    calls = launcher_api_calls()
    assert len(calls) >= 12 and ("", "pods/log", "get") in calls and ("", "events", "list") in calls
    assert granted == calls


def test_strict_validation_catches_a_misspelt_field() -> None:
    job = copy.deepcopy(by_kind(rendered("job"))["Job"])
    job["spec"]["parallelizm"] = 4
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.30.0", strict=True)


def test_kubernetes_validate_command_accepts_the_rendered_files(tmp_path: Path) -> None:
    paths = []
    for kind in ("job", "pytorchjob"):
        path = tmp_path / f"{kind}.yaml"
        path.write_text(yaml.safe_dump_all(validated_objects(rendered(kind))))
        paths.append(str(path))
    command = Path(sys.executable).parent / "kubernetes-validate"
    for version in ("1.30.0", "1.37.0"):
        done = subprocess.run([command, "--strict", "-k", version, *paths], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "INFO" in done.stdout and "ERROR" not in done.stdout


def test_render_command_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    config = json.dumps({"launcher": {"name": "kubernetes", "kubernetes": {**SETTINGS, "kind": "job"}}})
    main(["render", "--point", tiny_point(workers=3).to_json(), "--config-json", config])
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [document["kind"] for document in documents] == ["NetworkPolicy", "Service", "Job"]
    assert documents[2]["spec"]["completions"] == 3
    for document in documents:
        kubernetes_validate.validate(document, "1.30.0", strict=True)


def test_indexed_job_semantics() -> None:
    spec = rendered("job", workers=4)
    service, job = by_kind(spec)["Service"], by_kind(spec)["Job"]
    pod = job["spec"]["template"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["backoffLimit"] == 0
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    env = env_of(container)
    assert env["RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["WORLD_SIZE"] == "4"
    # Pod i of an Indexed Job is host <job>-<i> under the subdomain: MASTER_ADDR must name pod 0 there.
    name = job["metadata"]["name"]
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert env["MASTER_ADDR"] == f"{name}-0.{service['metadata']['name']}"
    assert env["MASTER_PORT"] == str(service["spec"]["ports"][0]["port"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert sorted(worker.rank for worker in spec.request.workers) == [0, 1, 2, 3]
    assert {worker.env["MASTER_ADDR"] for worker in spec.request.workers} == {env["MASTER_ADDR"]}


def test_resources_image_and_pull_secret_names() -> None:
    job = by_kind(rendered("job", cpu_per_worker=2))["Job"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    expected = {"cpu": "2", "memory": "4000Mi", "nvidia.com/gpu": "1"}
    assert container["resources"] == {"requests": expected, "limits": expected}
    assert container["image"] == "registry.example.org/ml/ddlrepro:cpu"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert json.loads(container["command"][-1]) == json.loads(tiny_point(workers=4).to_json())
    cpu_only = by_kind(rendered("job", gpus_per_worker=0))["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in cpu_only["resources"]["limits"]


def test_image_reference_keeps_a_named_registry() -> None:
    def reference(image: str | None, registry: str | None) -> str:
        return kubernetes.image_reference(launcher("job", image=image, registry=registry).options)

    assert reference("ghcr.io/o/i:1", "r.example") == "ghcr.io/o/i:1"
    assert reference("o/i:1", "r.example/") == "r.example/o/i:1"
    assert reference("i:1", None) == "i:1"
    with pytest.raises(ValueError, match=r"launcher\.kubernetes\.image"):
        reference(None, None)


def test_pytorchjob_semantics() -> None:
    job = by_kind(rendered("pytorchjob", workers=4))["PyTorchJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    for replica in replicas.values():
        assert replica["restartPolicy"] == replica["template"]["spec"]["restartPolicy"] == "Never"
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert not {"MASTER_ADDR", "MASTER_PORT", "RANK"} & set(env_of(container))
    single = by_kind(rendered("pytorchjob", workers=1))["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
    assert list(single) == ["Master"]


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="kind"):
        rendered("deployment")


def test_no_secret_reaches_a_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_PASSWORD", "canary-registry-password-1234")
    monkeypatch.setenv("HF_TOKEN", "canary-hf-token-5678")
    text = json.dumps(rendered("job").to_dict()) + json.dumps(rendered("pytorchjob").to_dict())
    assert "canary" not in text
    assert "regcred" in text


def test_config_section_is_validated_with_key_paths(tmp_path: Path) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    config["launcher"]["kubernetes"]["kind"] = "deployment"
    config["launcher"]["kubernetes"]["image_pull_secrets"] = "regcred"
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    assert "launcher.kubernetes.kind: 'deployment' is not valid" in str(error.value)
    assert "launcher.kubernetes.image_pull_secrets" in str(error.value)


# --- apply / wait / collect / delete against recorded-shaped responses ------------------------------------------


def pod(job: str, namespace: str, kind: str, rank: int, state: str) -> dict[str, Any]:
    """A recorded pod object in `state`, as rank `rank` of `job` (PyTorchJob pods carry replica labels instead)."""
    text = json.dumps({**RECORDED["pending"], "status": RECORDED[state]["status"]})
    text = text.replace("{job}", job).replace("{namespace}", namespace).replace("{index}", str(rank))
    obj = json.loads(text)
    if kind == "pytorchjob":
        obj = json.loads(json.dumps(obj).replace('"name": "worker"', '"name": "pytorch"'))
        del obj["metadata"]["annotations"]
        role, index = ("master", 0) if rank == 0 else ("worker", rank - 1)
        obj["metadata"]["labels"] = {
            "ddlrepro/run": job,
            "training.kubeflow.org/replica-type": role,
            "training.kubeflow.org/replica-index": str(index),
        }
    return obj


RESOURCES = {
    "NetworkPolicy": ("networkpolicies", "networking.k8s.io"),
    "Service": ("services", ""),
    "Job": ("jobs", "batch"),
    "PyTorchJob": ("pytorchjobs", "kubeflow.org"),
}


def api_error(status: str, kind: str, name: str) -> client.ApiException:
    """The API server's error for `kind` `name`: its recorded Status body (404 NotFound, 409 AlreadyExists)."""
    plural, group = RESOURCES[kind]
    text = json.dumps(RECORDED[status]).replace("{plural}.{group}", f"{plural}.{group}".rstrip("."))
    text = text.replace("{plural}", plural).replace("{group}", group).replace("{job}", name)
    body = json.loads(text)
    error = client.ApiException(status=body["code"], reason=body["reason"])
    error.body = text
    return error


class FakeCluster:
    """Answers the client calls the launcher makes, from the recorded pod objects.

    `script[attempt]` is the sequence of pod states seen by successive polls (one state per rank; the last one
    repeats); `logs[attempt][rank]` the log lines of that pod. As on an API server, deletion takes time: a deleted
    object turns terminating (deletionTimestamp set; the job's pods with it, as a foreground deletion waits for
    them) and is gone only after `linger` more reads of it; creating a name that exists or is terminating answers
    409 AlreadyExists. Kinds in `stuck` never finish terminating (a finalizer no controller removes)."""

    def __init__(
        self,
        kind: str,
        script: list[list[list[str]]],
        logs: list[dict[int, list[str]]],
        linger: int = 3,
        stuck=(),
        events: str | None = None,
    ) -> None:
        """`events`: the recorded event list every pod has (its volumes then: `claim_volumes`), or none."""
        self.kind, self.script, self.logs, self.events = kind, script, logs, events
        self.job_kind = "Job" if kind == "job" else "PyTorchJob"
        self.core = self.batch = self.custom = self.networking = self
        self.calls: list[tuple[str, str]] = []
        self.objects: dict[str, int | None] = {}  # kind → None while live, else the reads left while terminating
        self.linger, self.stuck = linger, set(stuck)
        self.attempt, self.polls = -1, 0
        self.job, self.namespace = "", ""

    def leave_behind(self, *kinds: str) -> None:
        """Objects of this run left by a launcher that was killed."""
        self.job, self.objects = kubernetes.job_name(tiny_point(workers=2)), dict.fromkeys(kinds)

    def _create(self, kind: str, body: dict[str, Any]) -> None:
        if kind in self.objects:
            raise api_error("already_exists", kind, body["metadata"]["name"])
        self.calls.append(("create", kind))
        self.objects[kind] = None
        if kind == self.job_kind:
            self.attempt, self.polls = self.attempt + 1, 0
            self.job, self.namespace = body["metadata"]["name"], body["metadata"]["namespace"]

    def create_namespaced_network_policy(self, namespace: str, body: dict[str, Any]) -> None:
        self._create("NetworkPolicy", body)

    def create_namespaced_service(self, namespace: str, body: dict[str, Any]) -> None:
        self._create("Service", body)

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> None:
        self._create("Job", body)

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, body: dict):
        assert (group, version, plural) == ("kubeflow.org", "v1", "pytorchjobs")
        self._create("PyTorchJob", body)

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> client.V1PodList:
        assert label_selector == f"ddlrepro/run={self.job}"
        script = self.script[max(self.attempt, 0)]
        states = script[min(self.polls, len(script) - 1)] if self.job_kind in self.objects else []
        self.polls += 1
        items = [pod(self.job, namespace, self.kind, rank, state) for rank, state in enumerate(states)]
        for item in items:
            item["spec"]["volumes"] = RECORDED["claim_volumes"] if self.events else []
        if self.objects.get(self.job_kind) is not None:
            for item in items:
                item["metadata"]["deletionTimestamp"] = RECORDED["terminating_metadata"]["deletionTimestamp"]
        body = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "48999"}, "items": items}
        return client.ApiClient().deserialize(json.dumps(body), "V1PodList", "application/json")

    def list_namespaced_event(self, namespace: str, field_selector: str) -> client.CoreV1EventList:
        """The pod's recorded events (`self.events`), as the API server answers a field selector on the pod."""
        name = re.fullmatch(r"involvedObject\.kind=Pod,involvedObject\.name=(.+)", field_selector).group(1)
        self.calls.append(("events", name))
        text = json.dumps(RECORDED[self.events] if self.events else {"items": []})
        text = text.replace("{pod}", name).replace("{namespace}", namespace)
        return client.ApiClient().deserialize(text, "CoreV1EventList", "application/json")

    def read_namespaced_pod_log(self, name: str, namespace: str, container: str | None = None) -> str:
        assert container == ("pytorch" if self.kind == "pytorchjob" else "worker")
        rank = int(re.match(rf"{self.job}-(\d+)-", name).group(1))
        return "\n".join(self.logs[self.attempt].get(rank, [])) + "\n"

    def _delete(self, kind: str) -> None:
        self.calls.append(("delete", kind))
        if kind not in self.objects:
            raise api_error("not_found", kind, self.job)
        if self.objects[kind] is None:
            self.objects[kind] = self.linger

    def delete_namespaced_job(self, name: str, namespace: str, body: client.V1DeleteOptions) -> None:
        assert body.propagation_policy == "Foreground"
        self._delete("Job")

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str):
        self._delete("PyTorchJob")

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        self._delete("Service")

    def delete_namespaced_network_policy(self, name: str, namespace: str) -> None:
        self._delete("NetworkPolicy")

    def _read(self, kind: str) -> dict[str, Any]:
        """The object (terminating: with its deletion metadata); a terminating object is gone after `linger` reads."""
        if kind not in self.objects:
            raise api_error("not_found", kind, self.job)
        reads_left = self.objects[kind]
        if reads_left is None:
            return {"kind": kind, "metadata": {"name": self.job, "namespace": self.namespace}}
        if kind not in self.stuck:
            self.objects[kind] = reads_left - 1
            if reads_left <= 1:
                del self.objects[kind]
        text = json.dumps(RECORDED["terminating_metadata"]).replace("{job}", self.job)
        return {"kind": kind, "metadata": json.loads(text.replace("{namespace}", self.namespace))}

    def read_namespaced_service(self, name: str, namespace: str) -> dict[str, Any]:
        return self._read("Service")

    def read_namespaced_network_policy(self, name: str, namespace: str) -> dict[str, Any]:
        return self._read("NetworkPolicy")

    def read_namespaced_job(self, name: str, namespace: str) -> dict[str, Any]:
        return self._read("Job")

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str):
        return self._read("PyTorchJob")


@pytest.fixture(scope="module")
def worker_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[str]]:
    """What two real workers of a tiny point print (run here with the local launcher): each pod's log replays it."""
    run_dir = tmp_path_factory.mktemp("local") / "run"
    run_point(tiny_point(workers=2), run_dir)
    logs: dict[int, list[str]] = {0: [], 1: []}
    for line in (run_dir / "log.txt").read_text().splitlines():
        rank, text = LOG_LINE.match(line).groups()
        logs[int(rank)].append(text)
    return logs


def substituted(lines: list[str], job: str) -> list[str]:
    return [line.replace("{job}", job) for line in lines]


def run_on(fake: FakeCluster, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> Path:
    monkeypatch.setattr(kubernetes, "connect", lambda context=None: fake)
    run_dir = tmp_path / "runs" / "kungfu-fig9" / tiny_point(workers=2).id
    run_point(tiny_point(workers=2), run_dir, launcher(kind, 60, **settings))
    return run_dir


@pytest.mark.parametrize("kind", ["job", "pytorchjob"])
def test_successful_job_collects_every_pod_log_and_is_deleted(
    kind: str, worker_logs: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    phases = [["pending", "pending"], ["running", "pending"], ["running", "running"], ["succeeded", "succeeded"]]
    fake = FakeCluster(kind, [phases], [worker_logs])
    run_dir = run_on(fake, tmp_path, kind, monkeypatch)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["summary"]
    pod_logs = sorted((run_dir / "pods" / "attempt-0").glob("*.log"))
    assert len(pod_logs) == 2
    log = (run_dir / "log.txt").read_text()
    assert "[rank 0] " in log and "[rank 1] " in log
    table = tidy_table([run_dir])
    rates = table[table["metric"] == "img_per_sec"]
    assert sorted(rates["rank"].unique()) == [0, 1]
    created = [what for verb, what in fake.calls if verb == "create"]
    assert created == (["NetworkPolicy", "Service", "Job"] if kind == "job" else ["NetworkPolicy", "PyTorchJob"])
    assert {what for verb, what in fake.calls if verb == "delete"} == set(created)
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["jobspec"]["manifests"] and provenance["jobspec"]["launcher"] == "kubernetes"


def test_objects_left_by_a_killed_launcher_are_replaced(
    worker_logs: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leftovers answer 409; the launcher deletes them and creates its objects once they are gone."""
    fake = FakeCluster("job", [[["succeeded", "succeeded"]]], [worker_logs])
    fake.leave_behind("NetworkPolicy", "Service", "Job")
    run_dir = run_on(fake, tmp_path, "job", monkeypatch)
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    kinds = ["NetworkPolicy", "Service", "Job"]
    assert fake.calls[:6] == [("delete", kind) for kind in kinds] + [("create", kind) for kind in kinds]
    assert fake.objects == {}


def test_a_leftover_pytorchjob_without_a_service_is_replaced(
    worker_logs: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCluster("pytorchjob", [[["succeeded", "succeeded"]]], [worker_logs], linger=5)
    fake.leave_behind("PyTorchJob")
    run_dir = run_on(fake, tmp_path, "pytorchjob", monkeypatch)
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    kinds = ["NetworkPolicy", "PyTorchJob"]
    assert fake.calls == [
        ("create", "NetworkPolicy"),  # the leftover job's name answers 409 next: all of this run's go, then again
        *[("delete", kind) for kind in kinds],
        *[("create", kind) for kind in kinds],
        *[("delete", kind) for kind in kinds],
    ]


def test_delete_names_the_objects_it_could_not_remove(
    worker_logs: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job held by a finalizer: the run's results stand, and its log names what is left behind."""
    monkeypatch.setattr(kubernetes.watch, "DELETE_GRACE_S", 0.2)
    fake = FakeCluster("job", [[["succeeded", "succeeded"]]], [worker_logs], stuck={"Job"})
    run_dir = run_on(fake, tmp_path, "job", monkeypatch)
    job = kubernetes.job_name(tiny_point(workers=2))
    left = f"could not delete Job ml-bench/{job}, Pod ml-bench/{job}-0-x7k2p, Pod ml-bench/{job}-1-x7k2p"
    assert left in (run_dir / "log.txt").read_text()
    assert list(fake.objects) == ["Job"]


def test_leftovers_that_cannot_be_removed_stop_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubernetes.watch, "DELETE_GRACE_S", 0.2)
    fake = FakeCluster("job", [[["succeeded", "succeeded"]]], [{}], stuck={"Job"})
    fake.leave_behind("Service", "Job")
    with pytest.raises(RunFailed, match=r"objects of an earlier run are still there: Job ml-bench/ddlrepro-"):
        run_on(fake, tmp_path, "job", monkeypatch)
    assert ("create", "Job") not in fake.calls


def test_failed_pod_fails_the_run_naming_its_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCluster("job", [[["running", "running"], ["running", "failed"]]], [{1: RECORDED["crash_log"]}])
    with pytest.raises(RunFailed) as failure:
        run_on(fake, tmp_path, "job", monkeypatch)
    assert failure.value.rank == 1
    assert "exited with code 1" in str(failure.value)
    assert "CUDA out of memory" in str(failure.value)
    assert [verb for verb, _ in fake.calls].count("create") == 3  # policy, service and job once: no retry of a crash
    run_dir = tmp_path / "runs" / "kungfu-fig9" / tiny_point(workers=2).id
    assert not (run_dir / "result.json").exists()
    assert ("delete", "Job") in fake.calls and ("delete", "Service") in fake.calls


def test_startup_race_starts_the_job_again(
    worker_logs: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = kubernetes.job_name(tiny_point(workers=2))
    race = [["pending", "pending"], ["pending", "failed"]]
    success = [["running", "running"], ["succeeded", "succeeded"]]
    fake = FakeCluster("job", [race, success], [{1: substituted(RECORDED["dns_race_log"], job)}, worker_logs])
    run_dir = run_on(fake, tmp_path, "job", monkeypatch)
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    assert [what for verb, what in fake.calls if verb == "create"] == ["NetworkPolicy", "Service", "Job"] * 2
    assert "Name or service not known" in (run_dir / "pods" / "attempt-0" / f"{job}-1-x7k2p.log").read_text()
    log = (run_dir / "log.txt").read_text()
    assert "start-up race; starting the job again" in log
    assert "Name or service not known" not in log  # the failed attempt's lines stay in pods/attempt-0


def test_startup_race_without_retries_left_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = kubernetes.job_name(tiny_point(workers=2))
    race = [["running", "failed"]]
    fake = FakeCluster("job", [race, race], [{1: substituted(RECORDED["dns_race_log"], job)}] * 2)
    with pytest.raises(RunFailed, match="start-up race; no retries left"):
        run_on(fake, tmp_path, "job", monkeypatch, startup_retries=1)
    assert [what for verb, what in fake.calls if verb == "create"].count("Job") == 2


def test_image_pull_failure_names_image_and_secret_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCluster("job", [[["image_pull_backoff", "image_pull_backoff"]]], [{}])
    with pytest.raises(RunFailed, match=r"ImagePullBackOff for image registry\.example\.org/ml/ddlrepro:cpu.*regcred"):
        run_on(fake, tmp_path, "job", monkeypatch)


def test_timeout_stops_and_deletes_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCluster("job", [[["pending", "pending"]]], [{}])
    pods = kubernetes.KubernetesLauncher(launcher("job", 0.05).options, fake)
    spec = pods.render(tiny_point(workers=2), tmp_path)
    (tmp_path / "run").mkdir()
    with OutputCollector(tmp_path / "run") as output, pytest.raises(RunFailed, match=r"timed out after 0\.05 s"):
        pods.execute(spec, output)
    assert ("delete", "Job") in fake.calls


@pytest.mark.parametrize(
    ("events", "named"),
    [
        ("failed_mount_events", r'FailedMount for volume "data" \(claim "imagenet-train"\): Unable to attach or mount'),
        (
            "failed_attach_events",  # names the PersistentVolume, not the pod's volume: the pod's claim stands in
            r'FailedAttachVolume for volume "pvc-6d2a1c9e-0f3b-4e8a-9c71-2b5d4e6f8a10" \(claim "imagenet-train"\)',
        ),
        ("failed_scheduling_events", r"its last event: FailedScheduling: 0/3 nodes are available"),
    ],
)
def test_a_pod_that_does_not_start_names_why(
    events: str, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod still Pending (ContainerCreating) after pod_start_timeout_s fails the run well before its time-out,
    with its events read: the volume and its claim for a FailedMount or FailedAttachVolume, else its last event."""
    fake = FakeCluster("job", [[["running", "pending"]]], [{}], events=events)
    started = time.monotonic()
    with pytest.raises(RunFailed, match=r"did not start: still Pending \(ContainerCreating\) after 0\.1 s") as failure:
        run_on(fake, tmp_path, "job", monkeypatch, pod_start_timeout_s=0.1)
    assert re.search(named, str(failure.value)), str(failure.value)
    assert failure.value.rank == 1
    assert time.monotonic() - started < 30  # the run's own time-out is 60 s
    assert ("events", f"{fake.job}-1-x7k2p") in fake.calls
    assert ("delete", "Job") in fake.calls


def test_a_pod_that_starts_in_time_is_unaffected(
    worker_logs: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pending for a few polls, under pod_start_timeout_s: the run completes and no events are read."""
    script = [["pending", "pending"]] * 3 + [["running", "running"], ["succeeded", "succeeded"]]
    fake = FakeCluster("job", [script], [worker_logs], events="failed_mount_events")
    run_dir = run_on(fake, tmp_path, "job", monkeypatch, pod_start_timeout_s=30)
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    assert not [call for call in fake.calls if call[0] == "events"]


def test_kubernetes_profile_sets_names_and_a_valid_config() -> None:
    """Read as Snakemake reads it: the profile's config file on top of config/config.yaml, kungfu-fig7 off (the
    launcher cannot host its elastic runs), and no `config:` entries (Snakemake reads nested values as strings)."""
    profile = yaml.safe_load((REPO / "profiles" / "kubernetes" / "config.yaml").read_text())
    assert "config" not in profile
    config = load_config(REPO / "config" / "config.yaml", REPO / "profiles" / "kubernetes" / profile["configfile"])
    section = config["launcher"]["kubernetes"]
    assert config["launcher"]["name"] == "kubernetes"
    assert section["namespace"] and section["image"] and section["registry"] and section["image_pull_secrets"]
    assert section["gpus_per_worker"] == 1
    assert config["figures"]["kungfu-fig7"]["enabled"] is False
    check_points(figure_points(config), configured_launcher(config))
    text = json.dumps(profile) + (REPO / "profiles" / "kubernetes" / profile["configfile"]).read_text()
    assert not re.search("password|token|auth", text, re.IGNORECASE)
