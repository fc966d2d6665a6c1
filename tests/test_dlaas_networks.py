"""dlaas-scaling's network modes (as root; skipped with the reason otherwise): a point on `bridge` or `overlay`
runs one rank per testbed host and its ranks talk over that network; without root or under another launcher it is
skipped with the reason, through the table, the summary and the checks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from ddlrepro.host.checks import check_figure, load_references
from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.figures import dlaas_scaling
from ddlrepro.host.run import unmet_requirement
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testbed import limits
from ddlrepro.points import Point

REASON = limits.unavailable_reason()
CHECK = "overlay-no-more-efficient-than-bridge"


def section(**changes: object) -> tuple[dict, dict]:
    config = load_config(REPO / "config" / "config.yaml", REPO / "tests" / "configs" / "tiny.yaml")
    return config["figures"]["dlaas-scaling"] | changes, config["launcher"]


def test_host_points_keep_their_ids_and_testbed_points_get_one_host_per_rank() -> None:
    default, launcher = section()
    assert default["networks"] == ["host"]
    host_only = dlaas_scaling.points(default, launcher)
    both = dlaas_scaling.points(default | {"networks": ["host", "overlay"], "link_rate": "1gbit"}, launcher)
    assert [point.id for point in both[:2]] == [point.id for point in host_only]
    assert all("network" not in point.params for point in host_only)
    overlay = both[3]
    assert overlay.workers == 2
    assert {key: overlay.params[key] for key in ("network", "testbed_hosts", "link_rate")} == {
        "network": "overlay",
        "testbed_hosts": 2,
        "link_rate": "1gbit",
    }


def test_a_bad_link_rate_names_its_key() -> None:
    bad, launcher = section(networks=["bridge"], link_rate="fast")
    with pytest.raises(ConfigError, match=re.escape("figures.dlaas-scaling.link_rate")):
        dlaas_scaling.points(bad, launcher)


def test_testbed_points_are_skipped_with_the_reason_under_slurm() -> None:
    point = dlaas_scaling.points(*section(networks=["overlay"]))[0]
    assert unmet_requirement(point, "slurm") == (
        "skipped: runs on testbed hosts, which the local launcher makes, not the slurm launcher"
    )
    assert unmet_requirement(Point(**{**point.__dict__, "params": {}}), "slurm") is None


def run_point(point: Point, run_dir: Path) -> dict:
    command = [sys.executable, "-m", "ddlrepro", "run-point", "--point", point.to_json(), "--run-dir", str(run_dir)]
    settings = json.dumps({"launcher": {"timeout_s": 120}})
    subprocess.run(["timeout", "-s", "KILL", "150", *command, "--config-json", settings], check=True, timeout=160)
    return json.loads((run_dir / "result.json").read_text())


def rank_interface_bytes(run_dir: Path) -> dict[str, int]:
    """Bytes each interface of rank 0's host sent during the run (its `node_tx_bytes` at the end minus the start)."""
    sent: dict[str, int] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
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
    assert {worker["env"]["MASTER_ADDR"] for worker in jobspec["workers"]} == {"198.18.1.1"}
    assert {worker["env"]["GLOO_SOCKET_IFNAME"] for worker in jobspec["workers"]} == {"vxlan0"}
    overlay, bridge = rank_interface_bytes(two["overlay"]), rank_interface_bytes(two["bridge"])
    assert set(bridge) == {"eth0"} and bridge["eth0"] > 1e6  # resnet20's gradients, every step
    assert overlay["vxlan0"] > 1e6 and overlay["eth0"] > overlay["vxlan0"]  # all of it encapsulated
    table = tidy_table([tmp_path / point.id for point in points])
    _, summary = dlaas_scaling.plot(table, "smoke", [])
    assert sorted(summary["network"]) == ["bridge", "bridge", "overlay", "overlay"]
    references = [r for r in load_references(REPO / "config" / "references.yaml")["dlaas-scaling"] if r["id"] == CHECK]
    checks = check_figure("dlaas-scaling", summary, references, "smoke").set_index("check")
    assert checks.loc[CHECK, "status"] in {"pass", "fail", "disturbed"}, checks.loc[CHECK].to_dict()
    assert checks.loc[CHECK, "measured"] == pytest.approx(
        summary.set_index(["network", "workers"]).loc[("overlay", 2), "efficiency_vs_bridge"]
    )
