"""Workloads: the code every rank of a point runs. Each module exposes `run(params, ctx)`, and `libraries(params)`:
the modules the rank loads before it runs (with the collector paused: ddlrepro/startup.py).

Workload modules import torch, so nothing here is imported while Snakemake builds its DAG.
"""

WORKLOADS = {
    "throughput": "ddlrepro.rank.workloads.throughput",
    "consistent": "ddlrepro.rank.workloads.consistent",
    "allreduce": "ddlrepro.rank.workloads.allreduce",
    "adaptive_batch": "ddlrepro.rank.workloads.adaptive_batch",
    "adaptive_strategy": "ddlrepro.rank.workloads.adaptive_strategy",
    "ps": "ddlrepro.rank.workloads.parameter_server",
    "gan": "ddlrepro.rank.workloads.gan",
}
