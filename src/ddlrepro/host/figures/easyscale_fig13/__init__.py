"""EasyScale Fig 13: the time of each EST's turn in a step (gradient copy-out and sync), ÷ a plain DDP step.

Points, per model: D1 training of k ESTs on each of P processes, every EST's pieces of every step timed
(`est_timings`: switch, data, forward_backward, gradient_copy; on a process's last EST also sync, optimizer, loss);
plain DDP on the same P processes at the per-EST batch (the same per-worker batch). In a process, ESTs 0..k−2 run
forward and backward and copy their gradient out; its last EST, k−1, also runs D1's sync (every EST's gradient
gathered on process 0, DDP's arithmetic, broadcast), the optimizer step and the loss's all-reduce. Plot: per model,
the mean of ESTs 0..k−2 and EST k−1 (each the slowest process's, median over steps), each ÷ the DDP step (slowest
process, median).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import consistent_point
from ddlrepro.host.figures.step_timing import median_step_time, timed_steps
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "easyscale-fig13"
TITLE = "EasyScale Fig 13: EST time ÷ a plain DDP step"
FIRST, LAST = "ESTs 0..k-2 (compute, copy out)", "EST k-1 (also syncs)"
PARTS = ["switch", "data", "forward_backward", "gradient_copy", "sync", "optimizer", "loss"]
# The paper's model each of ours stands for (its references are selected by it).
PAPER_MODELS = {"resnet20": "ResNet-50", "resnet50": "ResNet-50", "bert_tiny": "BERT", "bert_base": "BERT"}


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    processes, per_process, steps = section["workers"], section["ests_per_worker"], section["steps"]
    result = []
    for model in section["models"]:
        model_section = {**section, "model": model}
        result.append(
            consistent_point(
                ID,
                model_section,
                launcher,
                logical_workers=processes,
                placement=[1] * processes,
                mode="ddp",
                steps=steps,
            )
        )
        result.append(
            consistent_point(
                ID,
                model_section,
                launcher,
                logical_workers=processes * per_process,
                placement=[per_process] * processes,
                mode="D1",
                steps=steps,
                est_timings=True,
            )
        )
    return result


def est_times(table: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    """Per model, rank, step and EST: each piece's seconds, their sum (`est_time_s`) and the EST's group."""
    pieces = table[(table["metric"] == "est_time_s") & (table["step"] >= warmup_steps)]
    per_est = pieces.pivot_table(
        index=["model", "rank", "step", "est"], columns="phase", values="value", aggfunc="sum", fill_value=0.0
    )
    per_est = per_est.reindex(columns=PARTS, fill_value=0.0).reset_index()
    per_est["est_time_s"] = per_est[PARTS].sum(axis=1)
    last = per_est.groupby(["model", "rank"])["est"].transform("max")
    per_est["group"] = (per_est["est"] == last).map({True: LAST, False: FIRST})
    return per_est


def group_times(table: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    """Per model and group: the median over steps of the slowest process's time (ESTs 0..k−2: their mean in each
    process), each piece's mean over steps of its largest process value (so the pieces need not add up to the
    time), and the time ÷ the DDP step and ÷ the model's last EST."""
    per_est = est_times(table, warmup_steps)
    columns = ["est_time_s", *PARTS]
    per_process = per_est.groupby(["model", "group", "step", "rank"], as_index=False)[columns].mean()
    slowest = per_process.groupby(["model", "group", "step"], as_index=False)[columns].max()
    summary = slowest.groupby(["model", "group"], as_index=False).agg(
        est_time_s=("est_time_s", "median"), **{f"{part}_s": (part, "mean") for part in PARTS}
    )
    ddp = table[table["mode"] == "ddp"]
    ddp_step = median_step_time(timed_steps(ddp, warmup_steps), by="model").set_index("model")["step_time_s"]
    summary["ddp_step_s"] = summary["model"].map(ddp_step)
    summary["normalised_to_ddp"] = summary["est_time_s"] / summary["ddp_step_s"]
    last_time = summary[summary["group"] == LAST].set_index("model")["est_time_s"]
    summary["share_of_last"] = summary["est_time_s"] / summary["model"].map(last_time)
    summary.insert(1, "paper_model", summary["model"].map(PAPER_MODELS))
    order = {name: index for index, name in enumerate([*dict.fromkeys(table["model"]), FIRST, LAST])}
    return summary.sort_values(["model", "group"], key=lambda column: column.map(order), ignore_index=True)


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and group: EST times against the DDP step (group_times), with both runs' host load."""
    from ddlrepro.host import summaries

    summary = group_times(table, int(table["warmup_steps"].iloc[0]))
    return summaries.with_host_load(summary, table, ["model"])  # both runs of a model: the ratio's two sides


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    import numpy as np

    from ddlrepro.host import plotting

    models = list(dict.fromkeys(summary["model"]))
    paper = paper_values(references)
    figure, (ratio,) = plotting.new_figure(1, TITLE, panel_size=(7.5, 4.4))
    width = 0.38
    for offset, group in ((-width / 2, FIRST), (width / 2, LAST)):
        rows = summary[summary["group"] == group].set_index("model").loc[models]
        x = np.arange(len(models)) + offset
        bars = ratio.bar(x, rows["normalised_to_ddp"], width, alpha=0.8, label=f"measured: {group}")
        plotting.hatch_disturbed(bars, rows["disturbed"])
        stars = [paper["value"].get((model, group), np.nan) for model in rows["paper_model"]]
        label = paper["series"] if group == FIRST else "_nolegend_"
        ratio.plot(x, stars, **plotting.REFERENCE_STYLE, label=label)
    plotting.note_disturbed(ratio, summary, ["model", "group"])
    ratio.axhline(1.0, color="black", linewidth=0.8)
    ratio.set_xticks(np.arange(len(models)), [f"{model}\n(paper: {PAPER_MODELS[model]})" for model in models])
    ratio.set_xlabel("model")
    ratio.set_ylabel("EST time ÷ plain DDP step (ratio)")
    ratio.set_ylim(bottom=0)
    plotting.legend(ratio)
    return figure


def paper_values(references: list[dict[str, Any]]) -> dict[str, Any]:
    """EasyScale's ratios by (paper model, group), and their legend label, from the drawn references."""
    drawn = [r for r in references if "series" in r and r["measured"]["column"] == "normalised_to_ddp"]
    values = {(r["measured"]["where"]["paper_model"], r["measured"]["where"]["group"]): r["value"] for r in drawn}
    return {"value": values, "series": drawn[0]["series"] if drawn else "_nolegend_"}
