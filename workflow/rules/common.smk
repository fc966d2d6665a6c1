# Configuration validation and point expansion: runs before any job, so bad input never starts one.
import json
import os
import shlex
import sys
from importlib.resources import files as package_files

from snakemake.exceptions import WorkflowError

from ddlrepro.host.checks import check_exclude, checks_settings, load_references
from ddlrepro.host.config import validate_config
from ddlrepro.host.errors import UserError
from ddlrepro.host.bundle import bundle_name, digest_file
from ddlrepro.host.launchers.slurm import allocation
from ddlrepro.host.figures import FIGURES, enabled_figures, figure_points, figure_source
from ddlrepro.host.provenance import git_state, profile_from_command, record_invocation
from ddlrepro.host.launchers.sizes import check_sizes
from ddlrepro.host.redaction import declare_secret_variables

try:
    validate_config(config)
    check_exclude(
        checks_settings(config)["exclude"],
        load_references(Path(config["references"])),
        config["references"],
    )
    POINTS = figure_points(config)
    check_sizes(POINTS, config["launcher"])
    declare_secret_variables(config.get("redaction", {}).get("variables", []))
except (UserError, OSError) as error:
    raise WorkflowError(str(error)) from None

SOFTWARE = "../../envs/ddlrepro.yaml"
CHECKS = checks_settings(config)
# What the report's rerun command repeats: the profile and config files these results are built with.
RERUN_OPTIONS = " ".join(
    [f"--profile {profile_from_command(sys.argv)}"]
    * bool(profile_from_command(sys.argv))
    + [
        "--configfile "
        + " ".join(
            os.path.relpath(path, workflow.basedir)
            for path in workflow.overwrite_configfiles
        )
    ]
    * bool(workflow.overwrite_configfiles)
)
ENABLED = enabled_figures(config)
# Every path a rule names is relative to the working directory, so that a finished checkout moved or copied
# elsewhere (with results/ and .snakemake/) plans nothing: Snakemake reruns a job whose input list or params change.
CHECKOUT = os.path.relpath(workflow.basedir)
CAPTIONS = str(Path(CHECKOUT) / "workflow" / "report")
BUNDLE = f"results/bundle/{bundle_name(git_state(Path(CHECKOUT)))}.tar.gz"


def checkout_relative(path):
    """`path` relative to the working directory when it lies inside it (the package of an editable install); a
    package installed elsewhere stays where it is, whatever the checkout's path."""
    path = Path(path).resolve()
    here = Path.cwd().resolve()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


wildcard_constraints:
    figure="|".join(FIGURES),
    point="[A-Za-z0-9_.-]+",


def lookup_point(wildcards):
    try:
        return POINTS[wildcards.figure][wildcards.point]
    except KeyError:
        raise WorkflowError(
            f"no point {wildcards.point!r} in figure {wildcards.figure!r} under the current configuration"
        ) from None


