"""EasyScale Fig 9: accuracy consistency under elasticity ("EasyScale: Accuracy-consistent Elastic Training for
Deep Learning", SC 2023, Fig 9; artifact sUntvoOk/EasyScale_info_for_SC23, accuracy-consistency/).

Points: for D1 and D0, a baseline of E processes × 1 EST for S steps, and an elastic run in stages of S/len(stages)
steps on the configured placements, each stage continuing from the previous stage's checkpoint; plain DDP over E
processes as a further reference. Plot: per-step loss of each elastic run minus its baseline (and DDP minus the
D1 baseline), stages shaded. Expected on CPU: D1 exactly 0 everywhere, D0 not from the first placement change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import consistent_point, require
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "easyscale-fig9"
TITLE = "EasyScale Fig 9: loss difference to the baseline under elastic placements"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    workers, steps, stages = section["logical_workers"], section["steps"], section["stages"]
    for index, placement in enumerate(stages):
        require(
            sum(placement) == workers,
            ID,
            f"stages[{index}]",
            f"{placement} runs {sum(placement)} ESTs, logical_workers is {workers}",
        )
    require(steps % len(stages) == 0, ID, "steps", f"{steps} steps do not split into {len(stages)} equal stages")
    common = {"logical_workers": workers}
    result = [
        consistent_point(ID, section, launcher, **common, placement=[1] * workers, mode="ddp", steps=steps, run="DDP")
    ]
    for mode in ("D1", "D0"):
        result.append(
            consistent_point(
                ID, section, launcher, **common, placement=[1] * workers, mode=mode, steps=steps, run="baseline"
            )
        )
        previous = None
        for stage, placement in enumerate(stages):
            point = consistent_point(
                ID,
                section,
                launcher,
                **common,
                placement=placement,
                mode=mode,
                steps=steps // len(stages),
                run="elastic",
                stage=stage,
                resume_from=previous,
            )
            result.append(point)
            previous = point.id
    return result


def loss_differences(table: pd.DataFrame) -> pd.DataFrame:
    """Per step: each elastic run's loss minus its mode's baseline, and DDP's minus the D1 baseline."""
    losses = table[table["metric"] == "loss"]
    baseline = losses[losses["run"] == "baseline"].set_index(["mode", "step"])["value"]
    others = losses[losses["run"] != "baseline"].copy()
    reference_mode = others["mode"].where(others["run"] == "elastic", "D1")
    others["difference"] = (
        others["value"].to_numpy() - baseline.loc[list(zip(reference_mode, others["step"], strict=True))].to_numpy()
    )
    others["series"] = (
        others["mode"].where(others["run"] == "elastic", "plain DDP").replace({"D0": "D0 elastic", "D1": "D1 elastic"})
    )
    return others


def first_nonzero_magnitude(differences: pd.Series) -> float:
    """|difference| at the first step that differs (pure rounding, before training amplifies it); 0 if none."""
    nonzero = differences[differences != 0]
    return float(abs(nonzero.iloc[0])) if len(nonzero) else 0.0


def plot(table: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> tuple[Figure, pd.DataFrame]:
    from ddlrepro.host import plotting

    differences = loss_differences(table).sort_values("step")
    figure, (axis,) = plotting.new_figure(1, TITLE, panel_size=(10, 4.5))
    elastic = differences[differences["run"] == "elastic"]
    for stage, rows in elastic.groupby("stage", sort=True):
        axis.axvspan(
            rows["step"].min() - 0.5, rows["step"].max() + 0.5, alpha=0.08 * (1 + int(stage) % 2), color="grey"
        )
        axis.text(
            rows["step"].mean(),
            0,
            f"stage {int(stage)}\n{rows['placement'].iloc[0]}",
            ha="center",
            va="bottom",
            fontsize="small",
        )
    for series, rows in differences.groupby("series", sort=True):
        axis.plot(rows["step"], rows["difference"], marker=".", label=series)
    axis.set_xlabel("mini-batch")
    axis.xaxis.get_major_locator().set_params(integer=True)
    axis.set_ylabel("loss − baseline loss (nats)")
    axis.set_yscale("symlog", linthresh=1e-7)
    plotting.legend(axis)
    summary = (
        differences.assign(stage=differences["stage"].fillna(-1).astype(int), exact=differences["difference"] == 0)
        .sort_values("step")
        .groupby(["series", "stage"], as_index=False)
        .agg(
            steps=("step", "count"),
            exact_steps=("exact", "sum"),
            first_difference=("difference", first_nonzero_magnitude),
            max_abs_difference=("difference", lambda d: d.abs().max()),
        )
    )
    return figure, summary
