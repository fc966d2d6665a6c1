"""dlaas-scaling's network modes (as root; skipped with the reason otherwise): a point on `bridge` or `overlay`
runs one rank per testbed host and its ranks talk over that network; without root or under another launcher it is
skipped with the reason, through the table, the summary and the checks."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import check_figure, figure_references
from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.figures import dlaas_scaling
from ddlrepro.host.run import unmet_requirement
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testbed import limits
from ddlrepro.host.testbed import overlay as overlay_device
from ddlrepro.points import Point

REASON = limits.unavailable_reason()
CHECK = "overlay-no-more-efficient-than-bridge"


def section(**changes: object) -> tuple[dict, dict]:
    config = load_config(REPO / "config" / "config.yaml", REPO / "tests" / "configs" / "tiny.yaml")
    return config["figures"]["dlaas-scaling"] | changes, config["launcher"]


def test_host_points_keep_their_ids_and_testbed_points_get_one_host_per_rank() -> None:
    default, launcher = section()
    assert default["networks"] == ["host"]
    every = dlaas_scaling.points(default | {"networks": ["host", "bridge", "overlay"], "link_rate": "1gbit"}, launcher)
    # the ids tiny.yaml's dlaas-scaling points had before networks existed (computed at 689dc6a)
    assert [point.id for point in every[:2]] == ["resnet20-np1-f05413dd08", "resnet20-np2-4a5fa68154"]
    assert all("network" not in point.params for point in every[:2])
    overlay = every[5]
    assert overlay.workers == 2
    assert {key: overlay.params[key] for key in ("network", "testbed_hosts", "link_rate")} == {
        "network": "overlay",
        "testbed_hosts": 2,
        "link_rate": "1gbit",
    }


def test_an_overlay_without_the_bridge_it_is_judged_against_names_networks() -> None:
    alone, launcher = section(networks=["host", "overlay"])
    with pytest.raises(ConfigError, match=re.escape("figures.dlaas-scaling.networks: ['host', 'overlay'] has overlay")):
        dlaas_scaling.points(alone, launcher)


def recorded(network: str, workers: set[int] | None = None, **columns: object) -> pd.DataFrame:
    """The recorded tiny dlaas-scaling table as if its runs (those at `workers`) had been on `network`."""
    table = pd.read_csv(figure_file("dlaas-scaling", "recorded.csv"))
    table = table[table["workers"].isin(workers)] if workers else table
    return table.assign(network=network, **columns)


def overlay_check(*tables: pd.DataFrame) -> dict:
    summary = dlaas_scaling.summarize(pd.concat(tables, ignore_index=True))
    references = [r for r in figure_references()["dlaas-scaling"] if r["id"] == CHECK]
    return check_figure("dlaas-scaling", summary, references, "smoke").set_index("check").loc[CHECK].to_dict()


QUIET = {"foreign_share": 0.0, "steal_share": 0.0, "disturbed": False}


def paired(workers: set[int] | None = None, **columns: object) -> pd.DataFrame:
    """The recorded table as overlay runs (at `workers`) that trained a model over the bridge too, in turns: each
    recorded rate once per side (the bridge's 2 % faster)."""
    overlay = recorded("overlay", workers, setting="overlay", **columns)
    bridge = overlay.assign(setting="bridge")
    bridge.loc[bridge["metric"] == "img_per_sec", "value"] *= 1.02
    return pd.concat([overlay, bridge], ignore_index=True)


@pytest.mark.parametrize(
    ("tables", "reason"),
    [
        ((recorded("host"),), "no overlay run: figures.dlaas-scaling.networks has no overlay"),
        ((recorded("overlay"), recorded("bridge")), dlaas_scaling.LACKING_PARTNER["network"]),
    ],
    ids=["host-only", "overlay-unpaired"],
)
def test_the_overlay_check_says_which_run_it_lacks(tables: tuple[pd.DataFrame, ...], reason: str) -> None:
    check = overlay_check(*tables)
    assert (check["status"], check["reason"]) == ("skipped", reason)


def test_the_overlay_check_is_judged_on_its_own_paired_run_and_disturbed_when_that_run_was() -> None:
    busy = {"foreign_share": 0.9, "steal_share": 0.2, "disturbed": True}
    check = overlay_check(paired({1}, **QUIET), paired({2}, **busy), recorded("bridge", **QUIET))
    assert check["status"] == "disturbed"
    assert check["reason"].startswith("foreign CPU load up to 0.90 and steal 0.20")
    quiet = overlay_check(paired(**QUIET), recorded("bridge", **QUIET))
    assert (quiet["status"], quiet["n"]) == ("inconclusive", 1)  # judged, one replicate: no interval
    assert quiet["measured"] == pytest.approx(1 / 1.02)  # the overlay ÷ the bridge of the same run


def test_a_bad_link_rate_names_its_key() -> None:
    bad, launcher = section(networks=["bridge"], link_rate="fast")
    with pytest.raises(ConfigError, match=re.escape("figures.dlaas-scaling.link_rate")):
        dlaas_scaling.points(bad, launcher)


def test_testbed_points_are_skipped_with_the_reason_under_slurm() -> None:
    point = dlaas_scaling.points(*section(networks=["bridge", "overlay"]))[-1]
    assert unmet_requirement(point, "slurm") == (
        "skipped: runs on testbed hosts, which the local launcher makes, not the slurm launcher"
    )
    assert unmet_requirement(Point(**{**point.__dict__, "params": {}}), "slurm") is None


def run_point(point: Point, run_dir: Path) -> dict:
    command = [sys.executable, "-m", "ddlrepro", "run-point", "--point", point.to_json(), "--run-dir", str(run_dir)]
    settings = json.dumps({"launcher": {"timeout_s": 120}})
    subprocess.run(["timeout", "-k", "10", "150", *command, "--config-json", settings], check=True, timeout=160)
    return json.loads((run_dir / "result.json").read_text())


def rank_interface_bytes(run_dir: Path) -> dict[str, int]:
    """Bytes each interface of rank 0's host sent during the run (its `node_tx_bytes` at the end minus the start)."""
    sent: dict[str, int] = {}
    for record in metric_records(run_dir):
        if record.get("metric") == "node_tx_bytes" and record.get("rank") == 0:
            sign = 1 if record["phase"] == "end" else -1
            sent[record["interface"]] = sent.get(record["interface"], 0) + sign * int(record["value"])
    return sent


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_bridge_and_overlay_ranks_talk_over_their_network_and_the_overlay_check_is_evaluated(tmp_path: Path) -> None:
    points = dlaas_scaling.points(*section(networks=["bridge", "overlay"], link_rate="1gbit"))
    runs = {point.id: run_point(point, tmp_path / point.id) for point in points}
    assert all(record["status"] == "ok" for record in runs.values())
    two = {point.params["network"]: tmp_path / point.id for point in points if point.workers == 2}
    jobspec = json.loads((two["overlay"] / "jobspec.json").read_text())
    first_overlay_address = str(ipaddress.ip_network(overlay_device.SUBNET).network_address + 1)
    assert {worker["env"]["MASTER_ADDR"] for worker in jobspec["workers"]} == {first_overlay_address}
    assert {worker["env"]["GLOO_SOCKET_IFNAME"] for worker in jobspec["workers"]} == {"vxlan0"}
    overlay, bridge = rank_interface_bytes(two["overlay"]), rank_interface_bytes(two["bridge"])
    assert set(bridge) == {"eth0"} and bridge["eth0"] > 1e6  # resnet20's gradients, every step
    # The overlay run's two models: one's gradients over vxlan0 (encapsulated, then over eth0), the other's over
    # eth0 alone, as many bytes: eth0 carries about twice vxlan0's.
    assert overlay["vxlan0"] > 1e6 and overlay["eth0"] > 1.8 * overlay["vxlan0"]
    table = tidy_table([tmp_path / point.id for point in points])
    summary = dlaas_scaling.summarize(table)
    assert sorted(summary["network"]) == ["bridge", "bridge", "overlay", "overlay"]
    references = [r for r in figure_references()["dlaas-scaling"] if r["id"] == CHECK]
    checks = check_figure("dlaas-scaling", summary, references, "smoke").set_index("check")
    # One replicate (tiny.yaml): judged, but without an interval.
    assert checks.loc[CHECK, "status"] in {"inconclusive", "disturbed"}, checks.loc[CHECK].to_dict()
    rates = table[(table["metric"] == "img_per_sec") & (table["network"] == "overlay") & (table["workers"] == 2)]
    by_setting = rates.groupby("setting")["value"].mean()
    assert checks.loc[CHECK, "measured"] == pytest.approx(by_setting["overlay"] / by_setting["bridge"])
