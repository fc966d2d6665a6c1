# The training image (containers/), built only when config `images.build` asks for it; the runs depend on its
# digest (common.smk: image_file). Host code (src/ddlrepro/host) is not an input: it never runs in the image.


rule build_image:
    input:
        image_sources,
    output:
        "results/images/ddlrepro-{variant}.digest",
    log:
        "results/logs/build_image/{variant}.log",
    wildcard_constraints:
        variant="cpu|cuda",
    conda:
        SOFTWARE
    params:
        engine=IMAGES["build"],
        settings=shlex.quote(json.dumps(IMAGES)),
        repository=CHECKOUT,
    shell:
        "python -m ddlrepro build-image --engine {params.engine} --variant {wildcards.variant}"
        " --settings {params.settings} --repository {params.repository:q} --out {output} > {log} 2>&1"


rule build_sif:
    input:
        image_sources,
    output:
        sif="results/images/ddlrepro-{variant}.sif",
        sha256="results/images/ddlrepro-{variant}.sif.sha256",
    log:
        "results/logs/build_sif/{variant}.log",
    wildcard_constraints:
        variant="cpu|cuda",
    conda:
        SOFTWARE
    params:
        settings=shlex.quote(json.dumps(IMAGES)),
        repository=CHECKOUT,
    shell:
        "python -m ddlrepro build-image --engine apptainer --variant {wildcards.variant}"
        " --settings {params.settings} --repository {params.repository:q} --out {output.sif} > {log} 2>&1"
