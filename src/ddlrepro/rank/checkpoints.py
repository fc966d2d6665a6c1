"""Checkpoints in run folders: written atomically, read as weights only.

Run folders travel in bundles, and continuing someone else's results reads their checkpoints: `torch.load` with
`weights_only=False` would run whatever their pickle says. So a checkpoint holds only what the weights-only
unpickler admits (tensors, numbers, strings, and lists, tuples and dicts of them: state_dicts, RNG states, counters)
and one that asks for anything else is refused, naming the file.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch


class UnsafeCheckpoint(RuntimeError):
    pass


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    """`checkpoint` at `path`, whole or not at all (written beside it, then renamed)."""
    partial = path.with_name(path.name + ".partial")
    torch.save(checkpoint, partial)
    os.replace(partial, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at `path`, read by torch's weights-only unpickler; anything else in it is refused."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0]
        raise UnsafeCheckpoint(
            f"{path}: refused, it holds more than tensors and plain values (torch's weights-only load: {first});"
            " a checkpoint from a results folder is never unpickled in full"
        ) from None
