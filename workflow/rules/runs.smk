# One distributed run per point. The point (JSON) is a param: a changed parameter gives a new point id anyway.
# The resources are the point's Slurm allocation (launchers/slurm.py); the local launcher ignores them.
# With images.build set, every run depends on the built image's digest: a changed image reruns the runs.


rule run_point:
    input:
        resumed_point_result,
        image_file(),
        point_software,
    output:
        "results/runs/{figure}/{point}/result.json",
    log:
        "results/logs/run_point/{figure}/{point}.log",
    retries: config["launcher"]["retries"]
    conda:
        SOFTWARE
    threads: run_threads
    resources:
        runtime=allocated("runtime"),
        nodes=allocated("nodes"),
        tasks=allocated("tasks"),
        cpus_per_task=allocated("cpus_per_task"),
        mem_mb=allocated("mem_mb"),
        slurm_partition=allocated("slurm_partition"),
        slurm_account=allocated("slurm_account"),
        gres=allocated("gres"),
        slurm_extra=lambda wildcards: f"--ntasks-per-node={run_allocation(wildcards)['tasks_per_node']}",
        mpi=allocated("mpi"),
    params:
        point=lambda wildcards: shlex.quote(lookup_point(wildcards).to_json()),
        launcher=config["launcher"]["name"],
        options=launcher_options(),
    shell:
        "python -m ddlrepro run-point --point {params.point} --launcher {params.launcher}"
        " --run-dir $(dirname {output}) --timeout $(({resources.runtime} * 60)) {params.options} > {log} 2>&1"
