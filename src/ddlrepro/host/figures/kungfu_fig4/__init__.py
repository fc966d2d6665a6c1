"""KungFu Fig 4: adaptive batch size ("KungFu: Making Training in Distributed Machine Learning Adaptive", OSDI
2020, Fig 4; artifact lsds/KungFu, the adaptive-batch fork).

Points: three real-data runs of the same model on the same workers: a fixed small per-worker batch, a fixed large
one (the cap), and the adaptive batch starting small (rank/adaptation/batch.py, fed the noise-scale monitor). Plot:
test accuracy vs training time (the paper's plot) with the threshold (best small-batch accuracy − 1 point); the
per-worker batch over epochs; the policy's input, the noise scale per sample, over steps. Summary per run: time
per epoch, best and final accuracy, time to the threshold, the batch's largest value and its decreases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host import datafetch
from ddlrepro.host.figures.common import require, threads_per_worker
from ddlrepro.points import Point
from ddlrepro.rank import datasets

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ID = "kungfu-fig4"
TITLE = "KungFu Fig 4: adaptive batch size, accuracy against training time"
RUNS = ["small", "large", "adaptive"]
THRESHOLD_POINTS = 1.0  # the threshold: best small-batch accuracy minus this many percentage points
ZOOM_POINTS = 15.0  # panel (a) shows accuracies from the threshold less this many points
SECTION_KEYS = [
    "dataset",
    "model",
    "learning_rate",
    "lr_reference_batch",
    "lr_rule",
    "momentum",
    "weight_decay",
    "cycle_epochs",
    "seed",
    "test_fraction",
]
ADAPTIVE_KEYS = [
    "ema_weight",
    "noise_scale_alpha",
    "noise_scale_aggregation",
    "micro_batches",
    "monitor_interval",
    "batch_rule",
]


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_section(section)
    common = {
        **{key: section[key] for key in SECTION_KEYS},
        "cap": section["cap"],
        "backend": launcher["backend"],
        "sample_interval_s": launcher["sample_interval_s"],
    }
    runs = {
        "small": {"batch_size": section["batch_size"], "adaptive": False, "epochs": section["epochs"]},
        "large": {"batch_size": section["cap"], "adaptive": False, "epochs": section["epochs"]},
        "adaptive": {
            "batch_size": section["batch_size"],
            "adaptive": True,
            "epochs": section["adaptive_epochs"],
            **{key: section[key] for key in ADAPTIVE_KEYS},
        },
    }
    # The data folder's path stays out of the id and the tables (it is this machine's); what it holds is in.
    inputs = {}
    if section["dataset"] == "cifar10":
        folder = datafetch.cifar10_folder(section["data_dir"])
        inputs = {"data_dir": str(folder)}
        common["data_digest"] = datafetch.cifar10_identity(folder)
    workers = section["workers"]
    threads = threads_per_worker(launcher, workers)
    return [
        Point(ID, "adaptive_batch", workers, threads, {**common, "run": run, **params}, inputs)
        for run, params in runs.items()
    ]


def check_section(section: dict[str, Any]) -> None:
    """What the schema cannot say: the cap against the start, the data set's files and size."""
    require(
        section["cap"] >= section["batch_size"],
        ID,
        "cap",
        f"{section['cap']} is below the starting batch_size {section['batch_size']}",
    )
    folder = datafetch.cifar10_folder(section["data_dir"])
    if section["dataset"] == "cifar10" and datafetch.cifar10_present(folder):
        try:
            datasets.check_cifar10(folder)
        except FileNotFoundError as error:
            require(False, ID, "data_dir", str(error))
    require(
        section["batch_size"] % section["micro_batches"] == 0,
        ID,
        "micro_batches",
        f"{section['micro_batches']} does not divide the starting batch_size {section['batch_size']}",
    )
    samples = datasets.train_samples(section["dataset"], section["test_fraction"])
    require(
        section["cap"] * section["workers"] <= samples,
        ID,
        "cap",
        f"{section['cap']} × {section['workers']} workers exceeds the {samples} training samples of one epoch",
    )


def missing_data(section: dict[str, Any], download: bool) -> str | None:
    """What this figure waits for, when CIFAR-10 is not in its folder and `download` does not allow a fetch."""
    if section["dataset"] != "cifar10" or download:
        return None
    folder = datafetch.cifar10_folder(section["data_dir"])
    if (missing := datafetch.cifar10_missing(folder)) is None:
        return None
    return (
        f"CIFAR-10's python batches are not in {folder} (figures.{ID}.data_dir; {missing}: missing): add --config "
        f"download=True to fetch them ({section['data_url']}, MD5 checked), or set data_dir to your copy"
    )


