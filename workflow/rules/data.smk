# Data sets fetched where a figure needs them and `download` allows (host/datafetch.py): downloaded beside the
# destination, the published checksum verified, then moved into place; a failure leaves nothing. Run where
# Snakemake runs (localrules): cluster nodes often cannot reach the internet.


CIFAR10_DIR = cifar10_folder(config["figures"]["kungfu-fig4"]["data_dir"])


rule fetch_cifar10:
    output:
        [str(CIFAR10_DIR / name) for name in CIFAR10_FILES],
    log:
        "results/logs/fetch_cifar10.log",
    conda:
        SOFTWARE
    params:
        folder=lambda wildcards, output: shlex.quote(str(Path(output[0]).parent)),
        url=shlex.quote(config["figures"]["kungfu-fig4"]["data_url"]),
    shell:
        "python -m ddlrepro fetch-data cifar10 --folder {params.folder} --url {params.url} > {log} 2>&1"
