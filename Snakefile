# ddlrepro: every enabled figure of the bundled studies, from distributed runs to an HTML report.
#   snakemake --cores all                      smoke scale on this machine (config/config.yaml)
#   snakemake --cores all --configfile config/paper.yaml   paper scale
#   snakemake kungfu_fig9                      one figure (rule names: figure ids with _ for -)
from snakemake.utils import min_version

# The release envs/requirements.txt pins (host/scheduling.py works with its executor's internals).
min_version("9.27")


include: "workflow/rules/configfiles.smk"


configfile: "config/config.yaml"


# The front page of Snakemake's own report (`snakemake --report report.zip`); ours is results/report.html.
report: "workflow/snakemake-report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/images.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/software.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/scheduler.smk"


# Only the distributed runs go to a cluster (images are built where Snakemake runs); tables, plots, checks, report and bundle run where Snakemake runs.
localrules:
    all,
    build_image,
    build_sif,
    fetch_cifar10,
    horovod,
    tabulate,
    simulate_table,
    summarize,
    plot,
    gather_references,
    check_figure,
    collect_checks,
    report,
    bundle,


rule all:
    default_target: True
    input:
        figure_outputs(ENABLED),
        "results/checks.tsv",
        "results/report.html",


onstart:
    record_invocation(config, Path("results/provenance"), Path(CHECKOUT))
