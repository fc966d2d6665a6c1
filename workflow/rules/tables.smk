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
    params:
        max_foreign_share=CHECKS["max_foreign_share"],
        speed_guard=speed_guard_option(CHECKS["max_speed_drift"]),
    shell:
        "python -m ddlrepro tabulate {input} --out {output} --max-foreign-share {params.max_foreign_share}"
        " {params.speed_guard} > {log} 2>&1"
