"""The training image: Dockerfile and Apptainer definition install the same thing, and (as root, with podman) the
workflow builds the CPU image from a locally made base and runs a smoke point in it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_workflow, only_figures, planned_jobs, snakemake, tiny_point
from spython.main.parse.parsers import DockerParser, SingularityParser

from ddlrepro.host import leftovers
from ddlrepro.host.config import load_config
from ddlrepro.host.images import build_command, read_image
from ddlrepro.host.launchers import configured_launcher
from ddlrepro.host.launchers.local import container_name
from ddlrepro.host.owners import OWNER_LABEL

CONTAINERS = REPO / "containers"
ENGINE_RUN = ["podman", "--runtime", "runc", "run", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]


def recipes() -> tuple:
    return (
        DockerParser(str(CONTAINERS / "Dockerfile")).recipe["spython-base"],
        SingularityParser(str(CONTAINERS / "Apptainer.def")).recipe["spython-base"],
    )


def test_apptainer_definition_parses_and_copies_what_the_dockerfile_copies() -> None:
    docker, apptainer = recipes()
    assert apptainer.fromHeader == docker.fromHeader
    assert [line.split() for line in apptainer.files] == docker.files
    assert apptainer.environ == docker.environ


def test_both_install_with_the_same_script_and_pins() -> None:
    docker, apptainer = recipes()

    def installs(recipe) -> list[str]:
        lines = [line for line in recipe.install if "install.sh" in line]
        return [re.sub(r"\$\{VARIANT\}|\{\{ VARIANT \}\}", "VARIANT", line) for line in lines]

    assert installs(docker) == installs(apptainer) != []
    (command,) = installs(docker)
    assert command == "sh /opt/ddlrepro-src/containers/install.sh /opt/ddlrepro-src VARIANT"
    for lock in ("envs/requirements.lock", "envs/requirements-cuda.lock"):
        assert [lock, f"/opt/ddlrepro-src/{lock}"] in docker.files
    script = (CONTAINERS / "install.sh").read_text()
    pip_installs = [line for line in script.splitlines() if line.startswith("$pip install")]
    assert pip_installs == [
        '$pip install --require-hashes --find-links "$src/containers/wheels" -r "$lock"',
        '$pip install --no-deps "$src"',
    ]
    commands = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in commands if "--extra-index-url" in line]  # another index only alone (--index-url)


def test_defaults_agree_with_the_config() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    docker, _ = recipes()
    assert docker.fromHeader == config["images"]["base"]
    assert config["images"]["build"] is None  # `make reproduce` builds no image


def test_build_command_mounts_the_ca_bundle_only(tmp_path: Path) -> None:
    settings = {
        "variant": "cpu",
        "base": "localhost/base:1",
        "ca_bundle": "/etc/ssl/certs/ca-certificates.crt",
        "engine_args": ["--runtime", "runc"],
        "build_args": ["--isolation", "chroot"],
    }
    command = build_command("podman", settings, tmp_path, tmp_path / "iid")
    assert command[:5] == ["podman", "--runtime", "runc", "build", "--isolation"]
    assert "BASE=localhost/base:1" in command and "VARIANT=cpu" in command
    assert "/etc/ssl/certs/ca-certificates.crt:/etc/ddlrepro-build-ca.pem:ro" in command
    assert "PIP_CERT=/etc/ddlrepro-build-ca.pem" in command
    with pytest.raises(ValueError, match=r"images\.ca_bundle"):
        build_command("docker", settings, tmp_path, tmp_path / "iid")


def test_sif_checksum_file_is_read_back(tmp_path: Path) -> None:
    (tmp_path / "ddlrepro-cuda.sif.sha256").write_text("ab" * 32 + "  ddlrepro-cuda.sif\n")
    image = read_image(tmp_path / "ddlrepro-cuda.sif.sha256")
    assert image == {
        "engine": "apptainer",
        "reference": str((tmp_path / "ddlrepro-cuda.sif").resolve()),
        "digest": "sha256:" + "ab" * 32,
    }


def test_local_workers_in_containers_get_only_their_rank_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "canary-token-value-42")
    images = {"build": "podman", "engine_args": ENGINE_RUN[1:3], "run_args": ENGINE_RUN[4:]}
    launcher = configured_launcher({"images": images}, {"digest": "sha256:abc123"})
    job = launcher.render(tiny_point(workers=2), tmp_path / "run").request
    for rank, worker in enumerate(job.workers):
        command = worker.command
        assert command[: len(ENGINE_RUN)] == ENGINE_RUN
        assert command[command.index("--name") + 1] == container_name(tiny_point(workers=2), rank, tmp_path / "run")
        assert f"RANK={rank}" in command and "--network=host" in command
        assert command[command.index("abc123") + 1 :][:3] == ["python", "-m", "ddlrepro.rank.workloads"]
        assert "canary" not in json.dumps(command)
        assert f"{OWNER_LABEL}={os.getpid()}" in command, "a container names the run's process as its owner"
    assert job.container_engine == ["podman", "--runtime", "runc"]


@pytest.fixture(scope="module")
def base_image() -> str:
    """A Debian base image made here (debootstrap + podman import; no registry), podman installed if needed."""
    if os.geteuid() != 0:
        pytest.skip("building images with podman here needs root")
    done = subprocess.run(
        [str(REPO / "scripts" / "container-tools"), "base"], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def podman_image_ids() -> set[str]:
    listed = subprocess.run(["podman", "images", "--all", "--quiet", "--no-trunc"], capture_output=True, text=True)
    return set(listed.stdout.split())


@pytest.fixture
def images_removed_after() -> Iterator[None]:
    """Removes the images a test builds, build-cache layers included: each is GBs, and left behind they fill the
    disk that later runs (CI's included) build on."""
    before = podman_image_ids()
    yield
    made = podman_image_ids() - before
    if made:
        subprocess.run(["podman", "rmi", "--force", *made], capture_output=True, timeout=300)


def host_torch_wheel(folder: Path) -> Path:
    """The torch wheel this machine's pip installs (a CPU build here), copied into `folder`."""
    command = [sys.executable, "-m", "pip", "download", "torch==2.13.0", "--no-deps", "-d", str(folder)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return folder


def image_config(workdir: Path, base: str, wheels: Path) -> str:
    images = {
        "build": "podman",
        "variant": "cpu",
        "base": base,
        "wheels": str(wheels),
        "ca_bundle": "/etc/ssl/certs/ca-certificates.crt",
        "engine_args": ["--runtime", "runc"],
        "build_args": ["--isolation", "chroot"],
        "run_args": ENGINE_RUN[4:],
    }
    figures = only_figures({"kungfu-fig9": {"workers": [2], "models": ["resnet20"]}})
    (workdir / "image.yaml").write_text(yaml.safe_dump({"images": images, "figures": figures}))
    return "image.yaml"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_podman_image_runs_a_point_into_the_same_table_as_a_local_run(
    base_image: str, images_removed_after: None, tmp_path: Path
) -> None:
    workdir = copy_workflow(tmp_path / "workflow")
    wheels = host_torch_wheel(tmp_path / "wheels")
    config = image_config(workdir, base_image, wheels)
    built = snakemake(workdir, "--configfile", "tests/configs/tiny.yaml", config, timeout=1800)
    assert built.returncode == 0, built.stderr[-4000:] + read_if(workdir / "results/logs/build_image/cpu.log")
    image = json.loads((workdir / "results" / "images" / "ddlrepro-cpu.digest").read_text())
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", image["digest"])

    (in_image,) = (workdir / "results" / "runs" / "kungfu-fig9").iterdir()
    spec = json.loads((in_image / "jobspec.json").read_text())
    assert all(worker["command"][:4] == ENGINE_RUN[:4] for worker in spec["workers"])
    provenance = json.loads((in_image / "provenance.json").read_text())
    assert provenance["image"]["digest"] == image["digest"]
    assert provenance["torch"]["version"].startswith("2.13.0")
    assert [worker["pid"] for worker in provenance["workers"]] == [1, 1]  # each rank is PID 1 of its container

    # The same figure with one more point, run on the host: the image's run stays (only modification times
    # trigger reruns, so dropping the digest input does not rerun it), the table is made again from both.
    (workdir / "local.yaml").write_text("images: {build: null}\nfigures: {kungfu-fig9: {workers: [1, 2]}}\n")
    options = ["--rerun-triggers", "mtime", "--forcerun", "tabulate"]
    local = snakemake(workdir, *options, "--configfile", "tests/configs/tiny.yaml", config, "local.yaml")
    assert local.returncode == 0, local.stderr[-4000:]
    table = pd.read_csv(workdir / "results" / "tables" / "kungfu-fig9.csv")
    rates = table[table["metric"] == "img_per_sec"]
    assert sorted(rates.groupby("workers")["rank"].nunique().items()) == [(1, 1), (2, 2)]
    images = {
        path.parent.name: json.loads(path.read_text())["image"]
        for path in (workdir / "results" / "runs" / "kungfu-fig9").glob("*/provenance.json")
    }
    assert images[in_image.name]["digest"] == image["digest"]
    assert [value for name, value in images.items() if name != in_image.name] == [None]


def read_if(path: Path) -> str:
    return path.read_text()[-4000:] if path.exists() else ""


def dry_run(workdir: Path, *config: str) -> tuple[int, str]:
    """`snakemake -n -p kungfu_fig9 --config CONFIG...` (further options may follow the config)."""
    done = snakemake(workdir, "-n", "-p", "kungfu_fig9", "--config", *config)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_images_are_wired_into_the_runs_only_when_asked(workflow_copy: Path) -> None:
    code, default = dry_run(workflow_copy, "scale=smoke")
    assert code == 0 and "build_image" not in default and "--image-file" not in default

    code, podman = dry_run(workflow_copy, "images={build: podman}")
    assert code == 0 and planned_jobs(podman)["build_image"] == 1
    assert "--image-file results/images/ddlrepro-cpu.digest" in podman and '"build": "podman"' in podman

    code, slurm = dry_run(workflow_copy, "images={build: apptainer, variant: cuda}", "launcher={name: slurm}")
    assert code == 0 and planned_jobs(slurm)["build_sif"] == 1
    assert "--image-file results/images/ddlrepro-cuda.sif.sha256" in slurm and '"name": "slurm"' in slurm

    # the Kubernetes launcher cannot host fig7's elastic runs: its profile's config file disables the figure
    kubernetes_config = ("--configfile", "config/config.yaml", "profiles/kubernetes/cluster.yaml")
    code, kubernetes = dry_run(
        workflow_copy, "launcher={name: kubernetes, kubernetes: {image: 'ddlrepro:cuda'}}", *kubernetes_config
    )
    assert code == 0 and '"name": "kubernetes"' in kubernetes and '"image": "ddlrepro:cuda"' in kubernetes

    code, refused = dry_run(workflow_copy, "images={build: apptainer}")
    assert code != 0 and "images.build: apptainer images are not run by the local launcher" in refused


def test_two_checkouts_running_one_point_never_share_a_container_name(tmp_path: Path) -> None:
    point = tiny_point(workers=2)
    mine, theirs = tmp_path / "a" / "runs" / point.id, tmp_path / "b" / "runs" / point.id
    assert container_name(point, 0, mine) == container_name(point, 0, mine)
    assert len({container_name(point, 0, mine), container_name(point, 0, theirs), container_name(point, 1, mine)}) == 3
    assert re.fullmatch(r"ddlrepro-[a-z0-9_-]+-[0-9a-f]{8}-0", container_name(point, 0, mine))


def test_a_dead_runs_containers_are_removed_and_a_live_ones_kept(base_image: str) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    made = {}
    for owner in (gone.pid, os.getpid()):
        create = ["podman", "create", "--label", f"{OWNER_LABEL}={owner}", base_image, "true"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        made[owner] = done.stdout.strip()
    try:
        removed = leftovers.sweep_containers(["podman"])
        listed = subprocess.run(["podman", "ps", "--all", "--no-trunc", "--format", "{{.ID}}"], capture_output=True)
        present = set(listed.stdout.decode().split())
        assert made[gone.pid] not in present and len(removed) == 1, removed
        assert made[os.getpid()] in present, "a live owner's container was removed"
    finally:
        subprocess.run(["podman", "rm", "--force", *made.values()], capture_output=True, timeout=120)
