"""`ddlrepro` command line: the steps the Snakemake rules call, usable by hand as well."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from ddlrepro.host.config import load_config, schema_default
from ddlrepro.host.errors import UserError
from ddlrepro.host.launchers.base import RunFailed
from ddlrepro.host.redaction import redact
from ddlrepro.points import Point
from ddlrepro.shutdown import skip_final_collection


def _exit_on_sigterm() -> None:
    """Turn SIGTERM (Snakemake cancelling a job) into SystemExit so cleanup stops the workers."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def cmd_run_point(args: argparse.Namespace) -> None:
    from ddlrepro.host.images import read_image
    from ddlrepro.host.launchers import configured_launcher
    from ddlrepro.host.run import run_point

    _exit_on_sigterm()
    point = Point.from_json(args.point)
    image = read_image(Path(args.image_file)) if args.image_file else None
    launcher = configured_launcher(json.loads(args.config_json), image)
    try:
        record = run_point(point, Path(args.run_dir), launcher, image, args.attempt)
    except RunFailed as failure:
        sys.exit(redact(f"run {point.figure}/{point.id} failed: {failure}\nlogs kept in {args.run_dir}"))
    outcome = record.get("reason") or record["summary"]
    print(f"run {point.figure}/{point.id} {record['status']} in {record['duration_s']:.1f} s: {outcome}")


def cmd_render(args: argparse.Namespace) -> None:
    """Print the job a launcher would start (Kubernetes: its manifests as YAML, ready for `kubectl apply -f -`)."""
    import yaml

    from ddlrepro.host.launchers import configured_launcher

    launcher = configured_launcher(json.loads(args.config_json))
    spec = launcher.render(Point.from_json(args.point), Path(args.run_dir))
    manifests = getattr(spec.request, "manifests", None)
    print(yaml.safe_dump_all(manifests, sort_keys=False) if manifests else json.dumps(spec.to_dict(), indent=2))


def cmd_build_image(args: argparse.Namespace) -> None:
    from ddlrepro.host.images import build_image

    settings = {**json.loads(args.settings), "variant": args.variant}
    record = build_image(args.engine, settings, Path(args.repository), Path(args.out))
    print(f"{args.out}: {record['engine']} image {record['reference']} {record['digest']}")


def cmd_tabulate(args: argparse.Namespace) -> None:
    from ddlrepro.host.tables import tidy_table

    table = tidy_table([Path(path).parent for path in args.results], args.max_foreign_share, args.max_speed_drift)
    table.to_csv(args.out, index=False)
    print(f"{args.out}: {len(table)} rows from {len(args.results)} runs")


def cmd_simulate_table(args: argparse.Namespace) -> None:
    from ddlrepro.host.figures import write_simulated_table

    runs = [Path(path) for path in args.runs]
    write_simulated_table(args.figure, Path(args.table), json.loads(args.settings), runs, Path(args.out))
    print(f"{args.out}: {args.figure} simulated from {args.table}")


def cmd_plot(args: argparse.Namespace) -> None:
    from ddlrepro.host.checks import configured_references
    from ddlrepro.host.figures import render_figure

    references = configured_references(args.references).get(args.figure, [])
    outputs = (Path(args.png), Path(args.pdf), Path(args.summary) if args.summary else None)
    runs = [Path(path) for path in args.runs]
    render_figure(args.figure, Path(args.table), outputs, args.scale, references, runs)


def cmd_summarize(args: argparse.Namespace) -> None:
    from ddlrepro.host.figures import write_summary

    write_summary(args.figure, Path(args.table), Path(args.out))
    print(f"{args.out}: {args.figure}'s summary of {args.table}")


def cmd_check(args: argparse.Namespace) -> None:
    import pandas as pd

    from ddlrepro.host.checks import check_figure, configured_references

    references = configured_references(args.references).get(args.figure, [])
    checks = check_figure(args.figure, pd.read_csv(args.summary), references, args.scale, args.exclude, args.tier)
    checks.to_csv(args.out, sep="\t", index=False)
    print(f"{args.figure}: " + ", ".join(f"{n} {s}" for s, n in checks["status"].value_counts().items()))


