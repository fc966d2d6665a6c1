# Software the project builds itself: Horovod 0.28.1 from PyPI's sdist with envs/horovod/*.patch (scripts/horovod).
# The script caches the wheel under build/horovod/<key> and is a no-op when that build is installed; runs of
# Horovod points wait for it. Where it cannot be built by this user (exit 3: not root and its Debian packages
# missing, or the environment not writable), the record says why and the Horovod points are skipped with it.


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
        'code=0; {input.script} install "$(command -v python)" > {log} 2>&1 || code=$?;'
        ' if [ $code -eq 3 ]; then echo "unavailable: $(tail -n 1 {log} | sed s/^horovod:.//)" > {output};'
        " elif [ $code -eq 0 ]; then python -c 'import horovod; print(horovod.__version__)' > {output};"
        " else exit $code; fi"
