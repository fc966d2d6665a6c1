"""What a SIGKILLed run leaves on the host is gone after the next run starts; what a live run holds is kept.

A real owner process starts a SeaweedFS store (its `weed` server and temporary folder), mounts its bucket with s3fs
and makes CPU quota groups, the way a run's data source and device types do, and is then SIGKILLed: everything
stays. `leftovers.sweep()` (what run_point calls first) removes it all, and leaves alone the same kinds of things
this test's own live process holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest

from ddlrepro.host import cpuquota, leftovers, owners
from ddlrepro.host.cpuquota import CpuQuotas
from ddlrepro.rank.pack_shards import pack

OWNER = textwrap.dedent(
    """
    import contextlib, json, sys, time
    from pathlib import Path
    from ddlrepro.host import objectstore
    from ddlrepro.host.cpuquota import CpuQuotas

    with contextlib.ExitStack() as stack:
        store = stack.enter_context(objectstore.serving(Path(sys.argv[1])))
        mountpoint = None
        if not objectstore.s3fs_unavailable_reason():
            mountpoint = str(stack.enter_context(objectstore.mounted(store)))
        quotas = stack.enter_context(CpuQuotas("leftover-test", {0: 0.5}))
        held = {"folder": str(store.credentials_file.parent), "mount": mountpoint,
                "cgroup": str(quotas.base) if quotas.base else None}
        print(json.dumps(held), flush=True)
        time.sleep(600)
    """
)


def weed_of(folder: str) -> list[psutil.Process]:
    return [
        process
        for process in psutil.process_iter(["name", "cmdline"])
        if process.info["name"] == "weed" and any(folder in argument for argument in process.info["cmdline"] or [])
    ]


def mounted(path: str | None) -> bool:
    return bool(path) and any(line.split()[1] == path for line in Path("/proc/self/mounts").read_text().splitlines())


@pytest.fixture
def killed_owner(tmp_path: Path) -> dict:
    """What a SIGKILLed run held (its store folder, mount, quota group), all still there."""
    shards = tmp_path / "shards"
    pack(shards, "resnet20", 4, 2)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(shards)], stdout=subprocess.PIPE, text=True)
    try:
        held = json.loads(owner.stdout.readline())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    assert Path(held["folder"]).is_dir() and weed_of(held["folder"]), "the killed run's store should still be there"
    return held


def test_a_killed_runs_store_mount_and_quota_groups_are_swept_and_a_live_ones_kept(killed_owner: dict) -> None:
    quota_reason = cpuquota.cpu_hierarchy(cpuquota.CGROUP_ROOT) is None or os.geteuid() != 0
    with (
        tempfile.TemporaryDirectory(prefix=owners.owned_name("store")) as live_folder,
        CpuQuotas("leftover-test-live", {0: 0.5}) as live_quotas,
    ):
        if not quota_reason:
            assert killed_owner["cgroup"] and Path(killed_owner["cgroup"]).is_dir()
        if killed_owner["mount"]:
            assert mounted(killed_owner["mount"])
        removed = leftovers.sweep()
        assert not weed_of(killed_owner["folder"]), removed
        assert not Path(killed_owner["folder"]).exists(), removed
        assert not mounted(killed_owner["mount"]), removed
        assert not (killed_owner["cgroup"] and Path(killed_owner["cgroup"]).exists()), removed
        assert any("weed process" in entry for entry in removed), removed
        assert Path(live_folder).is_dir(), "a live owner's folder was removed"
        assert live_quotas.base is None or live_quotas.base.is_dir(), "a live owner's quota group was removed"


def test_owned_names_tell_dead_owners_from_live_ones() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert owners.dead_owner(f"ddlrepro-store-{gone.pid}-abc")
    assert not owners.dead_owner(owners.owned_name("s3fs", "abc"))
    assert not owners.dead_owner(f"ddlrepro-shards-{gone.pid}-abc"), "not an owned kind"
    with pytest.raises(ValueError, match="unknown kind"):
        owners.owned_name("cache")
