# Software the project builds itself: Horovod 0.28.1 from PyPI's sdist with envs/horovod/*.patch (scripts/horovod).
# The script caches the wheel under build/horovod/<key> and is a no-op when that build is installed; runs of
# Horovod points wait for it.


rule horovod:
    input:
        script="scripts/horovod",
        patches=sorted(str(path) for path in Path("envs/horovod").glob("*.patch")),
    output:
        "results/software/horovod.txt",
    log:
        "results/logs/software/horovod.log",
    conda:
        SOFTWARE
    shell:
        # Into the environment of the `python` every job runs (the workflow checks it imports this ddlrepro).
        '{input.script} install "$(command -v python)" > {log} 2>&1'
        " && python -c 'import horovod; print(horovod.__version__)' > {output}"
