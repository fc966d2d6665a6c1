# A figure from its tidy table. The figure's module is an input: editing it reruns only this plot.


rule plot:
    input:
        table="results/tables/{figure}.csv",
        references=config["references"],
        runs=point_results,
        code=lambda wildcards: [
            checkout_relative(path) for path in figure_source(wildcards.figure)
        ],
    output:
        png="results/figures/{figure}.png",
        pdf="results/figures/{figure}.pdf",
        summary="results/tables/{figure}.summary.csv",
    log:
        "results/logs/plot/{figure}.log",
    conda:
        SOFTWARE
    params:
        scale=config["scale"],
    shell:
        "python -m ddlrepro plot {wildcards.figure} --table {input.table} --png {output.png}"
        " --pdf {output.pdf} --summary {output.summary} --scale {params.scale}"
        " --references {input.references} --runs {input.runs} > {log} 2>&1"


for figure_id in ENABLED:

    rule:
        name:
            figure_id.replace("-", "_")
        default_target: False
        input:
            figure_outputs([figure_id]),
            figure_checks([figure_id]),
