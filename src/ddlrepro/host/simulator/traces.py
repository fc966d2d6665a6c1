"""Jobs of a trace: the artifact's CSV format and a seeded generator with the artifact trace's statistics.

The artifact's trace (simulator/workloads/test.csv) has the header
`name,time,application,max_parallelism,batch_size,epochs,enable_heterogeneous_deterministic,preferred_gpu,` and a
ninth, unnamed column it never reads (read here as nothing). A job's work is epochs × its application's data set
in samples × 0.01, as the artifact's `APPLICATIONS` table scales it (simulator/applications.py); its ESTs are its
max_parallelism (EasyScale keeps the global batch, batch_size per EST, whatever the devices). The heterogeneous
flag is any non-zero integer, as the artifact's `bool()` reads it (its first row has 40).

The generator is ours: the artifact's application and parallelism counts, submit times spread uniformly between
its first and last, flags and preferred types with its frequencies, batches from the profiled ones.
"""

from __future__ import annotations

import csv
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlrepro.host.errors import UserError
from ddlrepro.host.simulator.cluster import Cluster
from ddlrepro.host.simulator.parsing import parse_number
from ddlrepro.host.simulator.step_profiles import Profiles

ARTIFACT_COLUMNS = [
    "name",
    "time",
    "application",
    "max_parallelism",
    "batch_size",
    "epochs",
    "enable_heterogeneous_deterministic",
    "preferred_gpu",
]
# Samples per epoch the artifact simulates: each data set's size × 0.01 (simulator/applications.py).
ARTIFACT_DATASET_SAMPLES = {
    "resnet50": 12800.0,
    "vgg19": 12800.0,
    "shufflenetv2": 12800.0,
    "swintransformer": 12800.0,
    "yolov3": 165.51,
    "bert": 886.41,
    "electra": 886.41,
    "ncf": 49708.45,
}
# The artifact trace's statistics (68 rows; the paper says 67 jobs).
ARTIFACT_APPLICATION_COUNTS = {
    "bert": 15,
    "electra": 20,
    "resnet50": 14,
    "yolov3": 7,
    "ncf": 4,
    "shufflenetv2": 3,
    "swintransformer": 3,
    "vgg19": 2,
}
ARTIFACT_PARALLELISM_COUNTS = {4: 1, 8: 11, 16: 18, 32: 38}
ARTIFACT_FIRST_SUBMIT_S, ARTIFACT_LAST_SUBMIT_S = 115, 4814
ARTIFACT_HETEROGENEOUS_SHARE = 42 / 68
ARTIFACT_PREFERRED_SHARES = {"v100": 52 / 68, "p100": 13 / 68, "t4": 3 / 68}
ARTIFACT_EPOCHS = {
    "bert": [3, 4, 5, 10, 30, 40, 50, 100],
    "electra": [1, 5, 10, 20, 40, 50, 60, 70, 100, 200],
    "ncf": [4, 400],
    "resnet50": [2, 3, 4, 8, 9, 20],
    "shufflenetv2": [2, 10, 20],
    "swintransformer": [90, 92],
    "vgg19": [6, 50],
    "yolov3": [4, 20, 40, 200],
}


class TraceError(UserError):
    """A trace row the simulator cannot run."""


@dataclass(frozen=True)
class Job:
    """One job; `row` is its data row in the trace file (1 = the line after the header), or its index when
    generated. `application` names its profile; `trace_application` the trace's name for it."""

    id: str
    row: int
    submit_s: float
    application: str
    trace_application: str
    max_parallelism: int
    batch: int
    epochs: float
    heterogeneous: bool
    preferred_type: str
    work_samples: float


