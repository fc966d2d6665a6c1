"""Leaving a process quickly. Python's last garbage collections at exit walk every object still alive: after
torch and torch._dynamo have loaded (a DDP model or an optimizer loads the latter) that is 0.6–0.7 s a process
here, 0.35 s after pandas and seaborn, more than a smoke-scale run's own training. Nothing of ours needs them."""

from __future__ import annotations

import gc


def skip_final_collection() -> None:
    """Call last in an entry point: every object alive now is left out of the collections at exit. Their memory
    goes back with the process; records are flushed line by line (records.say) and files closed by then, and
    atexit handlers and weakref finalizers still run."""
    gc.freeze()
