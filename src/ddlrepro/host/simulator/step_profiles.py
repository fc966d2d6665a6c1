"""Step-time profiles and the throughput model.

A profile point: (application, device type, per-EST batch, ESTs per device) → seconds of one EST's step when that
many ESTs share the device. The throughput model is the artifact's (simulator/simulator.py `Job.pred_throughput`,
applications.py `get_comp_time`): samples/s = batch × ESTs ÷ max over the device types used of (step time × ESTs
per device on that type); it has no term for gradient synchronisation, as the artifact has not. Profiles measured
here (easyscale-fig14, `devices_per_profile` devices of a type per run) hold a multi-device job's all-reduce and
busy neighbours in their step time, so a one-device job is charged for them too. One difference: the
artifact's `get_comp_time` takes that max over all three of its types' thread counts, so a type the placement does
not use can still count when its threads are non-zero; ours takes it over the types the placement uses.

Interpolation is ours: linear in the batch between the two nearest measured batches and linear in ESTs per device
between measured values, never outside the measured range (a lookup there raises `ProfileLookupError` naming
application, type and value; the artifact extrapolates in the batch with scipy's interp1d). The artifact measured
one EST per device only and took a device's time for k ESTs as k × that step time: profiles loaded from its
`logs.json` say so (`constant_in_ests`), so any number of ESTs per device is inside their range.

Two sources: a tidy table (our `easyscale-profile` points: columns application, device_type, batch_per_est,
ests_per_device, step_time_s, host) and the artifact's `profiles_dir`: one folder per application holding
`logs.json` = {"<batch>": {"step1": [{"total_time": s}, ...one per device type in the order v100, p100, t4],
"proposals": [...]}} (applications.py `Application._preprocess_the_logs`; "proposals" is not used).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ddlrepro.host.errors import UserError
from ddlrepro.host.simulator.cluster import Placement
from ddlrepro.host.simulator.parsing import parse_number

if TYPE_CHECKING:
    import pandas as pd

TIDY_COLUMNS = ["application", "device_type", "batch_per_est", "ests_per_device", "step_time_s", "host"]
ARTIFACT_TYPES = ("v100", "p100", "t4")  # the order of `step1` in the artifact's logs.json
ARTIFACT_HOST = "the EasyScale artifact's logs.json"
ANY_ESTS = (1, 1 << 30)  # the ESTs per device a profile constant in ESTs covers: any number


class ProfileError(UserError):
    """A profile table or folder that cannot be read."""


class ProfileLookupError(UserError):
    """A step time asked for outside what a profile measured."""


@dataclass
class Profiles:
    """Measured step times: {(application, device type): {batch: {ESTs per device: seconds}}}."""

    times: dict[tuple[str, str], dict[int, dict[int, float]]]
    hosts: tuple[str, ...]
    constant_in_ests: bool = False
    _cache: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False, compare=False)

    def applications(self) -> set[str]:
        return {application for application, _ in self.times}

    def device_types(self, application: str) -> set[str]:
        return {device_type for app, device_type in self.times if app == application}

    def batches(self, application: str) -> list[int]:
        """The batches measured on every device type the application was profiled on."""
        sets = [set(by_batch) for (app, _), by_batch in self.times.items() if app == application]
        return sorted(set.intersection(*sets)) if sets else []

    def batch_range(self, application: str, device_type: str) -> tuple[int, int] | None:
        """The smallest and largest measured per-EST batch (None: not profiled on this type)."""
        by_batch = self.times.get((application, device_type))
        return (min(by_batch), max(by_batch)) if by_batch else None

    def ests_range(self, application: str, device_type: str, batch: int) -> tuple[int, int] | None:
        """The ESTs per device a lookup may ask for at this batch (None: not profiled there)."""
        by_batch = self.times.get((application, device_type))
        if not by_batch or not min(by_batch) <= batch <= max(by_batch):
            return None
        if self.constant_in_ests:
            return ANY_ESTS
        spans = [(min(by_batch[b]), max(by_batch[b])) for b in self._bracket(by_batch, batch)]
        return max(low for low, _ in spans), min(high for _, high in spans)

    @staticmethod
    def _bracket(by_batch: dict[int, dict[int, float]], batch: int) -> tuple[int, ...]:
        measured = sorted(by_batch)
        index = bisect.bisect_left(measured, batch)
        if measured[index] == batch:
            return (batch,)
        return measured[index - 1], measured[index]

    def memoised(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """`compute()`, once per key for these profiles (what follows from them never changes)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def step_time(self, application: str, device_type: str, batch: int, ests_per_device: int) -> float:
        """Seconds of one EST's step with `ests_per_device` ESTs on a device of this type."""
        key = ("step_time", application, device_type, batch, ests_per_device)
        return cast("float", self.memoised(key, lambda: self._lookup(application, device_type, batch, ests_per_device)))

    def _lookup(self, application: str, device_type: str, batch: int, ests_per_device: int) -> float:
        by_batch = self.times.get((application, device_type))
        where = f"application {application!r}, device type {device_type!r}"
        if not by_batch:
            raise ProfileLookupError(f"no profile for {where}")
        if not min(by_batch) <= batch <= max(by_batch):
            raise ProfileLookupError(
                f"{where}: batch_per_est {batch} is outside the measured {min(by_batch)}–{max(by_batch)}"
            )
        bracket = self._bracket(by_batch, batch)
        times = [self._at_ests(by_batch[b], ests_per_device, f"{where}, batch_per_est {b}") for b in bracket]
        if len(bracket) == 1:
            return times[0]
        low, high = bracket
        return times[0] + (times[1] - times[0]) * (batch - low) / (high - low)

    def _at_ests(self, by_ests: dict[int, float], ests: int, where: str) -> float:
        if self.constant_in_ests:
            return by_ests[min(by_ests)]
        measured = sorted(by_ests)
        if not measured[0] <= ests <= measured[-1]:
            raise ProfileLookupError(
                f"{where}: ests_per_device {ests} is outside the measured {measured[0]}–{measured[-1]}"
            )
        index = bisect.bisect_left(measured, ests)
        if measured[index] == ests:
            return by_ests[ests]
        low, high = measured[index - 1], measured[index]
        return by_ests[low] + (by_ests[high] - by_ests[low]) * (ests - low) / (high - low)

    def global_step_s(self, application: str, batch: int, ests: int, placement: Placement) -> float:
        """Seconds per global step of `ests` ESTs: max over the devices running any (Placement.processes) of step
        time × the ESTs it runs."""
        return max(
            self.step_time(application, device_type, batch, held) * held
            for held, device_type in placement.processes(ests)
        )

    def throughput(self, application: str, batch: int, ests: int, placement: Placement) -> float:
        """Samples per second of a job of `ests` ESTs at `batch` per EST on `placement`."""
        return batch * ests / self.global_step_s(application, batch, ests, placement)


