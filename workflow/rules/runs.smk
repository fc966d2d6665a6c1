# One distributed run per point. The point (JSON) is a param: a changed parameter gives a new point id anyway.


rule run_point:
    input:
        resumed_point_result,
    output:
        "results/runs/{figure}/{point}/result.json",
    log:
        "results/logs/run_point/{figure}/{point}.log",
    conda:
        SOFTWARE
    threads: run_threads
    resources:
        runtime=lambda wildcards: max(1, int(config["launcher"]["timeout_s"] // 60)),
    params:
        point=lambda wildcards: shlex.quote(lookup_point(wildcards).to_json()),
        launcher=config["launcher"]["name"],
    shell:
        "python -m ddlrepro run-point --point {params.point} --launcher {params.launcher}"
        " --run-dir $(dirname {output}) --timeout $(({resources.runtime} * 60)) > {log} 2>&1"
