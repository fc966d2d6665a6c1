"""EasyScale Fig 9: accuracy consistency under elasticity ("EasyScale: Accuracy-consistent Elastic Training for
Deep Learning", SC 2023, Fig 9; artifact sUntvoOk/EasyScale_info_for_SC23, accuracy-consistency/).

Panel (a), one device type: for D1 and D0, a baseline of E processes × 1 EST for S steps, and an elastic run in
stages of S/len(stages) steps on the configured placements, each stage continuing from the previous stage's
checkpoint; plain DDP over E processes as a further reference. Plot: per-step loss of each elastic run minus its
baseline (and DDP minus the D1 baseline), stages shaded. Expected on CPU: D1 exactly 0 everywhere, D0 not from the
first placement change.

Panel (b), device types emulated on CPU (ISA cap, threads, CPU quota; rank/devicetypes.py): the same stages typed
(`heterogeneous_stages`, e.g. the last on [[2, fast], [1, slow], [1, slow]]). Baseline: E × 1 EST on the first
stage's type with D2 kernels (every process runs the reference type's kernels) and D1's arithmetic, which is what
DDP with those kernels computes; D1 + D2 and D0 + D2 elastic runs against
it; D1 alone (each process its own type's kernels) against a D1 baseline on the first stage's type. Expected: D1
+ D2 exactly 0 in every stage, D1 alone exactly 0 until the types mix, then not. A typed point whose processes are
all on the default type is the untyped point: D1 alone shares panel (a)'s runs until its placements differ.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures import device_types
from ddlrepro.host.figures.common import consistent_point, require
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "easyscale-fig9"
TITLE = "EasyScale Fig 9: loss difference to the baseline under elastic placements"
EMULATED = "device types emulated on CPU (ISA cap, threads, CPU quota)"


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
    make = partial(consistent_point, ID, section, launcher, logical_workers=workers)
    result = [make(placement=[1] * workers, mode="ddp", steps=steps, run="DDP")]
    for mode in ("D1", "D0"):
        result.append(make(placement=[1] * workers, mode=mode, steps=steps, run="baseline"))
        result += elastic_run(make, [{"placement": placement} for placement in stages], mode, steps)
    # D1 alone shares panel (a)'s runs while its processes are on the default type: each point once
    return list({point.id: point for point in result + heterogeneous_points(section, launcher)}.values())


def elastic_run(make: Callable[..., Point], stages: list[dict[str, Any]], mode: str, steps: int) -> list[Point]:
    """One point per stage (`stages`: each one's own params, `steps` split equally), each resuming from the
    previous one's checkpoint."""
    result: list[Point] = []
    for stage, own in enumerate(stages):
        previous = result[-1].id if result else None
        steps_each = steps // len(stages)
        result.append(make(**own, mode=mode, steps=steps_each, run="elastic", stage=stage, resume_from=previous))
    return result


def heterogeneous_points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    """Panel (b): the D2 baseline, D1 + D2 and D0 + D2 on the typed stages, and D1 alone with its own baseline."""
    typed_stages, stages = section["heterogeneous_stages"], section["stages"]
    if not typed_stages:
        return []
    workers, steps, threads = section["logical_workers"], section["steps"], section["threads_per_worker"]
    types = launcher["device_types"]
    require(
        len(typed_stages) == len(stages),
        ID,
        "heterogeneous_stages",
        f"{len(typed_stages)} stages, `stages` has {len(stages)}: both split `steps` into stages",
    )
    parsed = []
    for index, placement in enumerate(typed_stages):
        key = f"heterogeneous_stages[{index}]"
        counts, names = device_types.parse_placement(placement, types, ID, key)
        require(sum(counts) == workers, ID, key, f"{placement} runs {sum(counts)} ESTs, logical_workers is {workers}")
        parsed.append((counts, names))
    first_types = set(parsed[0][1])
    require(
        len(first_types) == 1, ID, "heterogeneous_stages[0]", f"the baseline's stage runs one type, not {first_types}"
    )
    reference = section["d2_reference_type"]
    if reference is None:
        reference = device_types.most_basic([name for _, names in parsed for name in names], types, threads)
    require(
        reference in types,
        ID,
        "d2_reference_type",
        f"unknown device type {reference!r}; launcher.device_types defines {', '.join(sorted(types))}",
    )
    baseline_types = [parsed[0][1][0]] * workers

    def typed(names: list[str], kernels: str | None, **params: Any) -> Point:
        return device_types.typed_point(ID, section, launcher, names, kernels, logical_workers=workers, **params)

    own_params = [{"names": names, "placement": counts} for counts, names in parsed]
    result = []
    for modes, kernels in ((("D1", "D0"), reference), (("D1",), None)):
        result.append(typed(baseline_types, kernels, placement=[1] * workers, mode="D1", steps=steps, run="baseline"))
        for mode in modes:
            result += elastic_run(partial(typed, kernels=kernels), own_params, mode, steps)
    return result


def typing_columns(table: pd.DataFrame) -> pd.DataFrame:
    """`device_types` and `kernels` as columns (NaN: untyped), whether or not any point of the table was typed."""
    return table.assign(**{column: table.get(column, float("nan")) for column in ("device_types", "kernels")})


def loss_differences(table: pd.DataFrame) -> pd.DataFrame:
    """Panel (a), per step: each elastic run's loss minus its mode's baseline, and DDP's minus the D1 baseline."""
    table = typing_columns(table)
    losses = table[(table["metric"] == "loss") & table["device_types"].isna() & table["kernels"].isna()]
    baseline = losses[losses["run"] == "baseline"].set_index(["mode", "step"])["value"]
    baseline_ids = losses[losses["run"] == "baseline"].set_index(["mode", "step"])["point_id"]
    others = losses[losses["run"] != "baseline"].copy()
    reference = list(zip(others["mode"].where(others["run"] == "elastic", "D1"), others["step"], strict=True))
    others["difference"] = others["value"].to_numpy() - baseline.loc[reference].to_numpy()
    others["parameters_differ"] = parameters_differ(table, others, baseline_ids.loc[reference].to_numpy())
    others["series"] = (
        others["mode"].where(others["run"] == "elastic", "plain DDP").replace({"D0": "D0 elastic", "D1": "D1 elastic"})
    )
    return others.assign(panel="a")


def parameters_differ(table: pd.DataFrame, rows: pd.DataFrame, baseline_ids: Any) -> list[float]:
    """Per row (a run's step): 1.0 where its parameters after the step differ from its baseline's at that step
    (their digests), 0.0 where equal, NaN where a run recorded no digest (tables from before)."""
    digests = table[table["metric"] == "parameters_digest"].set_index(["point_id", "step"])["value"].to_dict()
    return [
        float(digests[(point, step)] != digests[(base, step)])
        if (point, step) in digests and (base, step) in digests
        else float("nan")
        for point, step, base in zip(rows["point_id"], rows["step"], baseline_ids, strict=True)
    ]


def chain(table: pd.DataFrame, last: str) -> list[str]:
    """The point ids of an elastic run's stages, first to `last`, following `resume_from`."""
    resumed = table.drop_duplicates("point_id").set_index("point_id")["resume_from"]
    ids = [last]
    while isinstance(resumed.get(ids[0]), str):
        ids.insert(0, resumed[ids[0]])
    return ids


def typed_loss_differences(table: pd.DataFrame) -> pd.DataFrame:
    """Panel (b), per step: D1 + D2 and D0 + D2 minus the D2 baseline, D1 alone minus its own baseline; empty
    without typed runs. D1 alone is the chain of checkpoints that ends in its last typed stage."""
    import pandas as pd

    table = typing_columns(table)
    losses = table[table["metric"] == "loss"]
    d2 = losses[losses["kernels"].notna()]
    own = losses[losses["kernels"].isna() & (losses["mode"] == "D1")]
    typed_own = own[own["device_types"].notna() & (own["run"] == "elastic")]
    if d2.empty or typed_own.empty:
        return losses.iloc[0:0].assign(difference=[], parameters_differ=[], series=[], panel=[])
    last = typed_own.sort_values("stage")["point_id"].iloc[-1]
    alone = own[own["point_id"].isin(chain(table, last))]
    own_baselines = own[own["run"] == "baseline"]
    typed_baselines = own_baselines[own_baselines["device_types"].notna()]
    parts = []
    for rows, baseline, names in (
        (d2[d2["run"] == "elastic"], d2[d2["run"] == "baseline"], {"D1": "D1 + D2", "D0": "D0 + D2"}),
        (alone, typed_baselines if len(typed_baselines) else own_baselines, {"D1": "D1 alone"}),
    ):
        by_step = baseline.set_index("step")
        parts.append(
            rows.assign(
                difference=rows["value"].to_numpy() - by_step.loc[rows["step"], "value"].to_numpy(),
                parameters_differ=parameters_differ(table, rows, by_step.loc[rows["step"], "point_id"].to_numpy()),
                series=rows["mode"].map(names),
                panel="b",
            )
        )
    return pd.concat(parts, ignore_index=True)


def stage_label(row: pd.Series) -> str:
    """`[2, 1, 1]`; with types `[2, 2] fast` on one type, `2 fast + 1 slow + 1 slow` on several."""
    if not isinstance(row["device_types"], str):
        return str(row["placement"])
    counts, names = json.loads(row["placement"]), [spec["name"] for spec in json.loads(row["device_types"])]
    if len(set(names)) == 1:
        return f"{counts} {names[0]}"
    return " + ".join(f"{count} {name}" for count, name in zip(counts, names, strict=True))


def first_nonzero_magnitude(differences: pd.Series) -> float:
    """|difference| at the first step that differs (pure rounding, before training amplifies it); 0 if none."""
    nonzero = differences[differences != 0]
    return float(abs(nonzero.iloc[0])) if len(nonzero) else 0.0


def draw_panel(axis: Any, differences: pd.DataFrame) -> None:
    """Per-step differences by series, the elastic stages shaded and labelled with their placements."""
    from ddlrepro.host import plotting

    elastic = differences[differences["run"] == "elastic"]
    labelled = elastic.sort_values("device_types", na_position="last").drop_duplicates("stage").set_index("stage")
    for stage, rows in elastic.groupby("stage", sort=True):
        axis.axvspan(
            rows["step"].min() - 0.5, rows["step"].max() + 0.5, alpha=0.08 * (1 + int(stage) % 2), color="grey"
        )
        label = stage_label(labelled.loc[stage])
        axis.text(rows["step"].mean(), 0, f"stage {int(stage)}\n{label}", ha="center", va="bottom", fontsize="small")
    for series, rows in differences.groupby("series", sort=True):
        axis.plot(rows["step"], rows["difference"], marker=".", label=series)
    axis.set_xlabel("mini-batch")
    plotting.integer_ticks(axis.xaxis)
    axis.set_ylabel("loss − baseline loss (nats)")
    axis.set_yscale("symlog", linthresh=1e-7)
    largest = float(differences["difference"].abs().max())
    axis.set_ylim(-max(0.1, 10 * largest), max(0.1, 10 * largest))  # symmetric: the stage labels sit at 0
    plotting.legend(axis)


def difference_summary(differences: pd.DataFrame) -> pd.DataFrame:
    """Per panel, series and stage: steps, exactly equal steps, first and largest |difference| of the loss, the
    steps after which the parameters differ from the baseline's (bit for bit, by digest), whether the stage mixes
    device types."""
    typed = differences["device_types"].fillna("[]").map(lambda text: len({spec["name"] for spec in json.loads(text)}))
    return (
        differences.assign(
            stage=differences["stage"].fillna(-1).astype(int),
            exact=differences["difference"] == 0,
            mixed_types=typed > 1,
        )
        .sort_values("step")
        .groupby(["panel", "series", "stage"], as_index=False)
        .agg(
            mixed_types=("mixed_types", "any"),
            steps=("step", "count"),
            exact_steps=("exact", "sum"),
            first_difference=("difference", first_nonzero_magnitude),
            max_abs_difference=("difference", lambda d: d.abs().max()),
            steps_parameters_differ=("parameters_differ", lambda d: d.sum(min_count=1)),
        )
    )


def difference_panels(table: pd.DataFrame) -> list[pd.DataFrame]:
    """The loss differences of panel (a), one device type, and (b), emulated device types, where there are any."""
    panels = [loss_differences(table).sort_values("step"), typed_loss_differences(table).sort_values("step")]
    return [differences for differences in panels if len(differences)]


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per panel, series and stage (difference_summary); with panel (b), which device types it emulated."""
    import pandas as pd

    table = typing_columns(table)
    panels = difference_panels(table)
    summary = difference_summary(pd.concat(panels, ignore_index=True))
    if len(panels) == 2:
        quota = f"CPU quota {device_types.quota_status(table)}"
        summary["devices"] = summary["panel"].map({"a": "one device type", "b": f"{EMULATED}; {quota}"})
    return summary


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    table = typing_columns(table)
    panels = difference_panels(table)
    figure, axes = plotting.new_figure(len(panels), TITLE, panel_size=(10, 4.5) if len(panels) == 1 else (8, 4.5))
    for axis, differences in zip(axes, panels, strict=True):
        draw_panel(axis, differences)
    if len(panels) == 2:
        plotting.panel_title(axes[0], "one device type")
        plotting.panel_title(axes[1], EMULATED)
        plotting.add_footer(figure, f"Panel (b): {EMULATED}; CPU quota {device_types.quota_status(table)}.")
    return figure