def from_table(table: pd.DataFrame, source: str = "profile table") -> Profiles:
    """Profiles from a tidy table (TIDY_COLUMNS), every value checked; errors name the row (or, where the table has
    a `point_id` column, the run it came from) and the column."""
    missing = [column for column in TIDY_COLUMNS if column not in table.columns]
    if missing:
        raise ProfileError(f"{source}: missing column(s) {missing}; a profile table has {TIDY_COLUMNS}")
    times: dict[tuple[str, str], dict[int, dict[int, float]]] = {}
    hosts = set()
    columns = [*TIDY_COLUMNS, "point_id"] if "point_id" in table.columns else TIDY_COLUMNS
    for row, record in enumerate(table[columns].to_dict("records"), start=1):
        place = f"{source} run {record['point_id']}" if "point_id" in record else f"{source} row {row}"
        where = f"{place}, column"
        application = _name(record["application"], f"{where} application")
        device_type = _name(record["device_type"], f"{where} device_type")
        hosts.add(_name(record["host"], f"{where} host"))
        batch = _positive_int(record["batch_per_est"], f"{where} batch_per_est")
        ests = _positive_int(record["ests_per_device"], f"{where} ests_per_device")
        seconds = _positive_float(record["step_time_s"], f"{where} step_time_s")
        by_ests = times.setdefault((application, device_type), {}).setdefault(batch, {})
        if ests in by_ests:
            raise ProfileError(
                f"{place}: a second step time for {application}, {device_type}, "
                f"batch_per_est {batch}, ests_per_device {ests}"
            )
        by_ests[ests] = seconds
    if not times:
        raise ProfileError(f"{source}: no profile points")
    return Profiles(times, tuple(sorted(hosts)))


def read_table(path: Path) -> Profiles:
    if not path.is_file():
        raise ProfileError(f"profile table {path} does not exist")
    import pandas as pd

    return from_table(pd.read_csv(path), str(path))


def read_artifact_dir(folder: Path, device_types: Sequence[str] = ARTIFACT_TYPES) -> Profiles:
    """The artifact's `profiles_dir`: <folder>/<application>/logs.json, one step time per device type and batch."""
    paths = sorted(folder.glob("*/logs.json")) if folder.is_dir() else []
    if not paths:
        raise ProfileError(f"profiles_dir {folder}: no <application>/logs.json in it")
    times: dict[tuple[str, str], dict[int, dict[int, float]]] = {}
    for path in paths:
        try:
            logs = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ProfileError(f"{path}: not JSON ({error})") from None
        for batch_key, entry in logs.items():
            steps = entry.get("step1") if isinstance(entry, dict) else None
            where = f"{path}, batch {batch_key!r}, field step1"
            if not isinstance(steps, list) or len(steps) != len(device_types):
                raise ProfileError(
                    f"{where}: expected a list of {len(device_types)} entries ({', '.join(device_types)})"
                )
            batch = _positive_int(batch_key, f"{path}, batch {batch_key!r}")
            for device_type, step in zip(device_types, steps, strict=True):
                seconds = _positive_float(
                    step.get("total_time") if isinstance(step, dict) else None, f"{where}.total_time"
                )
                times.setdefault((path.parent.name, device_type), {})[batch] = {1: seconds}
    return Profiles(times, (ARTIFACT_HOST,), constant_in_ests=True)


def read_profiles(path: Path) -> Profiles:
    """A tidy CSV table, or the artifact's profiles_dir when `path` is a folder."""
    return read_artifact_dir(path) if path.is_dir() else read_table(path)


def _positive_int(value: object, where: str) -> int:
    return int(parse_number(value, where, ProfileError, minimum=1, whole=True))


def _positive_float(value: object, where: str) -> float:
    return parse_number(value, where, ProfileError, minimum=0, above=True)


def _name(value: object, where: str) -> str:
    """A name cell of a profile table: pandas reads an empty one as NaN, which must not become the name 'nan'."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip():
        raise ProfileError(f"{where}: empty")
    return str(value).strip()
