"""Wikimedia's image classifier on TensorFlow parameter servers (seed 001: Keras `fit` on one GPU against
parameter servers on YARN), on CPU here.

Points: one cluster run per `placement` (round-robin, partitioned) of the `ps` workload (rank/workloads/
parameter_server.py: ParameterServerStrategy + ClusterCoordinator, the TF2 stand-in for the removed Estimator),
every role (chief, workers, parameter servers, evaluators) a rank on its own testbed host; and one run of the same
model, data, batch, epochs in one process with Keras `fit` (the baseline). Data: scikit-learn's digits. The
workload reads its role from its rank under any launcher (as Slurm tasks too), but this figure's cluster runs ask
for testbed hosts, which only the local launcher makes: elsewhere they are skipped with that reason. Each
`faults:` entry adds a cluster run with a worker or parameter server killed for real (faults.py): its summary row
(`killed worker`, `killed ps`) holds its attempts, time lost, the step it resumed from and the closures run again.

Summary, one row per run: the parameter servers' bytes per sample (their hosts' interface counters, received plus
sent, over the training at `batch_size` and over the probe at `probe_batch_size`), the busiest and least busy
parameter server's bytes and their ratio, the counters against the tensors TensorFlow moves (every variable read
and every trainable one's gradient pushed, per step, from where the chief placed them) and, their packets' headers
taken off, against what the parameter servers' sockets sent and received (TCP payload, from `ss`: gRPC's framing
included),
the spread of the bytes per step at both batch sizes and the tensors' (largest − smallest) ÷ smallest,
test accuracy, training time (the steps only, start-up not included) and the cluster's ready time (and its part
after every rank had loaded its libraries); the cluster
rows also hold their accuracy gap to the one process (points) and the one process's time ÷ theirs.
Plot: (a) bytes per sample at the two batch sizes; (b) bytes per parameter server per placement;
(c) accuracy and (d) training time, cluster against one process; (e) the fault runs' attempts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures import faults
from ddlrepro.host.figures.common import check_rate, threads_per_worker
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "wikimedia-ps"
TITLE = (
    "Wikimedia: TensorFlow parameter servers (ParameterServerStrategy, TF2's stand-in for the Estimator) against "
    "one process (Keras fit); CPU, digits"
)
FROZEN = "; top only: trunk frozen at its random initialisation (no pretrained weights)"
TRAINING_KEYS = ["batch_size", "epochs", "hidden", "trainable", "learning_rate", "test_fraction", "seed"]
CLUSTER_KEYS = ["ps_workers", "ps", "evaluators", "probe_batch_size", "probe_steps"]
SINGLE = "one process"
MIRROR_PREFIX = "ifb"  # shaping's ingress mirrors repeat what the interface received


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_rate(ID, section)
    training = {key: section[key] for key in TRAINING_KEYS}
    ranks = 1 + section["ps_workers"] + section["ps"] + section["evaluators"]
    common = {"backend": "gloo", "sample_interval_s": launcher["sample_interval_s"], **training}
    cluster = {
        **common,
        "mode": "cluster",
        **{key: section[key] for key in CLUSTER_KEYS},
        "testbed_hosts": ranks,  # one host per role; no spare: this figure sends no competing traffic
        "link_rate": section["link_rate"],
    }
    runs = [
        Point(ID, "ps", ranks, threads_per_worker(launcher, ranks), {**cluster, "placement": placement})
        for placement in section["placements"]
    ]
    single = Point(ID, "ps", 1, threads_per_worker(launcher, 1), {**common, "mode": "single"})
    return [*runs, single, *fault_points(section, launcher, cluster)]


def fault_points(section: dict[str, Any], launcher: dict[str, Any], cluster: dict[str, Any]) -> list[Point]:
    """One cluster run per `faults:` entry, on the first placement (faults.py)."""
    points = []
    for change in faults.fault_params(ID, section, launcher):
        ranks = 1 + change["ps_workers"] + change["ps"] + section["evaluators"]
        params = {**cluster, **change, "placement": section["placements"][0], "testbed_hosts": ranks}
        points.append(Point(ID, "ps", ranks, threads_per_worker(launcher, ranks), params))
    return points


def run_name(row: pd.Series) -> str:
    fault = faults.fault_of(row)
    if fault:
        return faults.fault_run_name(fault)
    return SINGLE if row["mode"] == "single" else str(row["placement"])


def last_metric(rows: pd.DataFrame, metric: str) -> float:
    values = rows.loc[rows["metric"] == metric, "value"]
    return float(values.iloc[-1]) if not values.empty else float("nan")


def ps_counter_bytes(rows: pd.DataFrame, phase: str, payload: bool = False) -> dict[int, float]:
    """Per parameter server (task index): bytes its host's interfaces received plus sent over `phase`; `payload`:
    without the packets' TCP/IP and Ethernet headers (testbed/overlay.py's payload_bytes, from the packet counts)."""
    from ddlrepro.host.testbed.overlay import payload_bytes

    roles = rows[rows["metric"] == "role_index"]
    tasks = {int(rank): int(index) for rank, index in zip(roles["rank"], roles["value"], strict=True)}
    ps_ranks = {int(rank) for rank in roles.loc[roles["detail"] == "ps", "rank"]}
    counts = rows[rows["rank"].isin(ps_ranks) & ~rows["interface"].astype(str).str.startswith(MIRROR_PREFIX)]
    moved: dict[int, float] = {}
    for rank, counted in counts.groupby("rank"):
        total = {unit: phase_delta(counted, phase, unit) for unit in ("bytes", "packets")}
        wire = payload_bytes(int(total["bytes"]), int(total["packets"]), False)
        moved[tasks[int(rank)]] = wire if payload else total["bytes"]
    return moved


def phase_delta(counted: pd.DataFrame, phase: str, unit: str) -> float:
    """What the interfaces in `counted` received plus sent (`unit`: bytes or packets) between `phase`'s marks."""
    rows = counted[counted["metric"].isin([f"node_rx_{unit}", f"node_tx_{unit}"])]
    start = rows.loc[rows["phase"] == f"{phase}_start", "value"].sum()
    return float(rows.loc[rows["phase"] == f"{phase}_end", "value"].sum() - start)


