"""Fault runs of wikimedia-ps: their points (the section's `faults:` entries), the config errors the schema cannot
say, their summary columns (attempts, time lost, resumed step, closures rescheduled) and their panel.

A fault run is a cluster run whose params hold `fault: {role, task, at_step, signal}` and `checkpoint_interval`
(rank/workloads/ps_faults.py injects it). Its attempts come from the metric records host/run.py files for the
failed attempts before the one that completed (`attempt_wall_s`, `attempt_steps_done`, iteration = the attempt,
detail = the last line of its error) beside the chief's own (`resumed_from_step`, `steps_planned`,
`steps_completed`, `closures_rescheduled`, `fault_delivered_at_step`, `steps_done`) and the killed server's rank's
`fault_server_exit_signal`.
"""

from __future__ import annotations

import json
import math
import signal
from typing import TYPE_CHECKING, Any

from ddlrepro.host.config import ConfigError
from ddlrepro.host.figures.common import require

if TYPE_CHECKING:
    import pandas as pd

OVERRIDES = ("ps_workers", "ps", "epochs")


def fault_params(figure: str, section: dict[str, Any], launcher: dict[str, Any]) -> list[dict[str, Any]]:
    """Per `faults:` entry, the params it changes in a cluster run (its fault, checkpoints and overrides); a fault
    that cannot happen as configured is a ConfigError naming its key."""
    from ddlrepro.rank.datasets import digits_train_size

    changes = []
    for index, entry in enumerate(section["faults"]):
        run = {key: entry.get(key, section[key]) for key in OVERRIDES}
        fault = entry["fault"]
        key = f"faults[{index}]"
        earlier_roles = [earlier["fault"]["role"] for earlier in section["faults"][:index]]
        require(
            fault["role"] not in earlier_roles,
            figure,
            f"{key}.fault.role",
            f"a second {fault['role']} fault: one run per role (the summary names it 'killed {fault['role']}')",
        )
        counts = {"worker": run["ps_workers"], "ps": run["ps"]}
        require(
            fault["task"] < counts[fault["role"]],
            figure,
            f"{key}.fault.task",
            f"no {fault['role']} task {fault['task']} among {counts[fault['role']]}",
        )
        steps = run["epochs"] * math.ceil(digits_train_size(section["test_fraction"]) / section["batch_size"])
        require(
            fault["at_step"] < steps,
            figure,
            f"{key}.fault.at_step",
            f"the run has {steps} steps; the fault must come before the last",
        )
        if fault["role"] == "worker":
            require(
                run["ps_workers"] >= 2,
                figure,
                f"{key}.ps_workers",
                f"a killed worker's steps need another worker to run on: at least 2, not {run['ps_workers']}",
            )
        else:
            check_ps_fault(figure, section, launcher, key, fault["at_step"])
        changes.append({**run, "fault": fault, "checkpoint_interval": section["checkpoint_interval"]})
    return changes


def check_ps_fault(figure: str, section: dict[str, Any], launcher: dict[str, Any], key: str, at_step: int) -> None:
    """A killed parameter server fails its first attempt: it needs a retry, and a checkpoint before the fault."""
    if launcher["retries"] < 1:
        raise ConfigError(
            f"invalid configuration:\n  - launcher.retries: 0, but figures.{figure}.{key} kills a parameter server:"
            " its run fails and resumes from a checkpoint on a retry; set launcher.retries to 1 or more"
        )
    require(
        section["checkpoint_interval"] <= at_step,
        figure,
        "checkpoint_interval",
        f"{section['checkpoint_interval']} "
        f"steps: no checkpoint before {key}'s fault at step {at_step}, a retry would start again from 0",
    )


def fault_of(row: pd.Series) -> dict[str, Any] | None:
    """A table row's fault (the table keeps it as JSON), or None."""
    value = row.get("fault")
    return json.loads(value) if isinstance(value, str) else None


def fault_run_name(fault: dict[str, Any]) -> str:
    """The run's name in the summary (one fault run per role: the references select it by this name)."""
    return f"killed {fault['role']}"


def metric(rows: pd.DataFrame, name: str) -> float:
    values = rows.loc[rows["metric"] == name, "value"]
    return float(values.iloc[-1]) if not values.empty else float("nan")