def read_trace(
    path: Path,
    profiles: Profiles,
    cluster: Cluster,
    application_map: Mapping[str, str] | None = None,
    dataset_samples: Mapping[str, float] = ARTIFACT_DATASET_SAMPLES,
    allow_unsorted: bool = False,
    artifact_duplicates: bool = False,
) -> list[Job]:
    """A trace in the artifact's CSV format, every row checked against the profiles and the cluster.

    `application_map`: trace application → profiled application (default: the same name). `allow_unsorted`: keep
    rows whose submit time is earlier than the row before (the artifact's own trace has one, row 21), in file order.
    `artifact_duplicates`: a name used again replaces the job of that name, which keeps its place in the queue, as
    the artifact's OrderedDict of jobs does (its trace names electra-28-1, -2 and -3 three times each: it simulated
    62 jobs of its 68 rows); otherwise a name used twice is an error.
    """
    if not path.is_file():
        raise TraceError(f"trace {path} does not exist")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in ARTIFACT_COLUMNS if column not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {missing}; the artifact's header is {ARTIFACT_COLUMNS}")
        jobs: list[Job] = []
        for row, record in enumerate(reader, start=1):
            job = _job(record, row, f"{path} row {row}", profiles, cluster, application_map or {}, dataset_samples)
            if jobs and job.submit_s < jobs[-1].submit_s and not allow_unsorted:
                raise TraceError(
                    f"{path} row {row}, field time: {job.submit_s:g} is earlier than the row before's "
                    f"{jobs[-1].submit_s:g} (submit times must be sorted)"
                )
            jobs.append(job)
    if not jobs:
        raise TraceError(f"{path}: no jobs")
    duplicates = [name for name, count in Counter(job.id for job in jobs).items() if count > 1]
    if duplicates and not artifact_duplicates:
        raise TraceError(f"{path}, field name: job names used twice: {duplicates}")
    return list({job.id: job for job in jobs}.values())


def _job(
    record: dict[str, str | None],
    row: int,
    where: str,
    profiles: Profiles,
    cluster: Cluster,
    application_map: Mapping[str, str],
    dataset_samples: Mapping[str, float],
) -> Job:
    def field(name: str) -> str:
        value = record.get(name)
        if value is None or not value.strip():
            raise TraceError(f"{where}, field {name}: empty")
        return value.strip()

    def number(name: str, minimum: float) -> float:
        return parse_number(field(name), f"{where}, field {name}", TraceError, minimum=minimum)

    def whole(name: str, minimum: int) -> int:
        return int(parse_number(field(name), f"{where}, field {name}", TraceError, minimum=minimum, whole=True))

    trace_application = field("application")
    application = application_map.get(trace_application, trace_application)
    if application not in profiles.applications():
        raise TraceError(
            f"{where}, field application: no profile for {application!r}"
            + (f" (mapped from {trace_application!r})" if application != trace_application else "")
            + f"; profiled: {sorted(profiles.applications())}"
        )
    if trace_application not in dataset_samples:
        raise TraceError(
            f"{where}, field application: no data set size for {trace_application!r}; known: {sorted(dataset_samples)}"
        )
    parallelism = whole("max_parallelism", 1)
    if parallelism > cluster.total:
        raise TraceError(
            f"{where}, field max_parallelism: {parallelism} is larger than the cluster ({cluster.total} devices)"
        )
    preferred = field("preferred_gpu")
    if preferred not in cluster.types:
        raise TraceError(f"{where}, field preferred_gpu: {preferred!r} is not a device type of {list(cluster.types)}")
    epochs = number("epochs", 0)
    if epochs == 0:
        raise TraceError(f"{where}, field epochs: 0 (a job without work)")
    return Job(
        id=field("name"),
        row=row,
        submit_s=number("time", 0),
        application=application,
        trace_application=trace_application,
        max_parallelism=parallelism,
        batch=whole("batch_size", 1),
        epochs=epochs,
        heterogeneous=whole("enable_heterogeneous_deterministic", 0) != 0,
        preferred_type=preferred,
        work_samples=epochs * dataset_samples[trace_application],
    )


