"""Build the training image (containers/) with podman, docker or apptainer, and describe it for the runs.

podman/docker: the image ID (a sha256 digest) goes into a JSON "digest file" under `results/images/`; apptainer:
a `.sif` beside its sha256. The runs take that file as input, so a changed image reruns them, and their provenance
records the digest. The build context is assembled under `results/images/` from the repository's tracked inputs
(and any extra wheels), so nothing else of the working tree (.venv, results) reaches the image; it is removed
after the build.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

CONTEXT_PARTS = ["containers", "envs/requirements.lock", "envs/requirements-cuda.lock", "pyproject.toml", "src"]
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc", "*.whl")
MOUNTED_CA = "/etc/ddlrepro-build-ca.pem"


def image_tag(variant: str) -> str:
    return f"localhost/ddlrepro:{variant}"


def prepare_context(repo: Path, context: Path, wheels: Path | None) -> Path:
    """A fresh build context: the files the Dockerfile and Apptainer.def copy, plus `wheels` (*.whl) if given."""
    if context.exists():
        shutil.rmtree(context)
    for part in CONTEXT_PARTS:
        source, target = repo / part, context / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=IGNORED)
        else:
            shutil.copy2(source, target)
    for wheel in sorted(wheels.glob("*.whl")) if wheels else []:
        shutil.copy2(wheel, context / "containers" / "wheels" / wheel.name)
    return context


def build_command(engine: str, settings: dict[str, Any], context: Path, iidfile: Path) -> list[str]:
    """The podman/docker build of `settings['variant']` from `settings['base']`, its image ID written to `iidfile`."""
    variant = settings["variant"]
    command = [engine, *settings["engine_args"], "build", *settings["build_args"]]
    command += ["-f", str(context / "containers" / "Dockerfile"), "-t", image_tag(variant), "--iidfile", str(iidfile)]
    command += ["--build-arg", f"BASE={settings['base']}", "--build-arg", f"VARIANT={variant}"]
    if settings["ca_bundle"]:
        if engine != "podman":
            raise ValueError("images.ca_bundle: only podman can mount a CA bundle into a build (docker build cannot)")
        command += ["-v", f"{Path(settings['ca_bundle']).resolve()}:{MOUNTED_CA}:ro"]
        command += ["--build-arg", f"PIP_CERT={MOUNTED_CA}"]
    return [*command, str(context)]


def apptainer_command(settings: dict[str, Any], sif: Path) -> list[str]:
    """`apptainer build` of Apptainer.def (run inside the build context, where its %files paths lie)."""
    command = ["apptainer", *settings["engine_args"], "build", "--force", *settings["build_args"]]
    command += ["--build-arg", f"VARIANT={settings['variant']}"]
    if settings["ca_bundle"]:
        command += ["--bind", f"{Path(settings['ca_bundle']).resolve()}:{MOUNTED_CA}"]
    return [*command, str(sif.resolve()), "containers/Apptainer.def"]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_image(engine: str, settings: dict[str, Any], repo: Path, out: Path) -> dict[str, Any]:
    """Build the image and write `out`: the digest file (podman/docker) or the `.sif` and `<sif>.sha256`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    wheels = Path(settings["wheels"]) if settings["wheels"] else None
    context = prepare_context(repo, out.parent / f"context-{settings['variant']}", wheels)
    try:
        if engine == "apptainer":
            return _build_sif(settings, context, out)
        return _build_engine_image(engine, settings, context, out)
    finally:
        shutil.rmtree(context, ignore_errors=True)


def _build_sif(settings: dict[str, Any], context: Path, sif: Path) -> dict[str, Any]:
    subprocess.run(apptainer_command(settings, sif), cwd=context, check=True)
    record = {"engine": "apptainer", "reference": str(sif.resolve()), "digest": f"sha256:{sha256_file(sif)}"}
    sif.with_name(sif.name + ".sha256").write_text(f"{record['digest'].split(':', 1)[1]}  {sif.name}\n")
    return record


def _build_engine_image(engine: str, settings: dict[str, Any], context: Path, out: Path) -> dict[str, Any]:
    iidfile = out.with_name(out.name + ".iid")
    subprocess.run(build_command(engine, settings, context, iidfile), check=True)
    digest = iidfile.read_text().strip()
    iidfile.unlink()
    record = {
        "engine": engine,
        "reference": image_tag(settings["variant"]),
        "digest": digest if digest.startswith("sha256:") else f"sha256:{digest}",
        "variant": settings["variant"],
        "base": settings["base"],
    }
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def read_image(path: Path) -> dict[str, Any]:
    """The image a run uses, from the build's digest file (JSON) or a `.sif.sha256` file."""
    if path.name.endswith(".sif.sha256"):
        digest, _, name = path.read_text().strip().partition("  ")
        sif = path.with_name(name.strip() or path.name.removesuffix(".sha256"))
        return {"engine": "apptainer", "reference": str(sif.resolve()), "digest": f"sha256:{digest}"}
    return cast("dict[str, Any]", json.loads(path.read_text()))
