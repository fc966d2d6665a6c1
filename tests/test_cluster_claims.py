"""The machine's one multi-node Slurm cluster belongs to the state folder that started it: `stop` from another
folder leaves it running (naming the folder it belongs to), its own folder's files go, and the folder that started
it stops it. The testbed itself is replaced here by its recorded owner (its start and stop: tests/test_multinode.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlrepro.host.testbed import slurm
from ddlrepro.host.testbed.limits import TestbedError


@pytest.fixture
def claimed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """A live cluster claimed by folder `mine`; the calls that would stop it, recorded."""
    monkeypatch.setattr(slurm, "CLAIMS", tmp_path / "run")
    mine = tmp_path / "mine"
    mine.mkdir()
    slurm.CLAIMS.mkdir()
    (slurm.CLAIMS / "slurm-multinode.claim").write_text(f"{mine}\n")
    stopped: list[str] = []
    monkeypatch.setattr(slurm, "read_state", lambda owner: {"pid": 1, "pid_start": 0})
    monkeypatch.setattr(slurm, "owner_alive", lambda state: not stopped)
    monkeypatch.setattr(slurm, "stop_owner", lambda owner, grace: stopped.append(owner))
    monkeypatch.setattr(slurm, "remove_leftovers", lambda owner: False)
    return mine, stopped


def test_stop_from_another_folder_leaves_the_running_cluster_alone(
    claimed: tuple[Path, list[str]], tmp_path: Path
) -> None:
    mine, stopped = claimed
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / slurm.MARKER).write_text("2\n")
    with pytest.raises(TestbedError, match=rf"started from {mine}, not {theirs}: stop it from there"):
        slurm.stop(theirs)
    assert stopped == [] and slurm.claimant() == mine and not (theirs / slurm.MARKER).exists()


def test_the_folder_that_started_it_stops_it_and_gives_up_the_claim(claimed: tuple[Path, list[str]]) -> None:
    mine, stopped = claimed
    slurm.stop(mine)
    assert stopped == [slurm.OWNER] and slurm.claimant() is None
