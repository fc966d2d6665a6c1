"""The package stands on its own and the workflow can be moved: an installed ddlrepro verifies a bundle without the
checkout, nothing points outside the repository, parsing the workflow edits no environment (it stops when the jobs'
python cannot run this ddlrepro), and a finished checkout copied elsewhere reruns nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import (
    BIN,
    ONE_WORKER_COUNT_DLAAS,
    REPO,
    checks_excluding,
    copy_workflow,
    planned_jobs,
    snakemake,
    workflow_environment,
)
from test_bundle import figureless_bundle, figureless_members, flipped

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.figures import FIGURES
from ddlrepro.host.jobenv import jobs_package_problem


# Paths a tracked file must never name: notes kept beside the checkout, and the folder that holds the checkout.
def installed_outside_checkout(tmp_path: Path) -> Path:
    """A fresh venv with ddlrepro installed from its wheel (no checkout on its path); its light dependencies come,
    without downloading, from this venv's site-packages, and importing torch there fails."""
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy2(REPO / "pyproject.toml", source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    wheels = tmp_path / "wheels"
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(source)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (wheel,) = wheels.glob("ddlrepro-*.whl")
    install = [*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    site = Path(
        subprocess.check_output(
            [venv / "bin" / "python", "-c", "import site; print(site.getsitepackages()[0])"], text=True
        ).strip()
    )
    # A folder a .pth file adds has its own .pth files skipped: this venv's editable ddlrepro stays out.
    (site / "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (site / "no_torch.pth").write_text("import sys; sys.modules['torch'] = None\n")
    return venv


def test_installed_package_verifies_a_bundle_outside_the_checkout(tmp_path: Path) -> None:
    venv = installed_outside_checkout(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def installed(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, cwd=elsewhere, env=environment, capture_output=True, text=True, timeout=300)

    where = installed(str(venv / "bin" / "python"), "-c", "import ddlrepro; print(ddlrepro.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr
    requirements = installed(
        str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.requires('ddlrepro'))"
    )
    assert "'torch; extra == \"train\"'" in requirements.stdout and "'torch'" not in requirements.stdout

    bundle = figureless_bundle(figureless_members(), elsewhere / "bundle.tar.gz")
    verified = installed(str(venv / "bin" / "ddlrepro"), "verify", bundle.name)
    assert verified.returncode == 0, verified.stderr
    assert "bundle.tar.gz verifies" in verified.stdout
    tampered = flipped(bundle, elsewhere / "tampered.tar.gz", "config-used.yaml")
    refused = installed(str(venv / "bin" / "ddlrepro"), "verify", tampered.name)
    assert refused.returncode != 0
    assert "config-used.yaml: sha256 differs from the manifest" in refused.stderr


HOST_IMPORTS_WITHOUT_TORCH = """
import importlib, pkgutil, sys


class NoTorch:
    # torch as if not installed: its import fails and sys.modules never holds it (scipy, which the checks
    # import, looks torch up there and breaks on a None placeholder).
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoTorch())
import ddlrepro.host
failed = []
for module in pkgutil.walk_packages(ddlrepro.host.__path__, "ddlrepro.host."):
    try:
        importlib.import_module(module.name)
    except ImportError as error:
        failed.append(f"{module.name}: {error}")
print("\\n".join(failed))
"""


def test_every_host_module_imports_without_torch() -> None:
    """What runs on the host (verify, tables, checks, report, launchers) needs no torch: only the ranks train."""
    done = subprocess.run([sys.executable, "-c", HOST_IMPORTS_WITHOUT_TORCH], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def fake_python(folder: Path, script: str) -> Path:
    """A folder holding only a `python` that runs `script` (a shell body), to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return folder


def test_jobs_python_must_import_this_ddlrepro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "no `python` on PATH" in jobs_package_problem()
    monkeypatch.setenv("PATH", str(fake_python(tmp_path / "broken", "echo 'No module named ddlrepro' >&2; exit 1")))
    assert jobs_package_problem().endswith("cannot import ddlrepro (No module named ddlrepro)")
    other = copy_workflow(tmp_path / "other")
    monkeypatch.setenv("PATH", str(BIN))
    monkeypatch.setenv("PYTHONPATH", str(other / "src"))
    assert f"imports ddlrepro from {other / 'src' / 'ddlrepro'}" in jobs_package_problem()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    assert jobs_package_problem() is None


@pytest.mark.slow
def test_workflow_stops_when_its_jobs_cannot_run_ddlrepro(workflow_copy: Path, tmp_path: Path) -> None:
    broken = fake_python(tmp_path / "broken", "exit 1")
    environment = workflow_environment(workflow_copy)
    environment["PATH"] = os.pathsep.join([str(broken), environment["PATH"]])
    done = subprocess.run(
        [str(BIN / "snakemake"), "-n"], cwd=workflow_copy, env=environment, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert f"the jobs' python ({broken / 'python'}, first on PATH) cannot import ddlrepro" in done.stdout
    assert "source .venv/bin/activate" in done.stdout


@pytest.mark.slow
def test_no_rule_names_an_absolute_path(workflow_copy: Path) -> None:
    """Inputs, outputs, params and shell commands (the Horovod build's included) name nothing by the checkout's path
    or the environment's: moving either changes no job."""
    extra = workflow_copy / "everything.yaml"
    extra.write_text(
        "images: {build: podman}\nfigures:\n  kungfu-fig9:\n    frameworks: [torch, horovod]\n    strategies: [RING]\n"
    )
    plan = snakemake(workflow_copy, "-n", "-p", "--forceall", "--configfile", "tests/configs/tiny.yaml", extra.name)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert {"horovod", "build_image", "plot", "report"} <= set(planned_jobs(plan.stdout))
    jobs = plan.stdout[re.search(r"^(local)?rule ", plan.stdout, re.MULTILINE).start() :]  # after Snakemake's header
    for path in (workflow_copy, BIN.parent, Path(sys.prefix).resolve()):
        assert str(path) not in jobs


ONE_FIGURE = (
    "figures:\n"
    + "".join(f"  {figure}: {{enabled: false}}\n" for figure in FIGURES if figure != "dlaas-scaling")
    + "  dlaas-scaling: {workers: [1]}\n"
    + checks_excluding(*ONE_WORKER_COUNT_DLAAS)
)


@pytest.mark.slow
def test_a_finished_checkout_copied_elsewhere_reruns_nothing(tmp_path: Path) -> None:
    first = copy_workflow(tmp_path / "first")
    (first / "one.yaml").write_text(ONE_FIGURE)
    options = ["--configfile", "tests/configs/tiny.yaml", "one.yaml"]
    built = snakemake(first, *options)
    assert built.returncode == 0, built.stderr[-3000:]
    caption_start = " ".join(figure_file("dlaas-scaling", "caption.rst", first).read_text().split()[:3])
    assert caption_start in (first / "results" / "report.html").read_text()

    moved = tmp_path / "elsewhere" / "moved"
    shutil.copytree(first, moved, symlinks=True)
    plan = snakemake(moved, "-n", *options)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert planned_jobs(plan.stdout) == {}, plan.stdout[-3000:]
    assert "Nothing to be done" in plan.stdout + plan.stderr

    # The report's captions and template are its inputs: editing either rebuilds it (and only it).
    for edited in ("src/ddlrepro/host/figures/dlaas_scaling/caption.rst", "src/ddlrepro/host/templates/report.html.j2"):
        with (moved / edited).open("a") as file:
            file.write("\n")
        assert planned_jobs(snakemake(moved, "-n", *options).stdout) == {"report": 1, "all": 1}, edited
        shutil.copystat(first / edited, moved / edited)