def tensorflow_bytes(rows: pd.DataFrame, steps: float) -> float:
    """What TensorFlow moves to and from all parameter servers in `steps` steps (variables read, gradients)."""
    per_step = rows.loc[rows["metric"].isin(["ps_read_bytes_per_step", "ps_pushed_bytes_per_step"]), "value"].sum()
    return float(per_step * steps)


def tcp_bytes(rows: pd.DataFrame, phase: str) -> float:
    """What the parameter servers' sockets sent and received over `phase` (TCP payload, from `ss`), NaN if unread."""
    sockets = rows[rows["metric"] == "tcp_bytes"]
    moved = sockets.loc[sockets["phase"] == f"{phase}_end", "value"].sum()
    moved -= sockets.loc[sockets["phase"] == f"{phase}_start", "value"].sum()
    return float(moved) if not sockets.empty else float("nan")


def cluster_row(rows: pd.DataFrame) -> dict[str, Any]:
    first = rows.iloc[0]
    completed = last_metric(rows, "steps_completed")  # a resumed run's counters cover the steps it ran
    steps = completed if completed == completed else last_metric(rows, "train_steps")
    trained = ps_counter_bytes(rows, "train")
    probed = ps_counter_bytes(rows, "probe")
    batch, probe_batch = float(first["batch_size"]), float(first["probe_batch_size"])
    busiest, least = max(trained.values(), default=float("nan")), min(trained.values(), default=float("nan"))
    per_step, per_step_probe = sum(trained.values()) / steps, sum(probed.values()) / float(first["probe_steps"])
    return {
        "ps_bytes_per_sample": per_step / batch,
        "ps_bytes_per_sample_probe": per_step_probe / probe_batch,
        "ps_bytes_per_step": per_step,
        "ps_bytes_per_step_probe": per_step_probe,
        "tensorflow_bytes_per_step": tensorflow_bytes(rows, 1),
        "step_bytes_spread": spread([per_step, per_step_probe, tensorflow_bytes(rows, 1)]),
        "probe_batch_size": probe_batch,
        "busiest_ps_bytes": busiest,
        "least_ps_bytes": least,
        "ps_imbalance": busiest / least if least > 0 else float("inf"),
        "counters_vs_tensorflow": sum(trained.values()) / tensorflow_bytes(rows, steps),
        "counters_vs_tcp": sum(ps_counter_bytes(rows, "train", payload=True).values()) / tcp_bytes(rows, "train"),
        "cluster_ready_s": last_metric(rows, "cluster_ready_s"),
        "cluster_ready_after_imports_s": last_metric(rows, "cluster_ready_after_imports_s"),
        "evaluator_accuracy": last_metric(rows, "evaluator_accuracy"),
    }


