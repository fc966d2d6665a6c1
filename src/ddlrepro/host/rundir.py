"""A run folder holds everything about one point; `result.json` is written last and atomically.

results/runs/<figure>/<point-id>/
    jobspec.json      the launcher's rendered job (commands, environment it sets, rendezvous)
    log.txt           every rank's stdout and stderr, line by line, rank-prefixed
    metrics.jsonl     the ranks' metric records (per iteration, resource samples)
    ledger.jsonl      elastic runs: the samples each rank's steps trained, and where training resumed after a resize
    provenance.json   code, software, hardware, hosts, job spec and point
    result.json       the run's summary; present only if every rank succeeded
    attempt.json      this attempt: number, outcome, wall time, error (host/run.py)
    checkpoint/       a resumable workload's checkpoints (the `ps` workload's chief)
    attempts/<time>/  earlier failed attempts, moved aside so two attempts never mix
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from ddlrepro.host.redaction import redact, redact_object, registrations, secret_values
from ddlrepro.points import Point
from ddlrepro.records import RECORD_PREFIX

RESULT = "result.json"
ATTEMPT = "attempt.json"
METRICS = "metrics.jsonl"
STDERR_TAIL_LINES = 20


def metric_records(run_dir: Path) -> list[dict[str, Any]]:
    """A run folder's metric records (metrics.jsonl), in the order they were filed."""
    return [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines() if line]


def write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON so that readers see either the old file or the whole new one, never a part. Secrets are redacted
    in the object before it is serialised: JSON escapes a secret holding a quote, backslash or non-ASCII character."""
    text = json.dumps(redact_object(value), indent=2, sort_keys=True) + "\n"
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(handle.name, 0o644)
    os.replace(handle.name, path)


def set_aside_previous_attempt(run_dir: Path) -> Path | None:
    """Move an earlier attempt's files into `attempts/<time>/` so a new attempt starts from an empty folder."""
    leftovers = [entry for entry in run_dir.iterdir() if entry.name != "attempts"] if run_dir.exists() else []
    if not leftovers:
        return None
    destination = run_dir / "attempts" / time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    while destination.exists():
        destination = destination.with_name(destination.name + "-")
    destination.mkdir(parents=True)
    for entry in leftovers:
        shutil.move(entry, destination / entry.name)
    return destination


class OutputCollector:
    """Receives every line the ranks print (from any launcher) and files it: log, metrics, worker records."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.log = (run_dir / "log.txt").open("w")
        self.metrics = (run_dir / METRICS).open("w")
        self.ledger: TextIO | None = None
        self.ledger_records: list[dict[str, Any]] = []
        self.workers: dict[int, dict[str, Any]] = {}
        self.result: dict[str, Any] | None = None
        self._stderr: dict[int | None, deque[str]] = {}  # None: a line of no rank (mpirun's own)
        self._lock = threading.Lock()
        self._secrets, self._registrations = secret_values(), registrations()
        # Called with every record filed (under the collector's lock: they must not call back into it), e.g. by a
        # host that acts when the ranks reach a step (launchers/situations.py).
        self.watchers: list[Callable[[str, dict[str, Any]], None]] = []

    def add_line(self, rank: int | None, stream: str, line: str) -> None:
        """File one line a rank printed, secrets redacted in every form (a rank may print a dict or JSON). Secrets
        are looked up again only when one was registered since (the launcher registers its token after the collector
        is made), not for every line: this runs for every line every rank prints."""
        if self._registrations != registrations():
            self._secrets, self._registrations = secret_values(), registrations()
        line = redact(line, self._secrets)
        with self._lock:
            self.log.write(f"[rank {rank}{' stderr' if stream == 'stderr' else ''}] {line}\n")
            if stream == "stderr":
                self._stderr.setdefault(rank, deque(maxlen=STDERR_TAIL_LINES)).append(line)
            elif line.startswith(RECORD_PREFIX):
                self._file_record_line(rank, line[len(RECORD_PREFIX) :])

    def add_record(self, record: dict[str, Any]) -> None:
        """File a record made on the host side (the testbed's interface counters) as a rank's record is filed."""
        with self._lock:
            self._file_record(dict(record))

    def _file_record_line(self, rank: int | None, text: str) -> None:
        """A record; one that cannot be read (a line cut in two on its way, or not a record at all) is named in the
        rank's stderr tail, so that a run missing its result says why, and the rest of the output is still filed."""
        try:
            record = redact_object(json.loads(text), self._secrets)  # again: a `\u`-escape parses back to the value
            problem = None if isinstance(record, dict) and "kind" in record else "not a record"
        except json.JSONDecodeError as error:
            problem = error.msg
        if problem:
            tail = self._stderr.setdefault(rank, deque(maxlen=STDERR_TAIL_LINES))
            tail.append(f"unreadable record ({problem}): {text[:200]}")
            return
        self._file_record(record)

    def _file_record(self, record: dict[str, Any]) -> None:
        kind = record.pop("kind")
        for watcher in self.watchers:
            watcher(kind, record)
        if kind == "metric":
            self.metrics.write(json.dumps(record) + "\n")
        elif kind == "worker":
            self.workers[record["rank"]] = record
        elif kind == "result":
            self.result = record
        elif kind == "ledger":
            self.ledger = self.ledger or (self.run_dir / "ledger.jsonl").open("w")
            self.ledger.write(json.dumps(record) + "\n")
            self.ledger_records.append(record)

    def stderr_tail(self, rank: int | None) -> list[str]:
        with self._lock:
            return list(self._stderr.get(rank, []))

    def close(self) -> None:
        for handle in (self.log, self.metrics, self.ledger):
            if handle is not None:
                handle.close()

    def __enter__(self) -> OutputCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def result_record(
    point: Point, summary: dict[str, Any], started: float, finished: float, host_load: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The run's result.json; `host_load`: the foreign and steal CPU shares of the host while it measured
    (hostload.HostLoad.to_dict() and how the run's own CPU was counted)."""
    return {
        "status": "ok",
        "point_id": point.id,
        "point": asdict(point),
        "summary": summary,
        "started": started,
        "finished": finished,
        "duration_s": finished - started,
        "host_load": host_load or {"own_cpu": "not measured", "foreign_share": None, "steal_share": None},
    }
