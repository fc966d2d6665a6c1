"""Shared by the benchmarks: every figure a benchmark measures, the host load it was measured under, its targets.

A benchmark adds each figure to a `BenchmarkRecord` (id, what, value, unit and the host load of its measured
section, `ddlrepro.host.hostload`). When the script finishes, the record checks the benchmark's targets
(`benchmarks/targets.yaml`, in the papers' references format) with the checks of the workflow, over a summary table
of one row per figure, prints the verdicts and writes `results/benchmarks/<script stem>.json` atomically: a script
that fails writes nothing. Above `DISTURBED_SHARE` of the host's CPU capacity (foreign + steal), a figure is
`disturbed`, and so is a target with `timing: true` on it: on a busy machine a timing says nothing about the code.
Memory targets (no `timing`) are judged whatever the load.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import pandas as pd

from ddlrepro.host.checks import BENCHMARK_TARGETS_SCHEMA, COLUMNS, evaluate, load_references, selectors
from ddlrepro.host.config import schema_default
from ddlrepro.host.hostload import HostLoad
from ddlrepro.host.provenance import git_state, host_inventory
from ddlrepro.host.rundir import metric_records, write_json_atomic

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results" / "benchmarks"
TARGETS = Path(__file__).with_name("targets.yaml")
DISTURBED_SHARE = schema_default("checks", "max_foreign_share")  # the workflow's threshold
SCALE = "benchmark"  # a benchmark is never at paper scale: a `scale: paper` target is skipped


def load_targets(path: Path = TARGETS) -> dict[str, list[dict[str, Any]]]:
    """Every benchmark's targets, validated against their schema."""
    return load_references(path, BENCHMARK_TARGETS_SCHEMA)


def target_threshold(benchmark: str, target_id: str) -> float:
    """The constant a benchmark's target compares with (e.g. harness fidelity's, which decides when to stop)."""
    (target,) = (entry for entry in load_targets()[benchmark] if entry["id"] == target_id)
    return float(target["against"])


def host_load(load: HostLoad) -> dict[str, Any]:
    """A figure's host-load fields: foreign and steal shares of the host's CPU, and whether together too high."""
    disturbed = load.foreign_share + load.steal_share > DISTURBED_SHARE
    return {"foreign_share": load.foreign_share, "steal_share": load.steal_share, "disturbed": disturbed}


def load_note(figure: dict[str, Any]) -> str:
    """The host load written beside a figure, in % of the host's CPU capacity."""
    return f"foreign load {100 * figure['foreign_share']:.1f} % (steal {100 * figure['steal_share']:.1f} %)"


def meaningful(value: float, noise: float | None = None) -> str:
    """A value to its meaningful digits: to two significant digits of its noise where known, else three."""
    if value is None or not math.isfinite(value):
        return str(value)
    if noise is not None and math.isfinite(noise) and noise > 0:
        decimals = max(0, 1 - math.floor(math.log10(noise)))
        return f"{value:.{decimals}f} ± {noise:.{decimals}f}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 0
    text = f"{value:.{decimals}f}"
    return f"{text} ± {noise}" if noise is not None else text


def figure_ids(target: dict[str, Any]) -> set[str]:
    """The figures a target selects by id (measured, against, noise)."""
    chosen = [*selectors(target), *([target["noise"]] if "noise" in target else [])]
    return {selector["where"]["id"] for selector in chosen if "id" in selector.get("where", {})}