def spread(values: list[float]) -> float:
    """How far apart values are: (largest − smallest) ÷ smallest."""
    return (max(values) - min(values)) / min(values) if min(values) > 0 else float("inf")


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run (see the module's docstring); a skipped run keeps its reason."""
    import pandas as pd

    from ddlrepro.host import summaries

    rows = []
    for point_id, point_rows in table.groupby("point_id", sort=False):
        first = point_rows.iloc[0]
        row = {"run": run_name(first), "point_id": point_id, "batch_size": first["batch_size"]}
        ran = point_rows[point_rows["metric"] != "skipped"]
        if ran.empty:
            rows.append(row | {"status": "skipped", "reason": first.get("reason", "")})
            continue
        row |= {
            "status": "ok",
            "reason": "",
            "accuracy": last_metric(ran, "accuracy"),
            "train_time_s": last_metric(ran, "train_time_s"),
            "epochs": first["epochs"],
        }
        fault = faults.fault_of(first)
        row |= cluster_row(ran) if first["mode"] == "cluster" else {}
        rows.append(row | (faults.fault_row(ran, fault) if fault else {}))
    summary = summaries.with_host_load(pd.DataFrame(rows), table, ["point_id"])
    return against_one_process(summary).drop(columns=["point_id"])


def against_one_process(summary: pd.DataFrame) -> pd.DataFrame:
    """The cluster rows' accuracy gap (points) and speed-up against the one-process run; the speed-up's host load
    (`speedup_disturbed`, ...: what checks read for it) counts both runs'."""
    single = summary[(summary["run"] == SINGLE) & (summary["status"] == "ok")]
    if single.empty or "accuracy" not in summary:
        return summary
    accuracy, seconds = float(single["accuracy"].iloc[0]), float(single["train_time_s"].iloc[0])
    clusters = (summary["run"] != SINGLE) & ~fault_runs(summary)  # a fault run has its own cluster and epochs
    summary.loc[clusters, "accuracy_gap_points"] = (summary.loc[clusters, "accuracy"] - accuracy).abs() * 100
    summary.loc[clusters, "speedup"] = seconds / summary.loc[clusters, "train_time_s"]
    for share in ("foreign_share", "steal_share"):
        summary.loc[clusters, f"speedup_{share}"] = summary.loc[clusters, share].clip(lower=single[share].iloc[0])
    summary["speedup_disturbed"] = clusters & (summary["disturbed"] | bool(single["disturbed"].iloc[0]))
    return summary


def fault_runs(summary: pd.DataFrame) -> pd.Series:
    """Which summary rows are fault runs (shown in their own panel only)."""
    return summary["fault"].notna() if "fault" in summary else summary["run"].isna()


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    import pandas as pd

    from ddlrepro.host import plotting, summaries

    frozen = "trainable" in table and (table["trainable"] == "top").any()
    figure, axes = plotting.new_figure(5, TITLE + (FROZEN if frozen else ""))
    ok = summary[(summary["status"] == "ok") & ~fault_runs(summary)]
    clusters = ok[ok["run"] != SINGLE]
    per_sample = (
        pd.concat(
            [
                clusters.assign(
                    batch=clusters["probe_batch_size"].astype(int), value=clusters["ps_bytes_per_sample_probe"]
                ),
                clusters.assign(batch=clusters["batch_size"].astype(int), value=clusters["ps_bytes_per_sample"]),
            ]
        )
        if not clusters.empty
        else pd.DataFrame()
    )
    bars(axes[0], per_sample, "batch", "value", "run", "batch size (samples)", "to and from the PS (bytes/sample)")
    plotting.panel_title(axes[0], "parameter-server traffic per sample")
    disturbed = dict(zip(summary["run"], summary["disturbed"], strict=True))
    bars(
        axes[1],
        per_ps_table(table, disturbed),
        "run",
        "megabytes",
        "parameter server",
        "placement",
        "PS host traffic (MB)",
    )
    plotting.panel_title(axes[1], "traffic per parameter server")
    bars(axes[2], ok.assign(percent=ok["accuracy"] * 100), "run", "percent", None, "run", "test accuracy (%)")
    plotting.panel_title(axes[2], "accuracy at equal epochs")
    bars(axes[3], ok, "run", "train_time_s", None, "run", "training time (s, start-up excluded)")
    plotting.panel_title(axes[3], "wall time")
    plotting.note_disturbed(axes[3], summary, ["run"])
    faulted = {
        point_id: run_name(rows.iloc[0])
        for point_id, rows in table.groupby("point_id")
        if faults.fault_of(rows.iloc[0])
    }
    faults.plot_faults(axes[4], faults.attempts_table(table, faulted), summary[summary["status"] == "ok"])
    plotting.panel_title(axes[4], "faults: attempts")
    for axis in axes:
        plotting.note_skipped(axis, summaries.skipped_points(table, ["placement", "mode"]), ["placement", "mode"])
    return figure


def per_ps_table(table: pd.DataFrame, disturbed: dict[str, bool]) -> pd.DataFrame:
    """Per cluster run and parameter server: MB its host moved while training (and whether the run was disturbed)."""
    import pandas as pd

    rows = []
    ran = table[(table["metric"] != "skipped") & (table["mode"] == "cluster")]
    ran = ran[ran["fault"].isna()] if "fault" in ran else ran
    for _, point_rows in ran.groupby("point_id", sort=False):
        for task, moved in sorted(ps_counter_bytes(point_rows, "train").items()):
            run = run_name(point_rows.iloc[0])
            rows.append(
                {"run": run, "parameter server": f"ps {task}", "megabytes": moved / 1e6, "disturbed": disturbed[run]}
            )
    return pd.DataFrame(rows)


def bars(axis: Any, data: pd.DataFrame, x: str, y: str, hue: str | None, xlabel: str, ylabel: str) -> None:
    from ddlrepro.host import plotting

    if data.empty:
        axis.text(0.5, 0.5, "no run", ha="center", transform=axis.transAxes)
    else:
        plotting.grouped_bars(axis, data.assign(series="measured"), x=x, y=y, hue=hue or "series")
        if hue:
            plotting.legend(axis, title=hue)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
