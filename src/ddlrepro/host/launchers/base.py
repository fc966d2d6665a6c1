"""The job model every launcher renders a point into, kept apart from the backends (as TorchX keeps an AppDef apart
from its schedulers): a `Launcher` built once from its options renders a point into a `JobSpec[Request]`, the exact
request it will make (processes, an srun line, manifests), then executes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

from ddlrepro.points import Point

if TYPE_CHECKING:
    from ddlrepro.host.rundir import OutputCollector

Request = TypeVar("Request")
CpuCounter = tuple[str, Callable[[], float] | None]


@dataclass(frozen=True)
class WorkerSpec:
    """One rank (or, with rank None, one command that starts every rank, as srun does): the command and the
    environment the launcher sets for it (never the caller's secrets)."""

    rank: int | None
    command: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class JobSpec(Generic[Request]):
    """A rendered job: saved as `jobspec.json` beside the run before anything starts (the launcher's name, the
    timeout, and its request's fields)."""

    launcher: str
    timeout_s: float
    request: Request

    def to_dict(self) -> dict[str, Any]:
        return {"launcher": self.launcher, "timeout_s": self.timeout_s, **asdict(self.request)}  # type: ignore[call-overload]  # every Request is a dataclass


class Options(Protocol):
    """A launcher's settings, built once from the validated config (defaults filled in by its schema)."""

    @property
    def timeout_s(self) -> float:
        """A run still going after this many seconds is stopped and fails."""
        ...

    @classmethod
    def from_config(cls, config: dict[str, Any], image: dict[str, Any] | None = None) -> Self:
        """From the config's `launcher` and `images` sections; `image`: the built image's record, if any."""
        ...


class Launcher(Protocol):
    """What the workflow and `run_point` need of a launcher. `elastic_runtimes`: the elastic runtimes (a point's
    `elastic` parameter: inplace, torchrun) it can host, a point needing another is refused at validation;
    `resource_names`: the names `resources()` gives (the run rule's resources; a launcher's options may decide
    them)."""

    name: ClassVar[str]
    elastic_runtimes: ClassVar[frozenset[str]]
    options_type: ClassVar[type[Options]]
    resource_names: tuple[str, ...]

    @property
    def options(self) -> Options:
        """Its settings (a launcher's own options type)."""
        ...

    def __init__(self, options: Any) -> None: ...

    def render(self, point: Point, run_dir: Path) -> JobSpec[Any]:
        """The exact job this launcher would start (nothing is started)."""
        ...

    def execute(self, spec: JobSpec[Any], output: OutputCollector) -> None:
        """Run the job to completion; raise RunFailed naming what failed."""
        ...

    def check_fits(self, point: Point) -> None:
        """Raise ConfigError if `point` cannot fit where this launcher would start it."""
        ...

    def host_cores(self, point: Point, workflow_cores: Callable[[], int]) -> int:
        """Cores the run takes on the machine Snakemake runs its job on (the rule's threads); `workflow_cores()`:
        the cores Snakemake was given (asked only when needed: a cluster profile gives none)."""
        ...

    def resources(self, point: Point) -> dict[str, Any]:
        """What the run asks a batch scheduler for (Slurm's allocation), by `resource_names`."""
        ...

    def own_cpu_counter(self, spec: JobSpec[Any]) -> CpuCounter:
        """How the run's own CPU time on this host is counted, and the counter (None: cannot be known here)."""
        ...


class RunFailed(RuntimeError):
    """A run did not complete: which rank failed (None if the whole job), how, and the tail of its stderr."""

    def __init__(self, rank: int | None, reason: str, stderr_tail: list[str]) -> None:
        self.rank = rank
        who = "the job" if rank is None else f"rank {rank}"
        tail = "\n".join(f"    {line}" for line in stderr_tail) or "    (no stderr)"
        super().__init__(f"{who} {reason}; last lines of its stderr:\n{tail}")