def check_benchmark(name: str, figures: list[dict[str, Any]], targets: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per target, in checks.tsv's columns: evaluated over the figures' summary table, or skipped when
    the run did not measure a figure it names (a benchmark's options may leave one out). A target whose figures
    were measured in paired rounds (`round_values`) is judged as the workflow judges a timing claim over its
    replicates: the rounds' mean and its one-sided 95 % bootstrap bounds (checks.Interval); any other on the
    figure's one value, with the 95 % half-width it declares as `noise`."""
    summary = pd.DataFrame(figures)
    measured = set(summary["id"]) if "id" in summary else set()
    rows = []
    for target in targets:
        missing = sorted(figure_ids(target) - measured)
        if missing:
            row = evaluate(target, summary, SCALE, name, excluded=True) | {"reason": f"{missing} not measured"}
        elif (rounds := round_table(figures, figure_ids(target))) is not None:
            row = evaluate(target, rounds, SCALE, name)
        else:
            row = evaluate(target, summary, SCALE, name, benchmark=True)
        rows.append({"figure": name, **row})
    return pd.DataFrame(rows, columns=COLUMNS)


def round_table(figures: list[dict[str, Any]], chosen: set[str]) -> pd.DataFrame | None:
    """The figures as one row per figure and round (`replicate`), when every figure in `chosen` was measured in
    the same number of paired rounds; None otherwise. A figure without rounds repeats its one value."""
    counts = {len(figure["round_values"]) for figure in figures if figure["id"] in chosen and "round_values" in figure}
    if len(counts) != 1 or not all("round_values" in figure for figure in figures if figure["id"] in chosen):
        return None
    (count,) = counts
    rows = [
        {**figure, "value": figure.get("round_values", [figure["value"]] * count)[index], "replicate": index}
        for index in range(count)
        for figure in figures
    ]
    return pd.DataFrame(rows).drop(columns="round_values")


def verdict_line(check: dict[str, Any], noise: float | None = None) -> str:
    """One target's verdict, e.g. `fidelity 1.025 ± 0.064 (target >= 0.98): inconclusive: noise ...`, or with the
    rounds' 95 % bounds, `fidelity 0.991 [0.982, 0.999] (n=20) ...`."""
    measured = "not measured" if check["measured"] is None else meaningful(check["measured"], noise)
    if check["measured"] is not None and check.get("n", 0) and check["n"] > 1 and pd.notna(check.get("low")):
        measured = f"{meaningful(check['measured'])} [{check['low']:.4g}, {check['high']:.4g}] (n={check['n']})"
    reference = f" (target {check['reference']})" if check["reference"] else ""
    reason = f": {check['reason']}" if check["reason"] else ""
    return f"{check['check']} {measured}{reference}: {check['status']}{reason}"


def command_line(document: dict[str, Any]) -> str:
    """How a benchmark was run, as a reader would type it."""
    return " ".join(["python", f"benchmarks/{document['benchmark']}.py", *document["argv"][1:]])


def portable(value: Any) -> Any:
    """A path as a record may show it on any machine: relative to the repository, or only its name when outside
    (the files it names, such as Horovod's benchmark script, are recorded by their sha256)."""
    if not isinstance(value, str | Path):
        return value
    path = Path(value)
    if not path.is_absolute():
        return str(value)
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


class BenchmarkRecord:
    """A benchmark's figures; leaving its `with` block without an error checks the targets, prints the verdicts and
    writes `<folder>/<script stem>.json`. An error leaves the previous file as it was."""

    def __init__(self, script: str, options: argparse.Namespace, folder: Path = RESULTS) -> None:
        self.name = Path(script).stem
        self.folder = folder
        self.options = {key: portable(value) for key, value in vars(options).items()}
        self.started = utc_now()
        self.figures: list[dict[str, Any]] = []

    def add(self, figure_id: str, what: str, value: float, unit: str, load: HostLoad, **extra: Any) -> None:
        """One measured figure (`extra`: scalars the targets may select, e.g. `noise`, or `round_values`: the value
        of each paired round, a fixed number chosen before the run); printed at once."""
        if "round_values" in extra:
            extra["round_values"] = [float(value) for value in extra["round_values"]]
        figure = {"id": figure_id, "what": what, "value": float(value), "unit": unit, **host_load(load), **extra}
        self.figures.append(figure)
        measured = f"{meaningful(figure['value'], extra.get('noise'))} {unit}".rstrip()
        print(f"{what}: {measured}  [{load_note(figure)}]")

    def __enter__(self) -> BenchmarkRecord:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None):
        if kind is None:
            self.finish()

    def finish(self) -> Path:
        targets = load_targets().get(self.name, [])
        checks = check_benchmark(self.name, self.figures, targets)
        noise = {figure["id"]: figure.get("noise") for figure in self.figures}
        for check, target in zip(checks.to_dict("records"), targets, strict=True):
            print(verdict_line(check, noise.get(target["measured"].get("where", {}).get("id"))))
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.name}.json"
        write_json_atomic(path, self.document(targets))
        print(f"{path}: {len(self.figures)} figures, {len(targets)} targets")
        return path

    def document(self, targets: list[dict[str, Any]]) -> dict[str, Any]:
        """What the JSON file holds: the figures, the targets in force, the run's machine, code, time and command."""
        return {
            "benchmark": self.name,
            "argv": [portable(argument) for argument in sys.argv],
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "options": self.options,
            "started": self.started,
            "date": utc_now(),
            "git": git_state(REPO),
            "host": host_inventory(),
            "max_foreign_share": DISTURBED_SHARE,
            "figures": self.figures,
            "targets": targets,
        }


# The testbed benchmarks' all-reduce sizes, 16–64 MiB, each timed after a warm-up in 2 repetitions of one operation.
SWEEP = {
    "min_bytes": 16 * 2**20,
    "max_bytes": 64 * 2**20,
    "warmup": 1,
    "repetitions": 2,
    "target_bytes": 1,
    "max_ops": 1,
}


def allreduce_times(run_dir: Path, strategy: str | None = None) -> dict[int, list[float]]:
    """{size in bytes: every rank's and repetition's time of one all-reduce}, sizes ascending, from a run's metrics;
    of one `strategy` (the records' `setting`) in a run of several."""
    times: dict[int, list[float]] = {}
    for record in metric_records(run_dir):
        if record["metric"] == "allreduce_time_s" and strategy in (None, record.get("setting")):
            times.setdefault(record["size_bytes"], []).append(record["value"])
    return dict(sorted(times.items()))


def busbw_by_size(run_dir: Path, ranks: int, strategy: str | None = None) -> dict[int, float]:
    """{size in bytes: bus bandwidth in bit/s} of a run's all-reduces (of one strategy in a run of several): the
    median time per operation over ranks and repetitions, busbw = size ÷ time × 2(n−1)/n (nccl-tests)."""
    factor = 2 * (ranks - 1) / ranks
    times = allreduce_times(run_dir, strategy)
    return {size: size * 8 / statistics.median(values) * factor for size, values in times.items()}


def per_size(values: dict[int, float], digits: int = 3) -> str:
    """ "16 MiB 0.912, 32 MiB ...": a figure's value at each all-reduce size, for its record and the terminal."""
    return ", ".join(f"{size // 2**20} MiB {value:.{digits}f}" for size, value in values.items())


def paired_round(index: int, baseline: Callable[[], float], other: Callable[[], float]) -> tuple[float, float]:
    """Round `index` of a paired design: both measured, which goes first swapping round by round; (baseline, other)."""
    if index % 2 == 0:
        first = baseline()
        return first, other()
    second = other()
    return baseline(), second


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def testbed_unavailable(benchmark: str) -> bool:
    """Whether this machine cannot make testbed hosts (not root...), saying so: the benchmark then records nothing,
    and its targets read "not run", as for a benchmark `make benchmarks` did not reach."""
    from ddlrepro.host.testbed import limits

    reason = limits.unavailable_reason()
    if reason:
        print(f"{benchmark}: skipped: {reason}")
    return reason is not None
