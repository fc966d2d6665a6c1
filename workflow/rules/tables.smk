# Tidy table of a figure: one row per point x worker x iteration x metric.


rule tabulate:
    input:
        point_results,
    output:
        "results/tables/{figure}.csv",
    log:
        "results/logs/tabulate/{figure}.log",
    conda:
        SOFTWARE
    shell:
        "python -m ddlrepro tabulate {input} --out {output} > {log} 2>&1"
