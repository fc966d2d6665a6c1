"""In-place elastic training for PyTorch, the rank side: a config server (on the host) holds the desired cluster;
workers re-form their process group when it changes, without restarting (state stays in memory); joiners take the
state from a survivor.

    schedule.py          the resize schedule `step:size,...` rank 0 follows (or, with `policy: provisioning`,
                         the decisions of ../policies/provisioning.py, taken alike on every rank)
    cluster.py           one version of the desired cluster, as the config server serves it
    client.py            the workers' and tests' client of the config server
    membership.py        membership, agreement and process-group re-formation, as each worker sees them
    trainer.py           the training itself (a classifier or, for GAN_MODEL, the GAN; data offsets, ledger
                         records, state digests)
    inplace_worker.py    the in-place worker's main loop (train, check config, resize, recover from faults)
    torchrun_worker.py   the baseline worker under torchrun elastic (checkpoint, stop every worker, restart)
    events.py, faults.py resize events and their phases; injected faults

The host side: the config server (`host/configserver.py`), the launchers that start and watch the processes
(`host/launchers/inplace.py`, `host/launchers/torchrun.py`) and the ledger's verification (`host/ledger.py`).
"""

GAN_MODEL = "biggan"  # the `model` whose trainer is the GAN (trainer.GanElasticTrainer) instead of a classifier
GAN_IMAGES = 1797  # what the GAN trains on, scikit-learn's digits: the most its `dataset_size` can be
