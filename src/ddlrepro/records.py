"""The machine-readable lines ranks print: `DDLREPRO {json}`. Free of torch so launchers can parse them cheaply."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

RECORD_PREFIX = "DDLREPRO "
# Where a resumable workload's rank 0 checkpoints in its run folder; the host hands a retry the last failed
# attempt's (host/run.py).
CHECKPOINT_DIR = "checkpoint"
_print_lock = threading.Lock()


def emit(kind: str, **fields: Any) -> None:
    """Print one record (kind: metric, worker or result), atomically with respect to this rank's other threads."""
    say(RECORD_PREFIX + json.dumps({"kind": kind, "time": time.time(), **fields}))


def say(text: str) -> None:
    """Print one line in a single write: mpirun --tag-output splits lines written in pieces (print's text, then
    its newline, in unbuffered mode) and glues another rank's line onto the fragment."""
    with _print_lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
