# Data sets fetched where a figure needs them and `download` allows (host/datafetch.py): downloaded beside the
# destination, the published checksum verified, then moved into place; a failure leaves nothing. Run where
# Snakemake runs (localrules): cluster nodes often cannot reach the internet.


rule fetch_cifar10:
    output:
        [
            str(cifar10_folder(config["figures"]["kungfu-fig4"]["data_dir"]) / name)
            for name in CIFAR10_FILES
        ],
    log:
        "results/logs/fetch_cifar10.log",
    conda:
        SOFTWARE
    params:
        folder=lambda wildcards: shlex.quote(
            str(cifar10_folder(config["figures"]["kungfu-fig4"]["data_dir"]))
        ),
        url=shlex.quote(config["figures"]["kungfu-fig4"]["data_url"]),
    shell:
        "python -m ddlrepro fetch-data cifar10 --folder {params.folder} --url {params.url} > {log} 2>&1"
