"""Snakemake's own waits once a workflow is done: its rate limiter's pending timers (`make reproduce` sets it up,
profiles/local) and a cluster executor's status-check sleep (`snakemake --profile slurm`)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import inspect
import sys
import threading

SCHEDULER_MODULE = "snakemake.scheduling.job_scheduler"
# The snakemake-interface-executor-plugins releases whose RemoteExecutor was read for the patch below: it replaces
# the private coroutine `_wait_for_jobs` (no supported hook exists). Outside them the patch is not made.
PATCHED_FOR = (9, 10)  # major versions [9, 10)
INTERFACE = "snakemake-interface-executor-plugins"


def cancel_rescheduling_timers() -> None:
    """Cancel the scheduler's pending re-evaluation timers. Snakemake starts one after every scheduling pass that
    leaves a job waiting (its `max-jobs-per-timespan` rate limiter), as a thread the interpreter waits for at exit:
    without this, a finished workflow would idle out the rest of the profile's span."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer) and getattr(thread.function, "__module__", None) == SCHEDULER_MODULE:
            thread.cancel()


def wake_remote_executors_at_shutdown() -> None:
    """Let a cluster executor (Slurm's) shut down as soon as Snakemake asks it to. Its status checks run in a thread
    that sleeps between checks (the Slurm plugin adds 10 s to the interval after every check that finds no job
    finished, up to 180 s), and its shutdown joins that thread: a workflow that is done, or has failed, would sit
    out the rest of that sleep (snakemake-executor-plugin-slurm issue 252). Here shutdown wakes the thread first.
    Idempotent; every remote executor plugin shares the patched base class."""
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    if getattr(RemoteExecutor.shutdown, "wakes_status_checks", False):
        return
    reason = unpatchable_reason(RemoteExecutor)
    if reason:
        print(f"ddlrepro: a finished Slurm workflow may sit out its status-check sleep: {reason}", file=sys.stderr)
        return
    wait_for_jobs, shutdown = RemoteExecutor._wait_for_jobs, RemoteExecutor.shutdown

    async def wakeable_wait_for_jobs(self: RemoteExecutor) -> None:
        self.status_checks = (asyncio.get_running_loop(), asyncio.current_task())
        with contextlib.suppress(asyncio.CancelledError):  # woken by shutdown: there is nothing left to check
            await wait_for_jobs(self)

    def waking_shutdown(self: RemoteExecutor) -> None:
        with self.lock:
            self.wait = False
        loop, task = getattr(self, "status_checks", (None, None))
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(task.cancel)
        shutdown(self)

    waking_shutdown.wakes_status_checks = True  # type: ignore[attr-defined]  # the mark that it is installed
    RemoteExecutor._wait_for_jobs = wakeable_wait_for_jobs
    RemoteExecutor.shutdown = waking_shutdown


def unpatchable_reason(remote_executor: type) -> str | None:
    """Why the status-check patch does not fit the installed executor interface, or None."""
    version = importlib.metadata.version(INTERFACE)
    major = int(version.split(".")[0])
    if not PATCHED_FOR[0] <= major < PATCHED_FOR[1]:
        return f"{INTERFACE} {version} is outside the versions the patch was written for ({PATCHED_FOR[0]}.x)"
    problem = shape_problem(remote_executor)
    return f"{INTERFACE} {version}'s RemoteExecutor {problem}" if problem else None


def shape_problem(remote_executor: type) -> str | None:
    """What the patch relies on and `remote_executor` no longer has: a coroutine `_wait_for_jobs(self)`, a method
    `shutdown(self)`, and the `lock` and `wait` attributes its `__init__` sets (shutdown's own stop flag)."""
    wait_for_jobs = getattr(remote_executor, "_wait_for_jobs", None)
    shutdown = getattr(remote_executor, "shutdown", None)
    if not inspect.iscoroutinefunction(wait_for_jobs):
        return "has no coroutine `_wait_for_jobs` any more"
    if list(inspect.signature(wait_for_jobs).parameters) != ["self"]:
        return f"has `_wait_for_jobs{inspect.signature(wait_for_jobs)}`, not `_wait_for_jobs(self)`"
    if not inspect.isfunction(shutdown) or list(inspect.signature(shutdown).parameters) != ["self"]:
        return "has no method `shutdown(self)` any more"
    try:
        source = inspect.getsource(remote_executor.__init__)  # type: ignore[misc]  # the class's own, read only
    except (OSError, TypeError):  # no source of its own (object's __init__, or a compiled one)
        source = ""
    unset = [name for name in ("lock", "wait") if f"self.{name} = " not in source]
    return f"no longer sets `self.{unset[0]}` in `__init__`" if unset else None
