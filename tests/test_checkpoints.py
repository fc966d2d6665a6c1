"""Checkpoints from results folders are read as weights only: one whose pickle would run code is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddlrepro.rank.checkpoints import UnsafeCheckpoint, load_checkpoint, save_checkpoint


def leave_mark(path: str) -> str:
    Path(path).write_text("code from a checkpoint ran")
    return path


class Payload:
    """What a hostile checkpoint holds: unpickling it calls `leave_mark`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return leave_mark, (str(self.marker),)


def test_a_checkpoint_whose_pickle_runs_code_is_refused_naming_the_file(tmp_path: Path) -> None:
    marker, hostile = tmp_path / "marker", tmp_path / "run" / "checkpoint.pt"
    hostile.parent.mkdir()
    torch.save({"step": 3, "model": {"w": torch.ones(2)}, "extra": Payload(marker)}, hostile)
    with pytest.raises(UnsafeCheckpoint, match=rf"{hostile}: refused, it holds more than tensors"):
        load_checkpoint(hostile)
    assert not marker.exists()
    torch.load(hostile, weights_only=False)  # what the folder's checkpoint did before: it runs the payload
    assert marker.read_text() == "code from a checkpoint ran"


def test_a_training_state_round_trips(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.random.get_rng_state(),
        "ests": [{"index": 0, "buffers": [torch.zeros(2)]}],
        "step": 1,
    }
    save_checkpoint(state, tmp_path / "checkpoint.pt")
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded["step"] == 1 and torch.equal(loaded["rng"], state["rng"])
    assert all(torch.equal(loaded["model"][key], value) for key, value in state["model"].items())
    assert not list(tmp_path.glob("*.partial"))
