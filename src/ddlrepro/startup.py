"""Starting a rank quickly: the garbage collector waits while the rank loads its libraries.

Loading torch leaves about 170,000 objects the collector tracks, torch and TensorFlow (with Keras) about 530,000,
and nearly all of them live as long as the process; while they are made, each 700 new ones start a collection of the
youngest (every tenth the older ones too), which walks what is alive and finds almost nothing to free (9,600 objects
over all of torch's and TensorFlow's loading). A rank's entry module therefore pauses the collector before its first
import when it runs as the program (`pause_collection`), and the rank resumes it once the libraries its point needs
are loaded, before it builds its model: `resume_collection` moves every object alive to the permanent generation
(`gc.freeze`, what CPython's documentation advises before forking workers), so later collections never walk them
again, and collecting starts again for what training makes. A torch rank (torch, and torch._dynamo, which its first
optimizer loads) then starts on about a fifth less CPU, a TensorFlow rank too (benchmarks/process_start.py). The few
cycles the imports left behind stay: a full collection there would find about 8,500 objects in a torch rank, cost
0.2 s of CPU and give no memory back (the process keeps the allocator's pages; its resident and unique sizes stay).
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterable
from typing import Any

_paused = False


def pause_collection() -> None:
    """Stop collecting until `resume_collection`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection(after_loading: Iterable[str] = ()) -> None:
    """Import the modules `after_loading` (still uncollected), then freeze what is alive and collect again, if
    `pause_collection` stopped it (else only the imports: a test or host process that calls a rank's set-up keeps
    its own collector as it is)."""
    global _paused
    for module in after_loading:
        importlib.import_module(module)
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False


def collector_state() -> dict[str, Any]:
    """What a worker record says of its collector: enabled, and how many objects it left frozen."""
    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
