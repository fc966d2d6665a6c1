# Checks against the papers, the HTML report of every enabled figure, and the bundle (+ its manifest's digest).
# The references: every figure folder's own (or the configured file), in one file the checks and bundle read.
rule gather_references:
    input:
        reference_sources(),
    output:
        REFERENCES_FILE,
    log:
        "results/logs/gather_references.log",
    conda:
        SOFTWARE
    params:
        references=(
            f"--references {shlex.quote(config['references'])}"
            if config["references"]
            else ""
        ),
    shell:
        "python -m ddlrepro gather-references {params.references} --out {output} > {log} 2>&1"


rule check_figure:
    input:
        summary="results/tables/{figure}.summary.csv",
        references=REFERENCES_FILE,
    output:
        "results/checks/{figure}.tsv",
    log:
        "results/logs/check_figure/{figure}.log",
    conda:
        SOFTWARE
    params:
        scale=config["scale"],
        exclude=" ".join(CHECKS["exclude"]),
        tier=CHECKS["tier"],
    shell:
        "python -m ddlrepro check {wildcards.figure} --summary {input.summary} --references {input.references:q}"
        " --scale {params.scale} --tier {params.tier} --out {output} --exclude {params.exclude} > {log} 2>&1"


# A figure waiting for its data (figures.waiting_for_data) has its references listed as skipped, saying why.
rule collect_checks:
    input:
        checks=figure_checks(ENABLED),
        references=REFERENCES_FILE,
    output:
        "results/checks.tsv",
    log:
        "results/logs/collect_checks.log",
    conda:
        SOFTWARE
    params:
        waiting=shlex.quote(json.dumps(WAITING)),
    shell:
        "python -m ddlrepro collect-checks {input.checks} --references {input.references:q}"
        " --waiting {params.waiting} --out {output} > {log} 2>&1"


# Our HTML report: provenance, checks and the rerun command, which Snakemake's own report (`snakemake --report
# report.zip`: every figure with its caption, the rules and the run times) does not hold.
# Its captions and template are inputs, so editing either rebuilds it.
rule report:
    input:
        figure_outputs(ENABLED),
        checks="results/checks.tsv",
        captions=[caption_file(figure) for figure in ENABLED],
        template=checkout_relative(
            package_files("ddlrepro.host") / "templates" / "report.html.j2"
        ),
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
        rerun_options=shlex.quote(RERUN_OPTIONS),
        repository=CHECKOUT,
    shell:
        "python -m ddlrepro report {params.figures} --out {output} --scale {params.scale}"
        " --launcher {params.launcher} --rerun-options {params.rerun_options} --captions {input.captions:q}"
        " --repository {params.repository:q} > {log} 2>&1"


rule bundle:
    input:
        "results/report.html",
        "results/checks.tsv",
        figure_outputs(ENABLED),
        figure_checks(ENABLED),
        references=REFERENCES_FILE,
        runs=all_point_results(ENABLED),
    output:
        bundle=BUNDLE,
        digest=str(digest_file(Path(BUNDLE))),
    log:
        "results/logs/bundle.log",
    conda:
        SOFTWARE
    params:
        figures=" ".join(ENABLED),
        config=shlex.quote(json.dumps(config)),
        repository=CHECKOUT,
    shell:
        "python -m ddlrepro bundle --out {output.bundle} --figures {params.figures} --runs {input.runs}"
        " --config-json {params.config} --references {input.references:q} --repository {params.repository:q}"
        " > {log} 2>&1"
        # Printed where the user sees it: the digest is the anchor to publish outside the bundle.
        " && echo '{output.bundle}: manifest sha256' $(cat {output.digest})"
