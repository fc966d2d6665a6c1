# `make reproduce` spreads Snakemake's job rate limit over 10 s (profiles/local/config.yaml), so the scheduler's
# re-evaluation timers wait up to 10 s: once the workflow is done, whether it succeeded or not, nothing needs them.
from ddlrepro.host.scheduling import cancel_rescheduling_timers


onsuccess:
    cancel_rescheduling_timers()


onerror:
    cancel_rescheduling_timers()
