"""Each host's interface bytes into a run's metrics.jsonl, host-side: a thread samples the testbed's counters at
an interval and files one `interface_rx_bytes` and one `interface_tx_bytes` metric per host (cumulative bytes since
the interface was made, with `host` and `interface` fields), the last sample when it stops. `node_counters` reads a
host's interfaces the way its ranks do (rank/interfaces.py, run on the host), the calibration's view."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ddlrepro.host.testbed.network import Testbed

Sink = Callable[[dict[str, Any]], None]
READ_AS_RANKS_DO = (
    "import json; from ddlrepro.rank.interfaces import interface_bytes; print(json.dumps(interface_bytes()))"
)


def node_counters(testbed: Testbed, host: str | int) -> dict[str, dict[str, int]]:
    """{interface: {rx_bytes, tx_bytes}} of one host, read on it by the ranks' own reader (eth0, vxlan0 if any)."""
    argv = [*testbed.exec_prefix(host), sys.executable, "-c", READ_AS_RANKS_DO]
    return cast(
        "dict[str, dict[str, int]]",
        json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout),
    )


def counter_records(testbed: Testbed) -> list[dict[str, Any]]:
    """One sample: the records (the project's `metric` kind) of every host's rx and tx bytes."""
    now = time.time()
    return [
        {
            "kind": "metric",
            "time": now,
            "metric": f"interface_{field}",
            "value": value,
            "host": name,
            "interface": testbed.host(name).interface,
        }
        for name, counts in testbed.counters().items()
        for field, value in counts.items()
    ]


def metrics_file(path: Path) -> Sink:
    """A sink appending records to a metrics.jsonl as the run's collector files them (without their kind); for a
    run whose collector is writing that file, pass `OutputCollector.add_record` instead."""

    def append(record: dict[str, Any]) -> None:
        with path.open("a") as handle:
            handle.write(json.dumps({key: value for key, value in record.items() if key != "kind"}) + "\n")

    return append


class CounterSampler:
    """Samples every `interval` seconds from `start()` until `stop()` (or the `with` block's end)."""

    def __init__(self, testbed: Testbed, sink: Sink, interval: float = 1.0) -> None:
        self.testbed = testbed
        self.sink = sink
        self.interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="testbed-counters", daemon=True)

    def sample(self) -> None:
        for record in counter_records(self.testbed):
            self.sink(record)

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stopping.wait(self.interval):
                return

    def start(self) -> CounterSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and take the last sample, so the file ends with the counts at the end of the run."""
        self._stopping.set()
        self._thread.join()
        self.sample()

    def __enter__(self) -> CounterSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
