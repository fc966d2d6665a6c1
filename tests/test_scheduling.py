"""The workflow's Snakemake hooks (workflow/rules/scheduler.smk): a workflow that is done, whether it succeeded or
failed, does not idle out its rate limiter's span (real Snakemake, two jobs that cannot run side by side)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, snakemake

from ddlrepro.host import scheduling

SPAN_S = 15
# b waits while a holds both cores: each scheduling pass in that time leaves a re-evaluation timer of SPAN_S.
TWO_JOBS_ONE_AT_A_TIME = """
rule all:
    input:
        "a",
        "b",


rule one:
    output:
        "{name}",
    wildcard_constraints:
        name="a|b",
    threads: 2
    shell:
        "sleep 1; touch {output}; test {wildcards.name} != {FAILING}"
"""


def seconds_to_finish(workdir: Path, hooks: bool, failing: str = "none") -> float:
    workdir.mkdir()
    include = f'include: "{REPO / "workflow" / "rules" / "scheduler.smk"}"\n\n\n' if hooks else ""
    (workdir / "Snakefile").write_text(include + TWO_JOBS_ONE_AT_A_TIME.replace("{FAILING}", failing))
    started = time.monotonic()
    done = snakemake(workdir, "--max-jobs-per-timespan", f"1000/{SPAN_S}s", timeout=120)
    assert (done.returncode == 0) == (failing == "none"), done.stderr
    return time.monotonic() - started


@pytest.mark.serial  # compares wall times
@pytest.mark.slow
def test_a_finished_workflow_does_not_wait_out_its_rate_limit_span(tmp_path: Path) -> None:
    waited = seconds_to_finish(tmp_path / "without-hooks", hooks=False)
    succeeded = seconds_to_finish(tmp_path / "succeeded", hooks=True)
    failed = seconds_to_finish(tmp_path / "failed", hooks=True, failing="b")
    assert waited - succeeded > SPAN_S / 2, (waited, succeeded)  # without the hooks Snakemake waits for its timers
    assert waited - failed > SPAN_S / 2, (waited, failed)


def test_the_status_check_patch_fits_the_installed_executor_interface() -> None:
    """The patch replaces a private coroutine of Snakemake's executor interface: a pin bump that moves or changes it
    fails here, loudly, rather than leaving finished Slurm workflows asleep."""
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    assert scheduling.unpatchable_reason(RemoteExecutor) is None

    class Changed:
        def _wait_for_jobs(self) -> None: ...

    assert "no coroutine `_wait_for_jobs`" in (scheduling.unpatchable_reason(Changed) or "")


class Fitting:
    """The shape of RemoteExecutor the patch was written for."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wait = True

    async def _wait_for_jobs(self) -> None: ...

    def shutdown(self) -> None: ...


class TakesAnArgument(Fitting):
    async def _wait_for_jobs(self, timeout: float) -> None: ...


class NoWaitFlag(Fitting):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stopping = False


class NoShutdown:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wait = True

    async def _wait_for_jobs(self) -> None: ...


@pytest.mark.parametrize(
    ("executor", "named"),
    [
        (Fitting, None),
        (TakesAnArgument, "`_wait_for_jobs(self, timeout"),
        (NoWaitFlag, "`self.wait`"),
        (NoShutdown, "`shutdown(self)`"),
    ],
)
def test_a_changed_executor_shape_is_named(executor: type, named: str | None) -> None:
    """Each private piece the patch uses, changed, is named in the reason it is not made."""
    reason = scheduling.shape_problem(executor)
    assert reason is None if named is None else named in (reason or ""), reason


def test_the_pinned_executor_interface_is_one_the_patch_was_written_for() -> None:
    """envs/requirements.txt pins the executor interface inside PATCHED_FOR: bumping it past them fails here."""
    pins = dict(
        line.split("==")
        for line in (REPO / "envs" / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    major = int(pins[scheduling.INTERFACE].split(".")[0])
    assert scheduling.PATCHED_FOR[0] <= major < scheduling.PATCHED_FOR[1], pins[scheduling.INTERFACE]
