# The HTML report of every enabled figure (also: `snakemake --report` for Snakemake's own report).


rule report:
    input:
        figure_outputs(ENABLED),
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    conda:
        SOFTWARE
    params:
        scale=config["scale"],
        launcher=config["launcher"]["name"],
        figures=" ".join(ENABLED),
    shell:
        "python -m ddlrepro report {params.figures} --out {output} --scale {params.scale}"
        " --launcher {params.launcher} > {log} 2>&1"
