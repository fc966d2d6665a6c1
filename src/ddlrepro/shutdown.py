"""Leaving a process quickly and safely.

Python's last garbage collections at exit walk every object still alive: after torch and torch._dynamo have loaded
(a DDP model or an optimizer loads the latter) that is 0.6–0.7 s a process here, 0.35 s after pandas and seaborn,
more than a smoke-scale run's own training. Nothing of ours needs them.

A rank must not finalize its interpreter at all. torch's C++ threads call back into Python after the last collective
returns: a gloo worker thread releases a finished work whose tensors have Python objects (found in a core dump of a
rank that died after its result: `ProcessGroupGloo::runLoop` destroying gather_object's `AsyncAllgatherWork`), or
runs a future's Python callback (our monitors' communication hooks). Each takes the GIL; a thread that takes it
while the interpreter finalizes is ended by `pthread_exit`, whose unwinding crosses a `noexcept` C++ frame:
`std::terminate`, "terminate called without an active exception", SIGABRT, after the rank's result. Once a DDP model
has trained, the process group and its threads outlive `destroy_process_group()` (and `gc.collect()`), so they
cannot be joined first (the race of pytorch/pytorch pull request 179291, not merged). A rank therefore leaves with
`os._exit` once everything an ordinary exit would run has run (`leave`).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def skip_final_collection() -> None:
    """Call last in a host entry point: every object alive now is left out of the collections at exit. Their memory
    goes back with the process; records are flushed line by line (records.say) and files closed by then, and
    atexit handlers and weakref finalizers still run."""
    gc.freeze()


def leave(code: int = 0) -> NoReturn:
    """End the process as an ordinary exit would, except for the interpreter's finalization: join the threading
    module's non-daemon threads, run the atexit handlers, finalize MPI where mpi4py started it (mpi4py registers
    that with `Py_AtExit`, which only finalization runs; mpirun fails a rank that skips it), flush Python's and C's
    buffered output, then `os._exit`."""
    threading._shutdown()  # type: ignore[attr-defined]  # what finalization calls first: joins non-daemon threads
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    ctypes.CDLL(None).fflush(None)  # C libraries' buffered output (printf through a pipe), which exit() would flush
    os._exit(code)


def run_rank(main: Callable[[list[str]], None]) -> NoReturn:
    """A rank's entry point: run `main` on the command line's arguments, then `leave`. A failure (an exception or a
    non-zero `sys.exit`) takes Python's ordinary way out, which prints its traceback or message."""
    try:
        main(sys.argv[1:])
    except SystemExit as leaving:
        if leaving.code not in (None, 0):
            raise
    leave(0)