def cmd_collect_checks(args: argparse.Namespace) -> None:
    from ddlrepro.host.checks import collect_checks, configured_references, headline

    waiting = json.loads(args.waiting)
    references = configured_references(args.references) if waiting else None
    checks = collect_checks([Path(path) for path in args.checks], waiting, references)
    checks.to_csv(args.out, sep="\t", index=False)
    print(headline(checks))


def cmd_gather_references(args: argparse.Namespace) -> None:
    from ddlrepro.host.checks import configured_references, references_text

    references = configured_references(args.references)
    Path(args.out).write_text(references_text(references))
    print(f"{args.out}: {sum(map(len, references.values()))} references of {len(references)} figures")


def cmd_new_figure(args: argparse.Namespace) -> None:
    from ddlrepro.host.scaffold import new_figure

    folder = os.path.relpath(new_figure(args.figure, args.title))
    print(f"{folder}: a new figure {args.figure!r}; build it with `snakemake {args.figure.replace('-', '_')}`")


def cmd_report(args: argparse.Namespace) -> None:
    from ddlrepro.host.report import ReportRequest, write_report

    request = ReportRequest(
        figures=args.figures,
        scale=args.scale,
        launcher=args.launcher,
        captions=[Path(path) for path in args.captions],
        results=Path(args.results),
        rerun_options=args.rerun_options,
        repository=Path(args.repository),
    )
    write_report(Path(args.out), request)


def cmd_bundle(args: argparse.Namespace) -> None:
    from ddlrepro.host.bundle import create_bundle, digest_file

    run_dirs = [Path(path).parent for path in args.runs]
    config = json.loads(args.config_json)
    out = create_bundle(
        Path(args.out), Path(args.results), args.figures, run_dirs, config, Path(args.references), Path(args.repository)
    )
    print(f"{out}: {len(run_dirs)} runs, figures {', '.join(args.figures)}")
    print(f"{out}: manifest sha256 {digest_file(out).read_text().strip()} (also in {digest_file(out)})")


def cmd_verify(args: argparse.Namespace) -> None:
    from ddlrepro.host.bundle import NOT_REDERIVED, BundleError, manifest_digest, read_bundle, verify_members

    bundle = Path(args.bundle)
    signers = Path(args.allowed_signers) if args.allowed_signers else None
    try:
        members = read_bundle(bundle)
        problems = verify_members(members, not args.hashes_only, args.expect, signers)
    except BundleError as error:
        sys.exit(f"{bundle} does NOT verify: {error}")
    if problems:
        sys.exit(f"{bundle} does NOT verify:\n" + "\n".join(f"  - {problem}" for problem in problems))
    digest = manifest_digest(members)
    print(f"{bundle} verifies: every hash matches (manifest sha256 {digest})")
    print("  - digest: " + ("as expected" if args.expect else "not anchored (pass --expect with the published one)"))
    print("  - signature: " + (f"by a key in {signers}" if signers else "not checked (pass --allowed-signers)"))
    if not args.hashes_only:
        print("  - every table, figure and check re-derived from the bundled runs matches")
    anchored = "anchored by the digest or signature" if args.expect or signers else "NOT anchored: pass --expect"
    print(f"  - not re-derived, covered by the hashes only ({anchored}): {'; '.join(NOT_REDERIVED)}")


def cmd_compare(args: argparse.Namespace) -> None:
    from ddlrepro.host.compare import check_names, compare_environments

    named = [parse_environment(text) for text in args.env]
    check_names([name for name, _ in named])  # before the dict, which would keep one of two same names
    environments = dict(named)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, csv = out_dir / f"{args.figure}.png", out_dir / f"{args.figure}.csv"
    merged = compare_environments(args.figure, environments, png, csv)
    print(f"{png}, {csv}: {len(merged)} rows from {', '.join(environments)}")


def parse_environment(text: str) -> tuple[str, Path]:
    name, separator, source = text.partition("=")
    if not separator or not name or not source:
        raise SystemExit(f"--env takes NAME=RESULTS_FOLDER_OR_BUNDLE, got {text!r}")
    return name, Path(source)


def cmd_install_profile(args: argparse.Namespace) -> None:
    from ddlrepro.host.snakemake_profiles import install_profile

    print(install_profile(Path(args.profile)))


def cmd_validate(args: argparse.Namespace) -> None:
    load_config(*map(Path, args.configs))
    print("configuration is valid")