def fault_row(rows: pd.DataFrame, fault: dict[str, Any]) -> dict[str, Any]:
    """A fault run's summary: its attempts and what each cost, where it resumed, what the coordinator ran again,
    and whether it came through as it should (`fault_survived`: a killed worker; `fault_retried`: a killed PS)."""
    attempts = rows[rows["metric"] == "attempt_wall_s"].sort_values("iteration")
    failed = attempts[attempts["detail"].astype(str).str.startswith("failed")]
    resumed = metric(rows, "resumed_from_step")
    reached = rows[(rows["metric"] == "attempt_steps_done") & rows["detail"].astype(str).str.startswith("failed")]
    redone = float(reached["value"].iloc[-1] - resumed) if not reached.empty else 0.0  # the last failed one's
    completed, planned = metric(rows, "steps_completed"), metric(rows, "steps_planned")
    per_step = metric(rows, "train_time_s") / completed if completed else float("nan")
    first_error = str(failed["detail"].iloc[0]) if not failed.empty else ""
    delivered = metric(rows, "fault_delivered_at_step")
    killed = metric(rows, "fault_server_exit_signal")
    return {
        "fault": f"{fault['signal']} {fault['role']} {fault['task']} at step {fault['at_step']}",
        "attempts": len(attempts),
        "attempt_outcomes": ", ".join(
            f"{detail.split(':')[0]} {seconds:.1f} s"
            for detail, seconds in zip(attempts["detail"], attempts["value"], strict=True)
        ),
        "failed_attempts_s": float(failed["value"].sum()),
        "redone_steps": redone,
        "time_lost_s": float(failed["value"].sum()) + redone * per_step,
        "resumed_from_step": resumed,
        "steps_planned": planned,
        "steps_completed": completed,
        "steps_lost": planned - completed,
        "closures_rescheduled": metric(rows, "closures_rescheduled"),
        "fault_delivered_at_step": delivered,
        "killed_by_signal": killed,
        "first_error": first_error,
        "fault_survived": float(
            delivered == fault["at_step"]
            and killed == signal.Signals[fault["signal"]].value  # the server really died of it
            and completed == planned
            and failed.empty
        ),
        "fault_retried": float(
            not failed.empty and f"/job:ps/task:{fault['task']}" in first_error and resumed > 0 and completed == planned
        ),
    }


def attempts_table(table: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """Per fault run (`names`: the run of each point id) and attempt: its wall time and outcome."""
    import pandas as pd

    attempts = table[(table["metric"] == "attempt_wall_s") & table["point_id"].isin(names)]
    return pd.DataFrame(
        {
            "run": attempts["point_id"].map(names),
            "attempt": [
                f"{int(number)}: {str(detail).split(':')[0]}"
                for number, detail in zip(attempts["iteration"], attempts["detail"], strict=True)
            ],
            "seconds": attempts["value"],
        }
    ).sort_values(["run", "attempt"])


def plot_faults(axis: Any, attempts: pd.DataFrame, summary: pd.DataFrame) -> None:
    """Per fault run, each attempt's wall time (failed, then ok), annotated with where the last one resumed, the
    closures the coordinator ran again and the steps done."""
    from ddlrepro.host import plotting

    if attempts.empty:
        axis.text(0.5, 0.5, "no fault run", ha="center", transform=axis.transAxes)
        return
    disturbed = dict(zip(summary["run"], summary["disturbed"], strict=True))
    plotting.grouped_bars(
        axis, attempts.assign(disturbed=attempts["run"].map(disturbed)), x="run", y="seconds", hue="attempt"
    )
    faulted = summary.set_index("run")
    runs = list(dict.fromkeys(attempts["run"]))
    labels = [
        f"{run}\nresumed at step {row['resumed_from_step']:.0f}\n{row['closures_rescheduled']:.0f} closure(s) run again"
        f"\n{row['steps_completed']:.0f}/{row['steps_planned']:.0f} steps, {row['time_lost_s']:.1f} s lost"
        for run, row in faulted.loc[runs].iterrows()
    ]
    axis.set_xticks(range(len(runs)), labels, fontsize=7)
    axis.set_xlabel("fault run")
    axis.set_ylabel("attempt wall time (s)")
    plotting.legend(axis, title="attempt")
