"""biggan-elasticity: what elasticity each runtime survives (issue 19 item 4; the seed: BigGAN on plain PyTorch DDP
"could not start without all nodes, survive a lost node, or take nodes that join later").

Points: three runtimes × three situations, one run each. Runtimes: `ddp`, a static world (launchers/ddp.py);
`torchrun`, torchrun elastic with `--nnodes=1:MAX`, checkpointing every step (launchers/torchrun.py); `inplace`,
the in-place elastic runtime (launchers/inplace.py). Situations (launchers/situations.py): `late-start` (the
second worker starts `late_s` after the first is ready), `killed` (worker 1 gets SIGKILL at `event_step`),
`joins` (a third worker starts at `event_step`); once the event has played out, `steps_after_event` more steps and
the host stops the run (`steps` bounds a run it never stops). The model is the section's `model`: `biggan`, the GAN of
biggan-profiles trained by every runtime alike (rank/elastic/trainer.py's GanElasticTrainer), or one of the elastic
trainer's image models.

From each run's records the figure tells what happened (`outcome`): failed (no step after the event), restarted
all workers (a worker that ran before the event started again), waited for all workers (no step before the late
worker came), ignored the joiner (steps went on at the old size), carried on in place; the time from the event to
the next training step (the first at the new size, if the size changed), and the longest pause between steps.
Plot: a 3×3 grid, one timeline per cell (cluster size at every step, the event marked), with its outcome and time
to the next step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ddlrepro.host.config import config_schema
from ddlrepro.host.figures.common import require, threads_per_worker
from ddlrepro.host.launchers.situations import EVENT_METRIC, SITUATIONS
from ddlrepro.points import Point
from ddlrepro.rank.elastic import GAN_IMAGES, GAN_MODEL

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ID = "biggan-elasticity"
TITLE = "BigGAN elasticity: what each runtime does when a worker is late, killed or joins"
RUNTIMES = ("ddp", "torchrun", "inplace")
WORKERS = 2
SECTION_KEYS = ["model", "image_size", "batch_size", "dataset_size", "collective_timeout_s", "min_step_s"]
OUTCOMES = ("failed", "restarted all workers", "waited for all workers", "ignored the joiner", "carried on in place")


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_section(section)
    return [
        cell_point(section, launcher, runtime, situation)
        for runtime in section["runtimes"]
        for situation in section["situations"]
    ]


def check_section(section: dict[str, Any]) -> None:
    """What the schema cannot say: the event inside the run, the late worker inside the rendezvous timeout."""
    require(
        section["late_s"] < section["rendezvous_timeout_s"],
        ID,
        "late_s",
        f"{section['late_s']:g} s is not below rendezvous_timeout_s ({section['rendezvous_timeout_s']:g} s): "
        "the static world would time out before the late worker comes",
    )
    require(
        section["model"] != GAN_MODEL or section["dataset_size"] <= GAN_IMAGES,
        ID,
        "dataset_size",
        f"{section['dataset_size']} images: the GAN trains on scikit-learn's {GAN_IMAGES} digits",
    )
    require(
        0 < section["event_step"] < section["steps"],
        ID,
        "event_step",
        f"{section['event_step']} is not between 0 and steps ({section['steps']}), exclusive",
    )
    require(
        section["event_step"] + section["steps_after_event"] < section["steps"],
        ID,
        "steps_after_event",
        f"event_step + steps_after_event ({section['event_step'] + section['steps_after_event']}) is not below "
        f"steps ({section['steps']}), the most a run trains: it would end before the host stops it",
    )


def gan_keys() -> list[str]:
    """The GAN's own settings (the schema's `$defs/gan`), passed to a point only when it trains the GAN."""
    return list(config_schema()["$defs"]["gan"]["properties"])


def cell_point(section: dict[str, Any], launcher: dict[str, Any], runtime: str, situation: str) -> Point:
    workers = WORKERS + (situation == "joins")
    params = {
        **{key: section[key] for key in SECTION_KEYS if key in section},
        **({key: section[key] for key in gan_keys()} if section["model"] == GAN_MODEL else {}),
        "runtime": runtime,
        "elastic": runtime,
        "situation": situation,
        "late_s": section["late_s"],
        "event_step": section["event_step"],
        "steps_after_event": section["steps_after_event"],
        "rendezvous_timeout_s": section["rendezvous_timeout_s"],
        "initial_workers": WORKERS,
        "max_workers": workers,
        "standby": 0,
        "schedule": f"{section['steps']}:0",
        **({"checkpoint_interval": 1, "torchrun_keep_alive": "tuned"} if runtime == "torchrun" else {}),
    }
    return Point(ID, "elastic", workers, threads_per_worker(launcher, workers), params)


def cells(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run: what happened, and when, from its records."""
    import pandas as pd

    rows = [cell(runtime, situation, rows) for (runtime, situation), rows in table.groupby(["runtime", "situation"])]
    return pd.DataFrame(rows)