def cmd_paper_settings(args: argparse.Namespace) -> None:
    from ddlrepro.host.paper_settings import settings_page

    page = settings_page(Path(args.smoke), Path(args.paper))
    if args.out:
        Path(args.out).write_text(page)
    else:
        print(page, end="")


def cmd_config_reference(args: argparse.Namespace) -> None:
    from ddlrepro.host.config_reference import reference_page

    page = reference_page()
    if args.out:
        Path(args.out).write_text(page)
    else:
        print(page, end="")


def cmd_fetch_data(args: argparse.Namespace) -> None:
    from ddlrepro.host.datafetch import CIFAR10_URL, fetch_cifar10

    fetch_cifar10(Path(args.folder), args.url or CIFAR10_URL)
    print(f"CIFAR-10's python batches in {args.folder}, MD5 checked")


def cmd_simulate(args: argparse.Namespace) -> None:
    from ddlrepro.host.simulator import cli

    cli.run(args)


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ddlrepro")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


REFERENCES_HELP = "a references file (figure id → references); default: each figure's own references.yaml"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="ddlrepro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    top.add_argument("--version", action="version", version=f"ddlrepro {installed_version()}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of those below")
    listing: dict[str, str] = {}

    def command(name: str, help: str, **options: Any) -> argparse.ArgumentParser:
        """A subcommand, listed in its group of the top-level help (COMMAND_GROUPS) rather than argparse's list."""
        listing[name] = help
        return commands.add_parser(name, description=help[0].upper() + help[1:] + ".", **options)

    config_help = (
        "JSON: the config's `launcher` and `images` sections (what is left out takes the schema's default; "
        "launcher.name picks the launcher)"
    )
    run = command("run-point", help="run one point into its run folder")
    run.add_argument("--point", required=True, help="the point as JSON")
    run.add_argument("--run-dir", required=True)
    run.add_argument("--config-json", default="{}", help=config_help)
    run.add_argument("--image-file", help="the built image's digest file (or .sif.sha256), recorded in provenance")
    run.add_argument(
        "--attempt", type=int, default=1, help="Snakemake's attempt number of this job (2 on its first retry)"
    )
    run.set_defaults(handler=cmd_run_point)

    render = command("render", help="print the job a launcher would start, without starting it")
    render.add_argument("--point", required=True, help="the point as JSON")
    render.add_argument("--run-dir", default="results/runs/render")
    render.add_argument("--config-json", default="{}", help=config_help)
    render.set_defaults(handler=cmd_render)

    install = command(
        "install-profile",
        help="install a Snakemake profile folder as the user's profile of its name, unless the user or site has one",
    )
    install.add_argument("profile", help="the profile folder, e.g. profiles/slurm")
    install.set_defaults(handler=cmd_install_profile)

    build = command("build-image", help="build the training image (containers/) and write its digest")
    build.add_argument("--engine", required=True, choices=["podman", "docker", "apptainer"])
    build.add_argument("--variant", required=True, choices=["cpu", "cuda"])
    build.add_argument("--settings", required=True, help="JSON: the config's `images` section")
    build.add_argument("--out", required=True, help="digest file (podman/docker) or .sif (apptainer)")
    build.add_argument("--repository", required=True, help="the checkout whose containers/, envs/, src/ are built")
    build.set_defaults(handler=cmd_build_image)

    tabulate = command("tabulate", help="tidy table from run folders")
    tabulate.add_argument("results", nargs="*", help="result.json files of the runs (none: an empty table)")
    tabulate.add_argument("--out", required=True)
    tabulate.add_argument(
        "--max-foreign-share",
        type=float,
        default=schema_default("checks", "max_foreign_share"),
        help="a run is disturbed above this foreign + steal CPU share",
    )
    tabulate.add_argument(
        "--max-speed-drift",
        type=float,
        default=schema_default("checks", "max_speed_drift"),
        help="a run is disturbed when the machine's speed moved by more than this share while it ran (default: not)",
    )
    tabulate.set_defaults(handler=cmd_tabulate)

    simulated = command("simulate-table", help="a simulated figure's simulation table from its runs' tidy table")
    simulated.add_argument("figure")
    simulated.add_argument("--table", required=True, help="the runs' tidy table")
    simulated.add_argument("--settings", required=True, help="JSON: the simulation's keys of the figure's section")
    simulated.add_argument("--runs", nargs="*", default=[], help="the runs' result.json files (the profiles' host)")
    simulated.add_argument("--out", required=True)
    simulated.set_defaults(handler=cmd_simulate_table)

    summarize = command("summarize", help="a figure's summary table (what its checks read) from its tidy table")
    summarize.add_argument("figure")
    summarize.add_argument("--table", required=True, help="the runs' tidy table (a simulated figure: its simulation)")
    summarize.add_argument("--out", required=True)
    summarize.set_defaults(handler=cmd_summarize)

    plot = command("plot", help="draw a figure from its tidy table")
    plot.add_argument("figure")
    plot.add_argument("--table", required=True)
    plot.add_argument("--png", required=True)
    plot.add_argument("--pdf", required=True)
    plot.add_argument("--summary", help="also write its summary table here (as `summarize`)")
    plot.add_argument("--scale", default="smoke", help="paper scale also draws the papers' absolute numbers")
    plot.add_argument(
        "--references", default=None, help="a references file (figure id → references); default: each figure's own"
    )
    plot.add_argument(
        "--runs", nargs="*", default=[], help="the runs' result.json files: the footer names the machine they ran on"
    )
    plot.set_defaults(handler=cmd_plot)

    check = command("check", help="check a figure's summary table against the papers")
    check.add_argument("figure")
    check.add_argument("--summary", required=True)
    check.add_argument(
        "--references", default=None, help="a references file (figure id → references); default: each figure's own"
    )
    check.add_argument("--scale", required=True)
    check.add_argument("--tier", choices=["quick", "thorough"], default="thorough", help="checks.tier")
    check.add_argument("--out", required=True, help="TSV of the figure's checks")
    check.add_argument("--exclude", nargs="*", default=[], help="'<figure>/<id>' references not evaluated (config)")
    check.set_defaults(handler=cmd_check)

    collect = command("collect-checks", help="concatenate per-figure check tables")
    collect.add_argument("checks", nargs="*")
    collect.add_argument("--out", required=True)
    collect.add_argument("--waiting", default="{}", help="JSON {figure: what it waits for}: its checks are skipped")
    collect.add_argument(
        "--references", default=None, help="a references file (figure id → references); default: each figure's own"
    )
    collect.set_defaults(handler=cmd_collect_checks)

    gather = command("gather-references", help="write the references the figures are checked against to one file")
    gather.add_argument(
        "--references", default=None, help="a references file (figure id → references); default: each figure's own"
    )
    gather.add_argument("--out", required=True)
    gather.set_defaults(handler=cmd_gather_references)

    report = command("report", help="self-contained HTML report of the built figures")
    report.add_argument("--out", required=True)
    report.add_argument("--results", default="results", help="the results folder the figures were built in")
    report.add_argument("--scale", default="smoke")
    report.add_argument("--launcher", default="local")
    report.add_argument("--rerun-options", default="", help="Snakemake options the rerun command repeats (config)")
    report.add_argument("--captions", nargs="*", default=[], help="the figures' captions, each <figure>.rst")
    report.add_argument("--repository", default=".", help="the checkout the figures were built with (git state)")
    report.add_argument("figures", nargs="+", help="ids of the built figures")
    report.set_defaults(handler=cmd_report)

    bundle = command("bundle", help="pack results, code and config into a verifiable tarball")
    bundle.add_argument("--out", required=True)
    bundle.add_argument("--results", default="results")
    bundle.add_argument("--figures", nargs="+", required=True)
    bundle.add_argument("--runs", nargs="+", required=True, help="result.json of every run to include")
    bundle.add_argument("--config-json", required=True, help="the configuration as used")
    bundle.add_argument("--references", required=True)
    bundle.add_argument("--repository", default=".", help="the checkout whose code (git archive HEAD) is bundled")
    bundle.set_defaults(handler=cmd_bundle)

    verify = command("verify", help="check a bundle's hashes and re-derive its tables, figures, checks")
    verify.add_argument("bundle")
    verify.add_argument("--hashes-only", action="store_true", help="skip re-deriving from the runs")
    verify.add_argument("--expect", metavar="DIGEST", help="the published sha256 of the bundle's MANIFEST.json")
    verify.add_argument(
        "--allowed-signers", metavar="FILE", help="ssh-keygen allowed_signers file: require a signature by one of them"
    )
    verify.set_defaults(handler=cmd_verify)

    compare = command("compare", help="one figure across environments (results folders or bundles)")
    compare.add_argument("figure")
    compare.add_argument("--env", action="append", required=True, help="NAME=RESULTS_FOLDER_OR_BUNDLE, twice or more")
    compare.add_argument("--out-dir", default="results/compare")
    compare.set_defaults(handler=cmd_compare)

    validate = command("validate", help="check config files (merged in order) against the schema")
    validate.add_argument("configs", nargs="+")
    validate.set_defaults(handler=cmd_validate)

    reference = command("config-reference", help="every config key from the schema, as markdown")
    reference.add_argument("--out", help="write it here (config/README.md) instead of printing it")
    reference.set_defaults(handler=cmd_config_reference)

    fetch = command("fetch-data", help="download a data set, verify its checksum, move it into place")
    fetch.add_argument("dataset", choices=["cifar10"])
    fetch.add_argument("--folder", required=True, help="where its files go (the figure's data_dir)")
    fetch.add_argument("--url", help="its address (default: the canonical one)")
    fetch.set_defaults(handler=cmd_fetch_data)

    paper = command("paper-settings", help="every paper-scale parameter with its source, as markdown")
    paper.add_argument("--smoke", default="config/config.yaml", help="the smoke config (read first, as Snakemake)")
    paper.add_argument("--paper", default="config/paper.yaml", help="the paper config and its sourced block")
    paper.add_argument("--out", help="write here (docs/paper-scale.md) instead of standard output")
    paper.set_defaults(handler=cmd_paper_settings)

    new = command("new-figure", help="start a figure of your own: its folder, from a template that builds and checks")
    new.add_argument("figure", help="its id: lowercase words joined by -, e.g. mypaper-fig3")
    new.add_argument("--title", help="its title (default: from the id)")
    new.set_defaults(handler=cmd_new_figure)

    simulate = command("simulate", help="replay a job trace on a simulated cluster under policies")
    from ddlrepro.host.simulator.cli import add_arguments

    add_arguments(simulate)
    simulate.set_defaults(handler=cmd_simulate)
    top.epilog = grouped_commands(listing)
    return top