def map_applications(trace_applications: Sequence[str], profiled: Sequence[str]) -> dict[str, str]:
    """Each trace application onto a profiled one: itself where profiled, else the profiled ones in turn (sorted
    names, so the mapping is the same on every machine). Figures label it."""
    if not profiled:
        raise TraceError("no profiled applications to map the trace's onto")
    choices = sorted(profiled)
    unmapped = [app for app in sorted(trace_applications) if app not in choices]
    mapping = {app: app for app in trace_applications if app in choices}
    mapping |= {app: choices[index % len(choices)] for index, app in enumerate(unmapped)}
    return dict(sorted(mapping.items()))


def generate_trace(
    seed: int,
    profiles: Profiles,
    cluster: Cluster,
    application_map: Mapping[str, str] | None = None,
    application_counts: Mapping[str, int] = ARTIFACT_APPLICATION_COUNTS,
    parallelism_counts: Mapping[int, int] = ARTIFACT_PARALLELISM_COUNTS,
    dataset_samples: Mapping[str, float] = ARTIFACT_DATASET_SAMPLES,
) -> list[Job]:
    """A trace with the artifact's statistics; the same seed gives the same jobs. Parallelism above the preferred
    type's size is capped to it (a gang could never start; only where no profiled type is big enough); preferred
    types are drawn among the profiled ones; batches among the profiled ones."""
    mapping = application_map or map_applications(list(application_counts), sorted(profiles.applications()))
    applications = [app for app, count in application_counts.items() for _ in range(count)]
    parallelisms = [size for size, count in parallelism_counts.items() for _ in range(count)]
    if len(applications) != len(parallelisms):
        raise TraceError(f"{len(applications)} applications but {len(parallelisms)} parallelisms")
    rng = random.Random(seed)
    rng.shuffle(applications)
    rng.shuffle(parallelisms)
    inner = sorted(round(rng.uniform(ARTIFACT_FIRST_SUBMIT_S, ARTIFACT_LAST_SUBMIT_S)) for _ in applications[2:])
    submits = [ARTIFACT_FIRST_SUBMIT_S, *inner, ARTIFACT_LAST_SUBMIT_S]
    jobs = []
    for index, (trace_app, parallelism, submit) in enumerate(zip(applications, parallelisms, submits, strict=True)):
        application = mapping[trace_app]
        preferred = _preferred_type(rng, cluster, profiles.device_types(application), parallelism)
        batch = rng.choice(profiles.batches(application))
        epochs = rng.choice(ARTIFACT_EPOCHS.get(trace_app, [1]))
        jobs.append(
            Job(
                id=f"{trace_app}-{index}",
                row=index + 1,
                submit_s=float(submit),
                application=application,
                trace_application=trace_app,
                max_parallelism=min(parallelism, cluster.size(preferred)),
                batch=batch,
                epochs=epochs,
                heterogeneous=bool(rng.random() < ARTIFACT_HETEROGENEOUS_SHARE),
                preferred_type=preferred,
                work_samples=epochs * dataset_samples[trace_app],
            )
        )
    return jobs


def _preferred_type(rng: random.Random, cluster: Cluster, profiled: set[str], parallelism: int) -> str:
    """A profiled type, drawn with the artifact's frequencies among those big enough for a gang of `parallelism`
    (all profiled ones when none is)."""
    usable = [t for t in cluster.types if t in profiled and cluster.size(t) > 0]
    types = [t for t in usable if cluster.size(t) >= parallelism] or usable
    if not types:
        raise TraceError(f"no device type of the cluster {list(cluster.types)} is profiled ({sorted(profiled)})")
    return rng.choices(types, weights=[ARTIFACT_PREFERRED_SHARES.get(t, 1 / len(types)) for t in types])[0]


def write_trace(jobs: Sequence[Job], path: Path) -> None:
    """A trace in the artifact's CSV format (its header, without the unnamed ninth column)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(ARTIFACT_COLUMNS)
        for job in jobs:
            writer.writerow(
                [
                    job.id,
                    f"{job.submit_s:g}",
                    job.trace_application,
                    job.max_parallelism,
                    job.batch,
                    f"{job.epochs:g}",
                    int(job.heterogeneous),
                    job.preferred_type,
                ]
            )