def cell(runtime: str, situation: str, rows: pd.DataFrame) -> dict[str, Any]:
    def times(metric: str) -> pd.DataFrame:
        return rows[rows["metric"] == metric].sort_values("time")

    start = float(times("job_start")["time"].iloc[0])
    event = float(times(EVENT_METRIC[situation])["time"].iloc[0])
    steps = times("cluster_size")
    steps = steps[steps["rank"] == 0]
    before, after = steps[steps["time"] < event], steps[steps["time"] > event]
    starts = times("worker_start")
    started_before = set(starts[starts["time"] < event]["rank"])
    restarts = int(starts[(starts["time"] > event) & starts["rank"].isin(started_before)].shape[0])
    size_before = float(before["value"].iloc[-1]) if len(before) else float("nan")
    size_after = float(after["value"].iloc[-1]) if len(after) else float("nan")
    summary = {
        "runtime": runtime,
        "situation": situation,
        "model": rows["model"].iloc[0],
        "steps_before": len(before),
        "steps_after": len(after),
        "restarts": restarts,
        "size_before": size_before,
        "size_after": size_after,
        "first_step_s": float(steps["time"].iloc[0]) - start if len(steps) else float("nan"),
        "first_step_vs_event_s": float(steps["time"].iloc[0]) - event if len(steps) else float("nan"),
        "next_step_s": next_step(after, size_before) - event,
        "longest_pause_s": float(steps[steps["time"] >= before["time"].max()]["time"].diff().max())
        if len(before) and len(after)
        else float("nan"),
        "event_s": event - start,
        "cell_s": float(rows["time"].max()) - start,
    }
    summary["outcome"] = outcome(situation, summary)
    summary["in_place"] = float(summary["outcome"] in ("carried on in place",))
    return summary


def next_step(after: pd.DataFrame, size_before: float) -> float:
    """When the next step after the event was done: the first at a new size if there is one (the runtime took the
    change in; the steps an old group still trains before torchrun restarts it do not count), else the first."""
    if after.empty:
        return float("nan")
    changed = after[after["value"] != size_before]
    return float((changed if len(changed) else after)["time"].iloc[0])


def outcome(situation: str, cell: dict[str, Any]) -> str:
    """What the runtime did, from the cell's counts (in the order of OUTCOMES: the first that applies)."""
    if cell["steps_after"] == 0:
        return "failed"
    if cell["restarts"] > 0:
        return "restarted all workers"
    if situation == "late-start" and cell["steps_before"] == 0:
        return "waited for all workers"
    if situation != "killed" and cell["size_after"] == cell["size_before"]:
        return "ignored the joiner"
    return "carried on in place"


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (runtime, situation) run: what happened and when, with the host load it saw."""
    from ddlrepro.host import summaries

    summary = summaries.with_host_load(cells(table), table, ["runtime", "situation"])
    return summary


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    runtimes = [runtime for runtime in RUNTIMES if runtime in set(summary["runtime"])]
    situations = [situation for situation in SITUATIONS if situation in set(summary["situation"])]
    figure, panels = plotting.new_figure(len(runtimes) * len(situations), TITLE, panel_size=(4.6, 3.4))
    figure.set_size_inches(4.6 * len(situations), 3.4 * len(runtimes) + 0.6)
    grid = figure.add_gridspec(len(runtimes), len(situations))
    models = ", ".join(sorted(summary["model"].unique()))
    figure.suptitle(f"{TITLE} (model: {models})", fontsize="large")
    indexed = summary.set_index(["runtime", "situation"])
    cells_in_order = [(runtime, situation) for runtime in runtimes for situation in situations]
    for index, (axis, (runtime, situation)) in enumerate(zip(panels, cells_in_order, strict=True)):
        row, column = divmod(index, len(situations))
        axis.set_subplotspec(grid[row, column])
        plotting.panel_title(axis, f"{runtime}, {situation}")
        if (runtime, situation) in indexed.index:
            draw_cell(axis, table, indexed.loc[(runtime, situation)], runtime, situation)
        axis.set_ylabel("cluster size (workers)" if column == 0 else "")
        axis.set_xlabel("time since the job started (s)" if row == len(runtimes) - 1 else "")
    plotting.note_disturbed(panels[0], summary, ["runtime", "situation"])
    return figure


def draw_cell(axis: Axes, table: pd.DataFrame, cell: pd.Series, runtime: str, situation: str) -> None:
    """The cell's timeline: cluster size at each of rank 0's steps, the event as a dashed line, the first step after
    it that counts (`next_step`) drawn larger (ringed when its run was disturbed); what happened written in the
    panel."""
    from ddlrepro.host import plotting

    rows = table[(table["runtime"] == runtime) & (table["situation"] == situation)]
    start = rows.loc[rows["metric"] == "job_start", "time"].min()
    steps = rows[(rows["metric"] == "cluster_size") & (rows["rank"] == 0)].sort_values("time")
    axis.plot(steps["time"] - start, steps["value"], marker=".", linestyle="none", label="a step of rank 0")
    axis.axvline(cell["event_s"], color="black", linestyle="--", linewidth=1)
    after = steps[steps["time"] - start >= cell["event_s"] + cell["next_step_s"]].head(1)
    if len(after):
        axis.plot(after["time"] - start, after["value"], marker="o", linestyle="none", color="black")
        plotting.ring_disturbed(axis, after["time"] - start, after["value"], [bool(cell.get("disturbed", False))])
    next_step = (
        "no step after it" if math.isnan(cell["next_step_s"]) else f"next step after {cell['next_step_s']:.2f} s"
    )
    if not math.isnan(cell["longest_pause_s"]):
        next_step += f"\nlongest pause {cell['longest_pause_s']:.2f} s"
    axis.text(
        0.03,
        0.05,
        f"{cell['outcome']}\n{next_step}",
        transform=axis.transAxes,
        fontsize="small",
        va="bottom",
        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
    )
    axis.set_ylim(0, 3.6)
    axis.set_yticks([0, 1, 2, 3])
