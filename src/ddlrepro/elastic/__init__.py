"""In-place elastic training for PyTorch: a config server holds the desired cluster; workers re-form their
process group when it changes, without restarting (state stays in memory); joiners take the state from a survivor.

    schedule.py   the resize schedule `step:size,...` rank 0 follows
    server.py     the config server (HTTP: get / put / resize / remove / reset), bound to 127.0.0.1
    client.py     the workers' and tests' client of it
    cluster.py    membership, agreement and process-group re-formation, as each worker sees them
    worker.py     the in-place worker's main loop (train, check config, resize, recover from faults)
    restart.py    the baseline worker under torchrun elastic (checkpoint, stop every worker, restart)

The processes are started and watched by `launchers/elastic.py` (in place) and `launchers/torchrun.py` (baseline);
the training itself (model, data offsets, ledger) is `workloads/elastic.py`.
"""
