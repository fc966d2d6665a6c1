"""Every benchmark target's verdict in one table, `results/benchmarks.tsv`, from the benchmarks' JSON files.

Each `results/benchmarks/<benchmark>.json` present is checked against `benchmarks/targets.yaml` (the workflow's
checks, as `_common.check_benchmark`): one row per target, pass, fail, disturbed, inconclusive, or skipped with
its reason (a figure that run did not measure, or a benchmark not run: no JSON file).

    python benchmarks/report.py [--results results/benchmarks] [--out results/benchmarks.tsv]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from _common import REPO, RESULTS, TARGETS, check_benchmark, load_targets

from ddlrepro.host.errors import UserError

RECORD_KEYS = {"benchmark", "argv", "date", "git", "host", "figures"}
TSV_COLUMNS = ["benchmark", "check", "status", "measured", "reference", "unit", "reason", "claim", "date", "git_sha"]


def read_results(folder: Path) -> list[dict[str, Any]]:
    """Every benchmark's JSON record in `folder`, by name; UserError naming a file that is not one."""
    documents = []
    for path in sorted(folder.glob("*.json")):
        document = json.loads(path.read_text())
        missing = sorted(RECORD_KEYS - set(document))
        if missing:
            raise UserError(f"{path}: not a benchmark record, it has no {missing}")
        documents.append(document)
    return documents


def targets_table(documents: list[dict[str, Any]], targets: dict[str, list[dict[str, Any]]]) -> pd.DataFrame:
    """One row per target of every benchmark in the targets file or the records, in TSV_COLUMNS."""
    recorded = {document["benchmark"]: document for document in documents}
    frames = []
    for name in [*targets, *sorted(set(recorded) - set(targets))]:
        document = recorded.get(name, {"figures": [], "date": "", "git": {"sha": ""}})
        checks = check_benchmark(name, document["figures"], targets.get(name, []))
        if name not in recorded:
            checks["reason"] = f"not run: no {name}.json"
        frames.append(checks.assign(date=document["date"], git_sha=document["git"]["sha"] or ""))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return table.rename(columns={"figure": "benchmark"}).reindex(columns=TSV_COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the benchmarks' JSON files")
    parser.add_argument("--targets", type=Path, default=TARGETS)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks.tsv")
    args = parser.parse_args()
    table = targets_table(read_results(args.results), load_targets(args.targets))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, sep="\t", index=False)
    counts = ", ".join(f"{count} {status}" for status, count in table["status"].value_counts().items())
    print(f"{args.out}: {len(table)} targets: {counts}")


if __name__ == "__main__":
    try:
        main()
    except UserError as error:
        sys.exit(str(error))
