"""End to end through Snakemake on a private copy of the workflow: figures, tables, report, incremental reruns,
single-figure targets, and a worker killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import (
    ONE_WORKER_COUNT_DLAAS,
    SNAKEMAKE,
    checks_excluding,
    planned_jobs,
    snakemake,
    undocumented_results,
    workflow_environment,
)
from test_local_launcher import wait_for, worker_pids

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.figures import FIGURES

# Extra config files go after TINY's (one --configfile with several files: a second flag would replace the first).
TINY = ["--configfile", "tests/configs/tiny.yaml"]
FIGURE_IDS = ["kungfu-fig8", "kungfu-fig9", "kungfu-fig10", "kungfu-allreduce", "dlaas-scaling", "easyscale-fig9"]


@pytest.mark.slow
def test_workflow_builds_figures_and_reruns_only_what_changed(workflow_copy: Path) -> None:
    built = snakemake(workflow_copy, *TINY)
    assert built.returncode == 0, built.stderr[-3000:]
    results = workflow_copy / "results"
    for figure in FIGURE_IDS:
        for path in (f"figures/{figure}.png", f"figures/{figure}.pdf", f"tables/{figure}.summary.csv"):
            assert (results / path).stat().st_size > 0

    table = pd.read_csv(results / "tables" / "kungfu-fig9.csv")
    rates = table[table["metric"] == "img_per_sec"]
    assert sorted(rates.groupby("workers")["rank"].nunique().items()) == [(1, 1), (2, 2)]
    assert len(rates) == (1 + 2) * 2
    assert {"point_id", "model", "batch_size", "rank", "iteration", "metric", "value"} <= set(table.columns)
    summary = pd.read_csv(results / "tables" / "dlaas-scaling.summary.csv")
    skipped = summary[summary["status"] == "skipped"]  # the overlay rows saying why its check is skipped
    assert set(skipped["network"]) == {"overlay"} and skipped["reason"].str.startswith("no overlay run").all()
    summary = summary[summary["status"] == "ok"]
    assert list(summary["workers"]) == [1, 2]
    assert (summary["per_worker"] > 0).all()
    # rate_N / (N × rate_1), whatever the timings: a 1-worker run slowed by a busy host makes 2 look superlinear
    single = summary.loc[summary["workers"] == 1, "per_worker"].iloc[0]
    assert list(summary["efficiency"]) == pytest.approx(list(summary["per_worker"] / single))
    assert {"foreign_share", "steal_share", "disturbed"} <= set(summary.columns)

    html = (results / "report.html").read_text()
    for figure in FIGURE_IDS:
        assert f'id="{figure}"' in html
    assert html.count("data:image/png;base64,") == len(FIGURE_IDS)
    assert_snakemake_report_holds_every_figure(workflow_copy)
    checks = pd.read_csv(results / "checks.tsv", sep="\t").set_index(["figure", "check"])
    assert checks.loc[("easyscale-fig9", "d1-exactly-zero"), "status"] == "pass"
    sweep = pd.read_csv(results / "tables" / "kungfu-allreduce.summary.csv")
    measured = sweep[sweep["status"] == "ok"]
    assert set(measured["strategy"]) == {"RING", "STAR"}
    assert sorted(measured["size_bytes"].unique()) == [1024 * 2**k for k in range(7)]
    assert (measured["busbw_GBps"] > 0).all() and (measured["time_s"] > 0).all()
    if not torch.cuda.is_available():
        assert "skipped: needs CUDA" in html
        nccl = pd.read_csv(results / "tables" / "kungfu-fig10.summary.csv")
        assert list(nccl["status"]) == ["skipped"] and list(nccl["reason"]) == ["skipped: needs CUDA"]
        assert set(sweep.loc[sweep["backend"] == "nccl", "reason"]) == {"skipped: needs CUDA"}
        for figure, check in [("kungfu-fig10", "nccl-faster-than-gloo"), ("kungfu-allreduce", "nccl-busbw")]:
            assert checks.loc[(figure, check), "status"] == "skipped"
            assert checks.loc[(figure, check), "reason"] == "skipped: needs CUDA"
    monitored = pd.read_csv(results / "tables" / "kungfu-fig8.csv")
    assert set(monitored.loc[monitored["metric"] == "gradient_variance", "step"]) == {0, 2, 4}
    assert len(monitored[monitored["metric"] == "noise_scale"]) == 2 * 5
    overheads = pd.read_csv(results / "tables" / "kungfu-fig8.summary.csv")
    assert list(overheads["setting"]) == ["none", "noise-scale@1", "variance@2"]
    assert planned_jobs(snakemake(workflow_copy, *TINY, "-n").stdout) == {}
    assert undocumented_results(workflow_copy) == []  # docs/results-layout.md names every file written

    plot_code = figure_file("kungfu-fig9", "__init__.py", workflow_copy)
    plot_code.write_text(plot_code.read_text() + "\n# edited\n")
    downstream_of_one_plot = {"summarize": 1, "plot": 1, "check_figure": 1, "collect_checks": 1, "report": 1, "all": 1}
    assert planned_jobs(snakemake(workflow_copy, *TINY, "-n").stdout) == downstream_of_one_plot
    assert snakemake(workflow_copy, *TINY).returncode == 0

    changed = workflow_copy / "changed.yaml"
    changed.write_text("figures:\n  dlaas-scaling:\n    workers: [1, 3]\n")
    plan = snakemake(workflow_copy, *TINY, str(changed), "-n").stdout
    assert planned_jobs(plan) == {"run_point": 1, "tabulate": 1, **downstream_of_one_plot}
    assert "results/runs/dlaas-scaling/resnet20-np3-" in plan

    (results / "figures" / "kungfu-fig9.png").unlink()
    one_figure = snakemake(workflow_copy, "kungfu_fig9", *TINY)
    assert one_figure.returncode == 0
    assert planned_jobs(one_figure.stderr) == {"plot": 1, "kungfu_fig9": 1}  # its summary and checks stand


def assert_snakemake_report_holds_every_figure(workdir: Path) -> None:
    """`snakemake --report report.zip`: every figure's picture, its caption's text, and the front page."""
    made = snakemake(workdir, *TINY, "--report", "report.zip")
    assert made.returncode == 0, made.stderr[-3000:]
    with zipfile.ZipFile(workdir / "report.zip") as report:
        names = report.namelist()
        page = report.read("report/report.html").decode()
    for figure in FIGURE_IDS:
        assert [name for name in names if name.endswith(f"/{figure}.png")], names
        caption = figure_file(figure, "caption.rst", workdir).read_text().split()[:6]
        assert " ".join(caption) in page, figure
    assert "ddlrepro: the figures of five distributed" in page


@pytest.mark.slow
def test_killed_worker_fails_its_run_and_a_rerun_completes(workflow_copy: Path) -> None:
    slow = workflow_copy / "slow.yaml"
    others = "".join(f"  {figure}: {{enabled: false}}\n" for figure in FIGURES if figure != "dlaas-scaling")
    slow.write_text(
        f"figures:\n{others}  dlaas-scaling: {{workers: [2], iterations: 400, batch_size: 4}}\n"
        + checks_excluding(*ONE_WORKER_COUNT_DLAAS)
    )
    args = [SNAKEMAKE, "--cores", "2", *TINY, str(slow)]
    environment = workflow_environment(workflow_copy)
    workflow = subprocess.Popen(
        args, cwd=workflow_copy, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    runs = workflow_copy / "results" / "runs" / "dlaas-scaling"
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 60, "the run folder")
    pids = wait_for(lambda: len(worker_pids(run_dir)) == 2 and worker_pids(run_dir), 60, "both workers")
    wait_for(lambda: "img_per_sec" in (run_dir / "metrics.jsonl").read_text(), 60, "a timed iteration")
    os.kill(pids[1], signal.SIGKILL)
    workflow.communicate(timeout=60)

    assert workflow.returncode != 0
    job_log = (workflow_copy / "results" / "logs" / "run_point" / "dlaas-scaling" / f"{run_dir.name}.log").read_text()
    assert "rank 1 was killed by SIGKILL" in job_log
    assert not (run_dir / "result.json").exists()
    assert (run_dir / "log.txt").exists() and (run_dir / "metrics.jsonl").exists()
    assert not (workflow_copy / "results" / "tables" / "dlaas-scaling.csv").exists()

    rerun = snakemake(workflow_copy, *TINY, str(slow))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    assert len(list((run_dir / "attempts").iterdir())) == 1
    table = pd.read_csv(workflow_copy / "results" / "tables" / "dlaas-scaling.csv")
    assert set(table["point_id"]) == {run_dir.name}


@pytest.mark.slow
def test_fig9_compares_torch_horovod_and_tensorflow(workflow_copy: Path) -> None:
    """The acceptance run: `snakemake kungfu_fig9` with every framework on 1 and 2 workers (tiny protocol)."""
    frameworks = workflow_copy / "frameworks.yaml"
    frameworks.write_text(
        "figures:\n  kungfu-fig9:\n    frameworks: [torch, horovod, tensorflow]\n    strategies: [RING, STAR]\n"
    )
    built = snakemake(workflow_copy, "kungfu_fig9", *TINY, str(frameworks))
    assert built.returncode == 0, built.stderr[-3000:]
    results = workflow_copy / "results"
    summary = pd.read_csv(results / "tables" / "kungfu-fig9.summary.csv")
    variants = {(row.variant, row.workers) for row in summary.itertuples()}
    expected = {(v, n) for v in ("torch/RING", "horovod/gloo", "tensorflow") for n in (1, 2)} | {("torch/STAR", 2)}
    assert variants == expected
    assert (summary["per_worker"] > 0).all()
    assert summary.loc[summary["framework"] == "horovod", "vs_horovod"].eq(1.0).all()
    assert (results / "figures" / "kungfu-fig9.png").stat().st_size > 0
    assert (results / "software" / "horovod.txt").read_text().strip() == "0.28.1"
