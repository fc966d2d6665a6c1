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
        max_speed_drift=CHECKS["max_speed_drift"],
    shell:
        "python -m ddlrepro tabulate {input} --out {output} --max-foreign-share {params.max_foreign_share}"
        " --max-speed-drift {params.max_speed_drift} > {log} 2>&1"