def per_epoch(table: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per run and epoch (`iteration`), a column per metric, from rank 0's records."""
    rows = table[table["metric"].isin(metrics) & (table["rank"] == 0)]
    wide = rows.pivot_table(index=["run", "iteration"], columns="metric", values="value").reset_index()
    return wide.rename(columns={"iteration": "epoch"})


def evaluations(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run and evaluation: epoch, accuracy (%) and the training time before it (s)."""
    return per_epoch(table, ["accuracy", "eval_train_time_s"]).rename(columns={"eval_train_time_s": "train_time_s"})


def epochs(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run and epoch: the per-worker batch and the epoch's training time."""
    return per_epoch(table, ["batch_size", "epoch_time_s"])


def accuracy_summary(table: pd.DataFrame) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    evaluated, trained = evaluations(table), epochs(table)
    best_small = evaluated.loc[evaluated["run"] == "small", "accuracy"].max()
    threshold = best_small - THRESHOLD_POINTS
    rows = []
    for run in [run for run in RUNS if run in set(trained["run"])]:
        scores = evaluated[evaluated["run"] == run].sort_values("epoch")
        batches = trained[trained["run"] == run].sort_values("epoch")
        reached = scores[scores["accuracy"] >= threshold]
        rows.append(
            {
                "run": run,
                "epochs": int(batches["epoch"].max()),
                "time_per_epoch_s": batches["epoch_time_s"].mean(),
                "train_time_s": batches["epoch_time_s"].sum(),
                "best_accuracy": scores["accuracy"].max(),
                "final_accuracy": scores["accuracy"].iloc[-1],
                "threshold": threshold,
                # never reached: infinitely late, so a "sooner than" check fails rather than erring on a NaN
                "time_to_threshold_s": reached["train_time_s"].iloc[0] if len(reached) else np.inf,
                "start_batch": int(batches["batch_size"].iloc[0]),
                "max_batch": int(batches["batch_size"].max()),
                "final_batch": int(batches["batch_size"].iloc[-1]),
                "batch_decreases": int((batches["batch_size"].diff() < 0).sum()),
            }
        )
    summary = pd.DataFrame(rows)
    caps = table.drop_duplicates("run").set_index("run")["cap"]
    return summary.assign(cap=summary["run"].map(caps).astype(int))


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per run: time to the best small-batch accuracy less a point, and the batch sizes it ran, with its host load."""
    from ddlrepro.host import summaries

    summary = summaries.with_host_load(accuracy_summary(table), table, ["run"])
    return summary


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    evaluated = evaluations(table).merge(summary[["run", "disturbed"]], on="run")
    figure, (accuracy, batch, noise) = plotting.new_figure(3, TITLE, panel_size=(5.0, 4.2))
    for run in summary["run"]:
        rows = evaluated[evaluated["run"] == run].sort_values("epoch")
        accuracy.plot(rows["train_time_s"], rows["accuracy"], marker="o", markersize=4, label=run_label(table, run))
        plotting.ring_disturbed(accuracy, rows["train_time_s"], rows["accuracy"], rows["disturbed"])
    accuracy.axhline(summary["threshold"].iloc[0], color="black", linestyle=":", label="best small − 1 point")
    accuracy.set_xlabel("training time, evaluations excluded (s)")
    # the region the claim is about: near the threshold (the first evaluations of every run lie far below)
    bottom = max(0.0, summary["threshold"].iloc[0] - ZOOM_POINTS)
    accuracy.set_ylim(bottom, 100.5)
    accuracy.set_ylabel(f"test accuracy (%, from {bottom:.0f})")
    plotting.legend(accuracy)
    plotting.note_disturbed(accuracy, summary, ["run"])
    draw_batches(batch, table, summary)
    draw_noise(noise, table)
    return figure


RULE_LABELS = {"fork": "the fork's rule", "per-cycle": "per-cycle rule, not the fork's"}


def run_label(table: pd.DataFrame, run: str) -> str:
    """A run's legend label: the adaptive run names its batch rule (tables from before the rules name none)."""
    if "batch_rule" not in table:
        return run
    rules = table.loc[table["run"] == run, "batch_rule"].dropna()
    return f"{run} ({RULE_LABELS[rules.iloc[0]]})" if len(rules) else run


def draw_batches(axis: Axes, table: pd.DataFrame, summary: pd.DataFrame) -> None:
    from ddlrepro.host import plotting

    trained = epochs(table)
    for run in summary["run"]:
        rows = trained[trained["run"] == run].sort_values("epoch")
        axis.step(rows["epoch"], rows["batch_size"], where="post", label=run_label(table, run))
    axis.axhline(summary["cap"].max(), color="black", linestyle=":", label="cap")
    axis.set_yscale("log", base=2)
    axis.set_xlabel("training time (epochs)")
    axis.set_ylabel("batch per worker (samples)")
    plotting.panel_title(axis, "batch size")
    plotting.legend(axis)


def draw_noise(axis: Axes, table: pd.DataFrame) -> None:
    """The adaptive run's input: the monitor's smoothed noise scale B_simple ÷ B per step and the policy's clipped
    EMA of it."""
    from ddlrepro.host import plotting

    adaptive = table[table["run"] == "adaptive"]
    rows = adaptive[adaptive["metric"].isin(["ratio", "ratio_ema"])]
    wide = rows.pivot_table(index="step", columns="metric", values="value").reset_index()
    plotting.panel_title(axis, "adaptive run: the policy's input")
    if wide.empty:
        axis.text(0.5, 0.5, "no adaptive run", ha="center", transform=axis.transAxes)
        return
    alpha, weight, k = (adaptive[key].iloc[0] for key in ("noise_scale_alpha", "ema_weight", "micro_batches"))
    label = f"|B_simple| ÷ B (EMAs α={alpha:g}, k={k:g})"
    axis.plot(wide["step"], wide["ratio"], ".", markersize=2, alpha=0.4, label=label)
    axis.plot(wide["step"], wide["ratio_ema"], label=f"policy's clipped EMA ({weight:g})")
    axis.set_yscale("log")
    axis.set_xlabel("training step")
    axis.set_ylabel("noise scale per sample (B_simple ÷ B)")
    plotting.legend(axis)
