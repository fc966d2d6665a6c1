# Configuration validation and point expansion: runs before any job, so bad input never starts one.
import json
import os
import shlex
import sys
from importlib.resources import files as package_files

from snakemake.exceptions import WorkflowError

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import (
    check_exclude,
    collect_checks,
    configured_references,
    headline,
    timing_figures,
)
from ddlrepro.host.config import validate_config
from ddlrepro.host.errors import UserError
from ddlrepro.host.bundle import bundle_name, digest_file
from ddlrepro.host.datafetch import cifar10_folder
from ddlrepro.host.figures import (
    FIGURES,
    figure_module,
    figure_points,
    figure_source,
    previous_replicate,
    is_simulated,
    planned_figures,
    waiting_for_data,
    simulated_table_name,
    simulation_inputs,
    simulation_settings,
)
from ddlrepro.host.launch import launch_of
from ddlrepro.host.provenance import git_state, profile_from_command, record_invocation
from ddlrepro.host.launchers import (
    check_points,
    configured_launcher,
    point_problems,
    launcher_classes,
    resolved_launcher_name,
    snakemake_dry_run,
    snakemake_executor,
)
from ddlrepro.host.redaction import declare_secret_variables
from ddlrepro.rank.datasets import CIFAR10_FILES

try:
    validate_config(config)
    # `auto` follows where the runs execute: from here on the config (runs, provenance, report) names the result.
    # Snakemake's command line is parsed again only where the environment does not say (outside a Slurm job).
    config["launcher"]["name"] = resolved_launcher_name(
        config["launcher"]["name"], lambda: snakemake_executor(sys.argv[1:])
    )
    REFERENCES = configured_references(config["references"])
    check_exclude(
        config["checks"]["exclude"],
        REFERENCES,
        config["references"] or "the figures' references.yaml",
    )
    replicated = timing_figures(
        REFERENCES,
        config["scale"],
        config["checks"]["exclude"],
        config["checks"]["tier"],
    )
    POINTS = figure_points(config, replicated)
    # The configured launcher, as the workflow sees it: what each run may use and asks for (the image is known
    # only once built: each run builds its own from the same sections, `run-point --config-json`).
    LAUNCHER = configured_launcher(config)
    # A dry run previews (e.g. paper scale on a laptop): what would not fit here is told, and the plan goes on.
    if snakemake_dry_run(sys.argv[1:]):
        for problem in point_problems(POINTS, LAUNCHER):
            print(f"would not run here: {problem}", file=sys.stderr)
    else:
        check_points(POINTS, LAUNCHER)
    # figure → the data it waits for: skipped here, its checks listed as skipped in checks.tsv
    WAITING = waiting_for_data(config)
    for figure, waits_for in WAITING.items():
        print(f"{figure} skipped: {waits_for}", file=sys.stderr)
    declare_secret_variables(config["redaction"]["variables"])
except (UserError, OSError) as error:
    raise WorkflowError(str(error)) from None

SOFTWARE = "../../envs/ddlrepro.yaml"
CHECKS = config["checks"]  # its defaults filled in by validate_config
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
ENABLED = planned_figures(config)
# Every path a rule names is relative to the working directory, so that a finished checkout moved or copied
# elsewhere (with results/ and .snakemake/) plans nothing: Snakemake reruns a job whose input list or params change.
CHECKOUT = os.path.relpath(workflow.basedir)
# What every figure is checked against, gathered into one file (rule gather_references) that the bundle keeps.
REFERENCES_FILE = "results/references.yaml"


class CaptionText:
    """A figure's caption for Snakemake's own report (workflow/snakemake-report/caption.rst), read when the report
    renders it. An object, not a string: Snakemake leaves such params out of its rerun triggers, so editing a
    caption rebuilds results/report.html and never the plot."""

    def __init__(self, path):
        self.path = Path(path)

    def __str__(self):
        return self.path.read_text()


BUNDLE = f"results/bundle/{bundle_name(git_state(Path(CHECKOUT)))}.tar.gz"


def caption_file(figure):
    """A figure's caption (its folder's caption.rst), as the rules name it."""
    return checkout_relative(figure_file(figure, "caption.rst"))


def reference_sources():
    """The files results/references.yaml is gathered from: the configured file, or every figure's own."""
    if config["references"]:
        return [config["references"]]
    return [
        checkout_relative(figure_file(figure, "references.yaml")) for figure in FIGURES
    ]


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


def run_resources():
    """The run rule's resources: what the launcher asks a batch scheduler for per point (Slurm's allocation;
    none for the local and Kubernetes launchers)."""
    return {name: allocated(name) for name in LAUNCHER.resource_names}


def allocated(name):
    """One of a run's resources, as a Snakemake resource."""
    return lambda wildcards: LAUNCHER.resources(lookup_point(wildcards))[name]


IMAGES = config["images"]


def image_file():
    """The built image's record (digest, or the .sif's sha256) every run depends on; none without images.build."""
    if not IMAGES["build"]:
        return []
    suffix = "sif.sha256" if IMAGES["build"] == "apptainer" else "digest"
    return [f"results/images/ddlrepro-{IMAGES['variant']}.{suffix}"]


