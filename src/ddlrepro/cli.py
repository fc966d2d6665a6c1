"""`ddlrepro` command line: the steps the Snakemake rules call, usable by hand as well."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from ddlrepro.config import ConfigError, load_config
from ddlrepro.launchers.base import RunFailed
from ddlrepro.points import Point


def _exit_on_sigterm() -> None:
    """Turn SIGTERM (Snakemake cancelling a job) into SystemExit so cleanup stops the workers."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def cmd_run_point(args: argparse.Namespace) -> None:
    from ddlrepro.run import run_point

    _exit_on_sigterm()
    point = Point.from_json(args.point)
    try:
        record = run_point(point, Path(args.run_dir), args.launcher, args.timeout)
    except RunFailed as failure:
        sys.exit(f"run {point.figure}/{point.id} failed: {failure}\nlogs kept in {args.run_dir}")
    print(f"run {point.figure}/{point.id} ok in {record['duration_s']:.1f} s: {record['summary']}")


def cmd_tabulate(args: argparse.Namespace) -> None:
    from ddlrepro.tables import tidy_table

    table = tidy_table([Path(path).parent for path in args.results])
    table.to_csv(args.out, index=False)
    print(f"{args.out}: {len(table)} rows from {len(args.results)} runs")


def cmd_plot(args: argparse.Namespace) -> None:
    from ddlrepro.figures import render_figure

    render_figure(args.figure, Path(args.table), Path(args.png), Path(args.pdf), Path(args.summary), args.scale)


def cmd_report(args: argparse.Namespace) -> None:
    from ddlrepro.report import write_report

    write_report(Path(args.out), args.figures, args.scale, args.launcher, Path(args.results))


def cmd_validate(args: argparse.Namespace) -> None:
    load_config(*map(Path, args.configs))
    print("configuration is valid")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="ddlrepro", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run-point", help="run one point into its run folder")
    run.add_argument("--point", required=True, help="the point as JSON")
    run.add_argument("--run-dir", required=True)
    run.add_argument("--launcher", default="local")
    run.add_argument("--timeout", type=float, default=3600, help="seconds before the run is stopped")
    run.set_defaults(handler=cmd_run_point)

    tabulate = commands.add_parser("tabulate", help="tidy table from run folders")
    tabulate.add_argument("results", nargs="+", help="result.json files of the runs")
    tabulate.add_argument("--out", required=True)
    tabulate.set_defaults(handler=cmd_tabulate)

    plot = commands.add_parser("plot", help="render a figure and its summary table from its tidy table")
    plot.add_argument("figure")
    plot.add_argument("--table", required=True)
    plot.add_argument("--png", required=True)
    plot.add_argument("--pdf", required=True)
    plot.add_argument("--summary", required=True)
    plot.add_argument("--scale", default="smoke", help="paper scale also draws the papers' absolute numbers")
    plot.set_defaults(handler=cmd_plot)

    report = commands.add_parser("report", help="self-contained HTML report of the built figures")
    report.add_argument("--out", required=True)
    report.add_argument("--results", default="results", help="the results folder the figures were built in")
    report.add_argument("--scale", default="smoke")
    report.add_argument("--launcher", default="local")
    report.add_argument("figures", nargs="+", help="ids of the built figures")
    report.set_defaults(handler=cmd_report)

    validate = commands.add_parser("validate", help="check config files (merged in order) against the schema")
    validate.add_argument("configs", nargs="+")
    validate.set_defaults(handler=cmd_validate)
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        args.handler(args)
    except ConfigError as error:
        sys.exit(str(error))


if __name__ == "__main__":
    main()
