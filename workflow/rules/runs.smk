# One distributed run per point. The point (JSON) is a param: a changed parameter gives a new point id anyway.
# The resources are what the launcher asks a batch scheduler for (Slurm: the point's allocation, launchers/slurm.py).
# With images.build set, every run depends on the built image's digest: a changed image reruns the runs.
# `attempt` is Snakemake's attempt number (a resource, the one place a job sees it): a retry resumes its own failed
# attempt, and any other run, forced or after a killed workflow, is attempt 1 whatever earlier runs left behind.
# A replicate waits for the replicate before it of its figure (replicate_order): replicates interleave A B, A B.
# Runs go first (priority): a run takes every core here, while the figures' tables, plots and checks take one each,
# so left to the end they run two at a time instead of one between runs (about 40 s of a `make reproduce`).


rule run_point:
    input:
        resumed_point_result,
        previous_replicate_results,
        image_file(),
        point_software,
        point_data,
    output:
        "results/runs/{figure}/{point}/result.json",
    log:
        "results/logs/run_point/{figure}/{point}.log",
    priority: 1
    retries: config["launcher"]["retries"]
    conda:
        SOFTWARE
    threads: run_threads
    resources:
        **run_resources(),
        attempt=lambda wildcards, attempt: attempt,
    params:
        point=lambda wildcards: shlex.quote(lookup_point(wildcards).to_json()),
        options=launcher_options(),
    shell:
        "python -m ddlrepro run-point --point {params.point} --run-dir $(dirname {output}) {params.options}"
        " --attempt {resources.attempt}"
        " > {log} 2>&1"


# The shards a figure's non-synthetic data sources read (one batch each): an input of those runs, so a changed
# model, batch or count repacks them and reruns them.
rule pack_shards:
    output:
        directory("results/data/{figure}/shards"),
    log:
        "results/logs/pack_shards/{figure}.log",
    conda:
        SOFTWARE
    params:
        settings=lambda wildcards: shard_options(wildcards.figure),
    shell:
        "python -m ddlrepro.rank.pack_shards --out {output} {params.settings} > {log} 2>&1"
