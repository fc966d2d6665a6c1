# Once the workflow is done, whether it succeeded or not, Snakemake waits for nothing of its own: not for its
# scheduler's re-evaluation timers (`make reproduce` spreads the job rate limit over 10 s: profiles/local; the
# handlers below cancel them, and onsuccess prints the checks' headline), nor for a cluster executor's
# status-check sleep (up to 180 s with the Slurm plugin).
from ddlrepro.host.scheduling import (
    cancel_rescheduling_timers,
    wake_remote_executors_at_shutdown,
)

wake_remote_executors_at_shutdown()


onsuccess:
    cancel_rescheduling_timers()
    if (
        "print_headline" in globals()
    ):  # the workflow's (common.smk), not a bare Snakefile including this file
        print_headline(Path("results/checks.tsv"))


onerror:
    cancel_rescheduling_timers()
