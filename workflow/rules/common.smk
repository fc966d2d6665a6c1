# Configuration validation and point expansion: runs before any job, so bad input never starts one.
import shlex
import sys

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from ddlrepro.jobenv import expose_to_jobs

expose_to_jobs(Path(workflow.basedir) / "src")

from ddlrepro.config import ConfigError, validate_config
from ddlrepro.figures import FIGURES, enabled_figures, figure_points, figure_source

try:
    validate_config(
        config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"
    )
except ConfigError as error:
    raise WorkflowError(str(error)) from None

SOFTWARE = "../../envs/ddlrepro.yaml"
ENABLED = enabled_figures(config)
POINTS = figure_points(config)


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


def run_threads(wildcards):
    """Cores a run reserves: its workers' threads, or all of them when runs must not share the machine."""
    point = lookup_point(wildcards)
    needed = point.workers * point.threads_per_worker
    return max(needed, workflow.cores) if config["launcher"]["exclusive"] else needed


def point_results(wildcards):
    return [
        f"results/runs/{wildcards.figure}/{point}/result.json"
        for point in POINTS[wildcards.figure]
    ]


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