# The top-level help lists the commands in these groups, in this order (every command in exactly one).
COMMAND_GROUPS = {
    "check, share and inspect": [
        "validate", "render", "report", "bundle", "verify", "compare", "config-reference", "paper-settings",
    ],
    "data, simulation and new figures": ["fetch-data", "simulate", "new-figure"],
    "workflow steps (the Snakemake rules run these; by hand too)": [
        "run-point", "tabulate", "simulate-table", "summarize", "plot", "gather-references", "check", "collect-checks",
        "build-image", "install-profile",
    ],
}  # fmt: skip


def subcommands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's own parser, by name (for the generated reference and the docs' tests)."""
    action = next(action for action in top._actions if isinstance(action, argparse._SubParsersAction))
    return dict(action.choices)


def flags(command: argparse.ArgumentParser) -> set[str]:
    return {flag for action in command._actions for flag in action.option_strings}


def grouped_commands(listing: dict[str, str]) -> str:
    """The commands' one-line helps under their groups' titles."""
    grouped = [name for names in COMMAND_GROUPS.values() for name in names]
    if sorted(grouped) != sorted(listing):
        raise RuntimeError(f"COMMAND_GROUPS and the commands differ: {sorted(set(grouped) ^ set(listing))}")
    width = max(len(name) for name in listing) + 2
    lines = []
    for title, names in COMMAND_GROUPS.items():
        lines += ["", f"{title}:", *(f"  {name:<{width}}{listing[name]}" for name in names)]
    return "\n".join(lines[1:])


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        args.handler(args)
    except UserError as error:  # its message is the whole story; anything else is a bug, shown with its traceback
        sys.exit(redact(str(error)))
    except Exception:
        sys.exit(redact(traceback.format_exc()))


if __name__ == "__main__":
    main()
    skip_final_collection()