def run_allocation(wildcards):
    """What a run asks a Slurm cluster for (ignored by the local launcher)."""
    runtime = max(1, int(config["launcher"]["timeout_s"] // 60))
    return allocation(lookup_point(wildcards), config["launcher"]["slurm"], runtime)


IMAGES = config["images"]
LAUNCHER = config["launcher"]["name"]
# Which launcher runs workers in which kind of built image (podman/docker: local processes; .sif: Slurm steps).
IMAGE_RUNNERS = {"podman": {"local", "kubernetes"}, "docker": {"local", "kubernetes"}}
IMAGE_RUNNERS["apptainer"] = {"slurm"}
if IMAGES["build"] and LAUNCHER not in IMAGE_RUNNERS[IMAGES["build"]]:
    raise WorkflowError(
        f"images.build: {IMAGES['build']} images are not run by the {LAUNCHER} launcher"
        f" (launcher.name); use {' or '.join(sorted(IMAGE_RUNNERS[IMAGES['build']]))}, or images.build: null"
    )


def image_file():
    """The built image's record (digest, or the .sif's sha256) every run depends on; none without images.build."""
    if not IMAGES["build"]:
        return []
    suffix = "sif.sha256" if IMAGES["build"] == "apptainer" else "digest"
    return [f"results/images/ddlrepro-{IMAGES['variant']}.{suffix}"]


def image_sources(wildcards):
    """Every file the image is built from."""
    base = Path(CHECKOUT)
    files = [base / "envs" / "requirements.txt", base / "pyproject.toml"]
    files += [
        path
        for path in (base / "containers").rglob("*")
        if path.is_file() and path.suffix != ".whl"
    ]
    files += [
        path
        for path in (base / "src" / "ddlrepro").rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and "figures" not in path.parts
    ]
    return sorted(str(path) for path in files)


def launcher_options():
    """run-point's options for the configured launcher and image (container, image digest, launcher settings)."""
    options = []
    sif = config["launcher"]["slurm"]["container"]
    if IMAGES["build"] == "apptainer" and not sif:
        sif = image_file()[0].removesuffix(".sha256")
    if sif and LAUNCHER == "slurm":
        options += ["--container", sif]
    if image_file():
        options += ["--image-file", image_file()[0]]
    if IMAGES["build"] in ("podman", "docker") and LAUNCHER == "local":
        engine = [IMAGES["build"], *IMAGES["engine_args"], "run", *IMAGES["run_args"]]
        options += ["--container-run", json.dumps(engine)]
    if LAUNCHER == "slurm":
        slurm = config["launcher"]["slurm"]
        read_by_render = ("tasks_per_node", "gpus_per_node", "mpi")
        options += [
            "--launcher-settings",
            json.dumps({key: slurm[key] for key in read_by_render}),
        ]
    if LAUNCHER == "kubernetes":
        options += ["--launcher-settings", json.dumps(config["launcher"]["kubernetes"])]
    return " ".join(shlex.quote(option) for option in options)


def allocated(name):
    """One setting of a run's Slurm allocation, as a Snakemake resource."""
    return lambda wildcards: run_allocation(wildcards).get(name, "")


def resumed_point_result(wildcards):
    """A run that continues another run's checkpoint (an elastic stage) waits for that run."""
    resumed = lookup_point(wildcards).params.get("resume_from")
    return [f"results/runs/{wildcards.figure}/{resumed}/result.json"] if resumed else []


def point_software(wildcards):
    """What a run needs built first: the project's Horovod for Horovod points."""
    framework = lookup_point(wildcards).params.get("framework")
    return ["results/software/horovod.txt"] if framework == "horovod" else []


def all_point_results(figures):
    return [
        f"results/runs/{figure}/{point}/result.json"
        for figure in figures
        for point in POINTS[figure]
    ]


def run_threads(wildcards):
    """Cores a run reserves: its workers' threads, or every core of this machine when local runs must not share it
    (on a cluster each run has its own allocation)."""
    # Kubernetes: the pods run on the cluster; here only the launcher that watches them.
    if LAUNCHER == "kubernetes":
        return 1
    point = lookup_point(wildcards)
    needed = point.workers * point.threads_per_worker
    sharing_this_machine = config["launcher"]["name"] == "local"
    return (
        max(needed, workflow.cores)
        if config["launcher"]["exclusive"] and sharing_this_machine
        else needed
    )


def point_results(wildcards):
    return [
        f"results/runs/{wildcards.figure}/{point}/result.json"
        for point in POINTS[wildcards.figure]
    ]


def figure_checks(figures):
    return [f"results/checks/{figure}.tsv" for figure in figures]


def figure_outputs(figures):
    """A figure's table, plot and summary, and the run results they are built from. Snakemake does not rerun a
    job whose output exists because an input is missing (it takes that for a removed intermediate), so a table
    would outlive a run folder whose result a killed forced rerun deleted; every target that asks for a figure
    also asks for its runs, which puts a missing run and everything built from it back in the plan.
    """
    return [
        path
        for figure in figures
        for path in (
            f"results/figures/{figure}.png",
            f"results/figures/{figure}.pdf",
            f"results/tables/{figure}.csv",
            f"results/tables/{figure}.summary.csv",
        )
    ] + all_point_results(figures)
