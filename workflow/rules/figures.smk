# A figure from its tidy table. The figure's module is an input: editing it reruns only this plot.


# A simulated figure (easyscale-fig14) plots a simulation of its runs' table, made by its own job: only the settings
# the simulation reads are its params, so changing them reruns the simulation and the plot, never the runs.
rule simulate_table:
    input:
        table="results/tables/{figure}.csv",
        runs=point_results,
        files=simulation_files,
        code=lambda wildcards: [
            checkout_relative(path) for path in figure_source(wildcards.figure)
        ],
    output:
        "results/tables/{figure}.simulated.csv",
    log:
        "results/logs/simulate_table/{figure}.log",
    wildcard_constraints:
        figure="|".join(SIMULATED),
    conda:
        SOFTWARE
    params:
        settings=lambda wildcards: shlex.quote(
            json.dumps(
                simulation_settings(
                    wildcards.figure, config["figures"][wildcards.figure]
                ),
                sort_keys=True,
            )
        ),
    shell:
        "python -m ddlrepro simulate-table {wildcards.figure} --table {input.table} --settings {params.settings}"
        " --runs {input.runs} --out {output} > {log} 2>&1"


# What the checks read: the figure's summary of its table (per replicate where it has several), no drawing.
rule summarize:
    input:
        table=plot_table,
        code=lambda wildcards: [
            checkout_relative(path)
            for path in figure_source(wildcards.figure, drawn=False)
        ],
    output:
        "results/tables/{figure}.summary.csv",
    log:
        "results/logs/summarize/{figure}.log",
    conda:
        SOFTWARE
    shell:
        "python -m ddlrepro summarize {wildcards.figure} --table {input.table} --out {output} > {log} 2>&1"


rule plot:
    input:
        table=plot_table,
        references=REFERENCES_FILE,
        runs=point_results,
        code=lambda wildcards: [
            checkout_relative(path) for path in figure_source(wildcards.figure)
        ],
    output:
        # In Snakemake's own report too (`snakemake --report report.zip`), under its figure, with its caption.
        png=report(
            "results/figures/{figure}.png",
            caption="../snakemake-report/caption.rst",
            category="Figures",
            subcategory="{figure}",
            labels={"figure": "{figure}"},
        ),
        pdf="results/figures/{figure}.pdf",
    log:
        "results/logs/plot/{figure}.log",
    conda:
        SOFTWARE
    params:
        scale=config["scale"],
        caption=lambda wildcards: CaptionText(caption_file(wildcards.figure)),
    shell:
        "python -m ddlrepro plot {wildcards.figure} --table {input.table} --png {output.png}"
        " --pdf {output.pdf} --scale {params.scale}"
        " --references {input.references:q} --runs {input.runs} > {log} 2>&1"


for figure_id in ENABLED:

    rule:
        name:
            figure_id.replace("-", "_")
        default_target: False
        input:
            figure_outputs([figure_id]),
            figure_checks([figure_id]),
