"""Snakemake's scheduler as `make reproduce` sets it up (profiles/local): its rate limiter's pending timers."""

from __future__ import annotations

import threading

SCHEDULER_MODULE = "snakemake.scheduling.job_scheduler"


def cancel_rescheduling_timers() -> None:
    """Cancel the scheduler's pending re-evaluation timers. Snakemake starts one after every scheduling pass that
    leaves a job waiting (its `max-jobs-per-timespan` rate limiter), as a thread the interpreter waits for at exit:
    without this, a finished workflow would idle out the rest of the profile's span."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer) and getattr(thread.function, "__module__", None) == SCHEDULER_MODULE:
            thread.cancel()
