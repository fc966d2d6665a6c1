"""The performance page's table (docs/performance.md), generated from the benchmarks' JSON files
(results/benchmarks/*.json).

Rewrites the page between `<!-- benchmarks:begin -->` and `<!-- benchmarks:end -->`: one row per figure measured,
with its target and verdict from benchmarks/targets.yaml (the same checks as results/benchmarks.tsv), the host load
it was measured under, the date, commit and machine of its run and the command that ran it; below it, the
machines in full.
`--check` changes nothing and fails when the page's table differs from the one the JSON files give.

    python benchmarks/readme_table.py [--results results/benchmarks] [--readme docs/performance.md] [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from _common import REPO, RESULTS, TARGETS, check_benchmark, command_line, load_note, load_targets, meaningful
from report import read_results

from ddlrepro.host.errors import UserError

BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
HEADER = ["what", "measured", "target", "verdict", "host load", "run", "how"]


def cell(text: str) -> str:
    """Text that cannot end a Markdown table cell early."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cell(text) for text in cells) + " |"


def verdicts(document: dict[str, Any], targets: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """Per figure id, the (target, verdict) of each target that measures it."""
    checks = check_benchmark(document["benchmark"], document["figures"], targets).to_dict("records")
    found: dict[str, list[tuple[str, str]]] = {}
    for target, check in zip(targets, checks, strict=True):
        figure = target["measured"].get("where", {}).get("id")
        verdict = check["status"] if check["status"] == "pass" else f"**{check['status']}**"
        if check["status"] == "inconclusive":
            verdict += f": {check['reason']}"
        found.setdefault(figure, []).append((f"{check['reference'] or ''} {check['unit']}".strip(), verdict))
    return found


def run_cell(document: dict[str, Any]) -> str:
    """When, at which commit and on which machine (in short: the lines below the table say more) the run was."""
    sha = (document["git"].get("sha") or "unknown")[:10]
    dirty = " + changes" if document["git"].get("dirty") else ""
    host = document["host"]
    return f"{document['date'][:10]} `{sha}`{dirty}, {host['cpu_model']} × {host['cpu_count']}"


def benchmark_rows(document: dict[str, Any], targets: list[dict[str, Any]]) -> list[str]:
    """A benchmark's figures, its run and command in its first row only."""
    judged = verdicts(document, targets)
    rows = []
    for index, figure in enumerate(document["figures"]):
        measured = f"{meaningful(figure['value'], figure.get('noise'))} {figure['unit']}".strip()
        target = "; ".join(reference for reference, _ in judged.get(figure["id"], []))
        verdict = "; ".join(verdict for _, verdict in judged.get(figure["id"], []))
        how = (run_cell(document), f"`{command_line(document)}`") if index == 0 else ("", "")
        rows.append(row([figure["what"], measured, target, verdict, load_note(figure), *how]))
    return rows


def machines(documents: list[dict[str, Any]]) -> list[str]:
    """One line per machine the benchmarks ran on, naming its benchmarks."""
    by_machine: dict[str, list[str]] = {}
    for document in documents:
        host = document["host"]
        memory = f", {host['memory_bytes'] / 2**30:.0f} GiB" if host.get("memory_bytes") else ""
        machine = f"{host['cpu_model']}, {host['cpu_count']} CPUs ({host['cpu_usable']} usable){memory}, {host['os']}"
        by_machine.setdefault(machine, []).append(document["benchmark"])
    return [f"Measured on {machine}: {', '.join(names)}." for machine, names in by_machine.items()]


def table(documents: list[dict[str, Any]], targets: dict[str, list[dict[str, Any]]]) -> str:
    """The generated Markdown between the markers, benchmarks in the targets file's order."""
    order = [*targets, *sorted({document["benchmark"] for document in documents} - set(targets))]
    ordered = sorted(documents, key=lambda document: order.index(document["benchmark"]))
    lines = [row(HEADER), "|" + "---|" * len(HEADER)]
    for document in ordered:
        lines += benchmark_rows(document, targets.get(document["benchmark"], []))
    return "\n".join([*lines, "", *machines(ordered)])


def with_table(readme: str, generated: str, name: str = "README.md") -> str:
    """`readme` with the text between the markers replaced by `generated`."""
    pattern = re.compile(f"{re.escape(BEGIN)}\n.*?{re.escape(END)}", re.DOTALL)
    if not pattern.search(readme):
        raise UserError(f"{name} has no {BEGIN} ... {END} lines to put the benchmarks' table between")
    return pattern.sub(lambda _: f"{BEGIN}\n{generated}\n{END}", readme, count=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the benchmarks' JSON files")
    parser.add_argument("--targets", type=Path, default=TARGETS)
    parser.add_argument("--readme", type=Path, default=REPO / "docs" / "performance.md")
    parser.add_argument("--check", action="store_true", help="fail if the page's table is stale; change nothing")
    args = parser.parse_args()
    current = args.readme.read_text()
    updated = with_table(current, table(read_results(args.results), load_targets(args.targets)), args.readme.name)
    if args.check:
        if updated != current:
            sys.exit(f"{args.readme}: the benchmarks' table is stale; run python benchmarks/readme_table.py")
        print(f"{args.readme}: the benchmarks' table is up to date")
    elif updated != current:
        args.readme.write_text(updated)
        print(f"{args.readme}: benchmarks' table rewritten from {args.results}")


if __name__ == "__main__":
    try:
        main()
    except UserError as error:
        sys.exit(str(error))
