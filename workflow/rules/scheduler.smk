# Once the workflow is done, whether it succeeded or not, Snakemake waits for nothing of its own: not for its
# scheduler's re-evaluation timers (`make reproduce` spreads the job rate limit over 10 s: profiles/local; the
# Snakefile's onsuccess and onerror cancel them), nor for a cluster executor's status-check sleep (up to 180 s with
# the Slurm plugin).
from ddlrepro.host.scheduling import (
    cancel_rescheduling_timers,
    wake_remote_executors_at_shutdown,
)

wake_remote_executors_at_shutdown()
