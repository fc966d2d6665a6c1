"""All-reduce microbenchmark (nccl-tests style) behind KungFu Figs 9 and 10: the collectives on their own.

Points: one `allreduce` run per backend: gloo and NCCL with every one of KungFu's strategies over torch.distributed
(strategies.py), taking turns in the same processes so that each strategy's ratio to RING is paired (issue
`verdicts` item 3: noise between fresh processes would otherwise enter every ratio twice); MPI with MPI_Allreduce
(mpi4py under mpirun). Each sweeps float32 sizes from `min_bytes` to `max_bytes`. Plot: bus bandwidth and time per
operation vs size per backend/strategy, and the bus bandwidth at the largest sizes relative to gloo's own all_reduce
(RING). NCCL points on a machine without CUDA are reported as skipped, with the reason, in the summary, the figure
and the checks.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "kungfu-allreduce"
TITLE = "All-reduce microbenchmark: bus bandwidth by backend and strategy"
MPI_STRATEGY = "MPI_Allreduce"
LARGE_BYTES = 16 * 2**20


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    sweep = {
        key: section[key] for key in ("min_bytes", "max_bytes", "warmup", "repetitions", "target_bytes", "max_ops")
    }
    return [
        Point(
            figure=ID,
            workload="allreduce",
            workers=section["workers"],
            threads_per_worker=1,
            params={
                "backend": backend,
                **({"strategy": MPI_STRATEGY} if backend == "mpi" else {"strategies": section["strategies"]}),
                **sweep,
                "sample_interval_s": launcher["sample_interval_s"],
            },
        )
        for backend in section["backends"]
    ]


def with_strategy(table: pd.DataFrame) -> pd.DataFrame:
    """Each row's `strategy`: its record's `setting` in a run of several strategies, else its point's (MPI, and
    tables recorded before strategies shared a run); a skipped run of several strategies stands for each of them."""
    import pandas as pd

    table = table.copy()
    strategy = table["strategy"] if "strategy" in table else pd.Series(None, index=table.index, dtype=object)
    if "setting" in table:
        strategy = table["setting"].where(table["setting"].notna(), strategy)
    table["strategy"] = strategy.astype(object)
    if "strategies" in table:
        listed = table["strategy"].isna() & table["strategies"].notna()
        table.loc[listed, "strategy"] = table.loc[listed, "strategies"].map(json.loads)
        table = table.explode("strategy", ignore_index=True)
    return table


def bandwidths(table: pd.DataFrame) -> pd.DataFrame:
    """Per (backend, strategy, size): mean time per operation over ranks and repetitions, algbw and busbw (GB/s);
    `table` has a strategy per row (`with_strategy`)."""
    from ddlrepro.host import summaries

    times = table[table["metric"] == "allreduce_time_s"]
    summary = (
        times.groupby(["backend", "strategy", "workers", "size_bytes"], sort=True)["value"]
        .agg(time_s="mean", samples="count")
        .reset_index()
    )
    summary["algbw_GBps"] = summary["size_bytes"] / summary["time_s"] / 1e9
    summary["busbw_GBps"] = summary["algbw_GBps"] * 2 * (summary["workers"] - 1) / summary["workers"]
    summary["status"], summary["reason"] = "ok", ""
    return summaries.with_host_load(summary, table, ["backend", "strategy", "workers"])


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Bandwidths of the runs that ran, one row per skipped run (with its reason), each row's busbw ÷ gloo RING's
    at the same size, and (`large_vs_gloo_ring`) the mean of that ratio over the sizes ≥ 16 MiB."""
    import pandas as pd

    from ddlrepro.host import summaries

    table = with_strategy(table)
    summary = bandwidths(table)
    gloo = summary[(summary["backend"] == "gloo") & (summary["strategy"] == "RING")].set_index("size_bytes")
    summary["vs_gloo_ring"] = summary["busbw_GBps"] / summary["size_bytes"].map(gloo["busbw_GBps"])
    ring = (table["backend"] == "gloo") & (table["strategy"] == "RING") & (table["status"] == "ok")
    summary = summaries.fold_load(summary, table, ring)  # every ratio is ÷ gloo RING's
    skipped = summaries.skipped_points(table, ["backend", "strategy"])
    summary = pd.concat([summary, skipped], ignore_index=True)
    summary["size_bytes"] = summary["size_bytes"].astype("Int64")
    summary["large"] = (summary["size_bytes"] >= LARGE_BYTES).fillna(False).astype(bool)
    summary["p2p"] = ~summary["strategy"].isin(["RING", MPI_STRATEGY])
    large = summary[summary["large"]].groupby(["backend", "strategy"])["vs_gloo_ring"].mean()
    return summary.join(large.rename("large_vs_gloo_ring"), on=["backend", "strategy"])


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    measured = summary[summary["status"] == "ok"].assign(variant=lambda s: s["backend"] + "/" + s["strategy"])
    figure, (busbw, times, large) = plotting.new_figure(3, TITLE, panel_size=(5.6, 4.8))
    for variant, rows in measured.groupby("variant", sort=True):
        busbw.plot(rows["size_bytes"], rows["busbw_GBps"], marker=".", label=variant)
        times.plot(rows["size_bytes"], rows["time_s"] * 1e6, marker=".", label=variant)
    plotting.ring_disturbed(busbw, measured["size_bytes"], measured["busbw_GBps"], measured["disturbed"])
    plotting.ring_disturbed(times, measured["size_bytes"], measured["time_s"] * 1e6, measured["disturbed"])
    for axis in (busbw, times):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("message size per rank, float32 (bytes)")
        plotting.legend(axis)
    busbw.set_ylabel("bus bandwidth, algbw × 2(n−1)/n (GB/s)")
    times.set_yscale("log")
    times.set_ylabel("time per all-reduce (µs)")
    busbw.set_yscale("log")
    plotting.note_disturbed(busbw, summary.drop_duplicates(["backend", "strategy"]), ["backend", "strategy"])
    large_panel(large, summary)
    return figure


def large_panel(axis: Any, summary: pd.DataFrame) -> None:
    """Mean busbw ÷ gloo RING's at ≥ 16 MiB per backend/strategy; skipped ones as a labelled empty slot."""
    variants = summary.assign(variant=summary["backend"] + "/" + summary["strategy"])
    from ddlrepro.host import plotting

    large = (
        variants[variants["large"]]
        .groupby("variant")
        .agg(ratio=("large_vs_gloo_ring", "first"), disturbed=("disturbed", "any"))
    )
    skipped = variants[variants["status"] == "skipped"].set_index("variant")["reason"]
    names = [*large.index, *skipped.index]
    plotting.hatch_disturbed(axis.bar(range(len(large)), large["ratio"], alpha=0.8), large["disturbed"])
    for position, reason in enumerate(skipped.values, start=len(large)):
        plotting.note_skipped_slot(axis, position, reason)
    axis.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize="small")
    axis.set_xlim(-0.5, len(names) - 0.5)
    axis.axhline(1.0, color="black", linewidth=0.8)
    plotting.panel_title(axis, f"≥ {LARGE_BYTES // 2**20} MiB")
    axis.set_xlabel("backend/strategy")
    axis.set_ylabel("bus bandwidth ÷ gloo RING's (ratio)")
