# Configuration validation and point expansion: runs before any job, so bad input never starts one.
import json
import shlex
import sys

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from ddlrepro.jobenv import expose_to_jobs

expose_to_jobs(Path(workflow.basedir) / "src")

from ddlrepro.checks import load_references
from ddlrepro.config import ConfigError, validate_config
from ddlrepro.bundle import bundle_name
from ddlrepro.launchers.slurm import allocation
from ddlrepro.figures import FIGURES, enabled_figures, figure_points, figure_source
from ddlrepro.provenance import git_state, record_invocation

try:
    validate_config(
        config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"
    )
    load_references(Path(config["references"]))
    POINTS = figure_points(config)
except (ConfigError, OSError) as error:
    raise WorkflowError(str(error)) from None

SOFTWARE = "../../envs/ddlrepro.yaml"
ENABLED = enabled_figures(config)
BUNDLE = f"results/bundle/{bundle_name(git_state(Path(workflow.basedir)))}.tar.gz"


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


def container_option():
    image = config["launcher"]["slurm"]["container"]
    return (
        f"--container {shlex.quote(image)}"
        if image and config["launcher"]["name"] == "slurm"
        else ""
    )


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
    return [
        path
        for figure in figures
        for path in (
            f"results/figures/{figure}.png",
            f"results/figures/{figure}.pdf",
            f"results/tables/{figure}.csv",
            f"results/tables/{figure}.summary.csv",
        )
    ]