def image_sources(wildcards):
    """Every file the image is built from that its ranks run: the rank side of the package and the modules it
    shares with the host side, which it never imports (so editing host code rebuilds no image).
    """
    base = Path(CHECKOUT)
    package = base / "src" / "ddlrepro"
    files = [
        base / "envs" / "requirements.lock",
        base / "envs" / "requirements-cuda.lock",
    ]
    files += [base / "pyproject.toml"]
    files += [
        path
        for path in (base / "containers").rglob("*")
        if path.is_file() and path.suffix != ".whl"
    ]
    files += list(package.glob("*.py"))
    files += [
        path
        for path in (package / "rank").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    return sorted(str(path) for path in files)


def launcher_options():
    """run-point's options: what the configured launcher builds its options from (the launcher section without
    the other launchers' sections, and the images section when an image is built), and the built image's record.
    Only what this launcher reads is a param: changing another launcher's settings reruns nothing.
    """
    others = set(launcher_classes()) - {config["launcher"]["name"]}
    launcher = {
        key: value for key, value in config["launcher"].items() if key not in others
    }
    sections = {"launcher": launcher} | ({"images": IMAGES} if IMAGES["build"] else {})
    options = ["--config-json", json.dumps(sections, sort_keys=True)]
    options += ["--image-file", *image_file()] if image_file() else []
    return " ".join(shlex.quote(option) for option in options)


def resumed_point_result(wildcards):
    """A run that continues another run's checkpoint (an elastic stage) waits for that run."""
    resumed = launch_of(lookup_point(wildcards)).resumes
    return [f"results/runs/{wildcards.figure}/{resumed}/result.json"] if resumed else []


def previous_replicate_results(wildcards):
    """A replicate starts once the replicate before it of every point of its figure has run (A B, then A B)."""
    points = POINTS[wildcards.figure]
    return [
        f"results/runs/{wildcards.figure}/{point.id}/result.json"
        for point in previous_replicate(points, lookup_point(wildcards))
    ]


def point_software(wildcards):
    """What a run needs built first: the project's Horovod for Horovod points."""
    needs_build = launch_of(lookup_point(wildcards)).horovod_build
    return ["results/software/horovod.txt"] if needs_build else []


def point_data(wildcards):
    """What a run reads besides its point: the packed shards of a non-synthetic data source, CIFAR-10's batches
    (fetched first by fetch_cifar10 where they are missing and `download` allows)."""
    point = lookup_point(wildcards)
    shards = point.inputs.get("shards_dir")
    if launch_of(point).cifar10:
        return [str(Path(point.inputs["data_dir"]) / name) for name in CIFAR10_FILES]
    return [shards] if shards else []


def shard_options(figure):
    """pack_shards' options, from the figure's shard settings (what the shards hold)."""
    settings = figure_module(figure).shard_settings(config["figures"][figure])
    options = [
        f"--{key.replace('_', '-')} {value}"
        for key, value in settings.items()
        if value is not None
    ]
    return " ".join(options)


def all_point_results(figures):
    return [
        f"results/runs/{figure}/{point}/result.json"
        for figure in figures
        for point in POINTS[figure]
    ]


def run_threads(wildcards):
    """Cores a run takes where Snakemake runs its job, as its launcher says: local processes take their workers'
    threads (every core when runs must not share the machine), a Slurm run its allocation, a Kubernetes run only
    the launcher that watches its pods."""
    # workflow.cores is read only by a launcher that needs it: under a cluster profile it is not set.
    return LAUNCHER.host_cores(lookup_point(wildcards), lambda: workflow.cores)


def point_results(wildcards):
    return [
        f"results/runs/{wildcards.figure}/{point}/result.json"
        for point in POINTS[wildcards.figure]
    ]


def figure_checks(figures):
    return [f"results/checks/{figure}.tsv" for figure in figures]


SIMULATED = [figure for figure in FIGURES if is_simulated(figure)]


def plot_table(wildcards):
    """What a figure draws: its runs' tidy table, or for a simulated figure the simulation of it."""
    name = (
        simulated_table_name(wildcards.figure)
        if wildcards.figure in SIMULATED
        else f"{wildcards.figure}.csv"
    )
    return f"results/tables/{name}"


def simulation_files(wildcards):
    """The files a simulation reads besides its runs' table: a user's trace, the artifact's profiles."""
    section = config["figures"][wildcards.figure]
    return [str(path) for path in simulation_inputs(wildcards.figure, section).values()]


def figure_outputs(figures):
    """A figure's table, plot and summary, and the run results they are built from. Snakemake does not rerun a
    job whose output exists because an input is missing (it takes that for a removed intermediate), so a table
    would outlive a run folder whose result a killed forced rerun deleted; every target that asks for a figure
    also asks for its runs, which puts a missing run and everything built from it back in the plan.
    """
    return (
        [
            path
            for figure in figures
            for path in (
                f"results/figures/{figure}.png",
                f"results/figures/{figure}.pdf",
                f"results/tables/{figure}.csv",
                f"results/tables/{figure}.summary.csv",
            )
        ]
        + [
            f"results/tables/{simulated_table_name(figure)}"
            for figure in figures
            if figure in SIMULATED
        ]
        + all_point_results(figures)
    )


def print_headline(checks):
    """The answer, last thing on the screen: "N deterministic checks pass; M timing claims pass, K inconclusive"."""
    if checks.exists():
        print(
            f"ddlrepro: {headline(collect_checks([checks]))} ({checks}, results/report.html)"
        )


def speed_guard_option(max_speed_drift):
    """tabulate's machine-speed guard: its threshold where checks.max_speed_drift sets one (null: recorded only)."""
    if max_speed_drift is None:
        return ""
    return f"--max-speed-drift {max_speed_drift}"
