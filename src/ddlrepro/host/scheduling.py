"""Snakemake's scheduler as the workflow profile sets it up (profiles/default): its rate limiter's pending timers."""

from __future__ import annotations

import threading

SCHEDULER_MODULE = "snakemake.scheduling.job_scheduler"


def cancel_rescheduling_timers() -> int:
    """Cancel the scheduler's pending re-evaluation timers and say how many there were. Snakemake starts one after
    every scheduling pass that leaves a job waiting (its `max-jobs-per-timespan` rate limiter), as a thread the
    interpreter waits for at exit: without this, a finished workflow would idle out the rest of the profile's span."""
    pending = [
        thread
        for thread in threading.enumerate()
        if isinstance(thread, threading.Timer) and getattr(thread.function, "__module__", None) == SCHEDULER_MODULE
    ]
    for timer in pending:
        timer.cancel()
    return len(pending)
