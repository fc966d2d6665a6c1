"""Shared helpers: the repository, tiny points, and running Snakemake on a private copy of the workflow."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ddlrepro.host.cpuquota import CpuQuotas
from ddlrepro.host.figures import FIGURES
from ddlrepro.host.hostload import read_host_cpu
from ddlrepro.host.redaction import forget_registered
from ddlrepro.host.run import HOROVOD_MISSING, horovod_importable
from ddlrepro.points import Point

# A suite started in the background of a shell without job control (`make test &`, a CI step) inherits SIGINT
# ignored, and so would every process a test starts; the tests that press Ctrl-C need it as a terminal leaves it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
LEAKY_SITE = REPO / "tests" / "leaky"  # a sitecustomize that prints credentials from inside the ranks
WORKFLOW_PARTS = [
    "Snakefile",
    "workflow",
    "src",
    "config",
    "profiles",
    "envs",
    "tests/configs",
    "containers",
    "scripts",
    "pyproject.toml",
]


# What a test needs beyond the environment, for `make test-fast` (-m "not slurm and not image and not horovod and
# not slow"): the Slurm cluster (tests using the `cluster` fixture), a built image (`base_image`), the project's
# Horovod build (every test whose name or parameter names Horovod).
NEEDS = {"slurm": {"cluster"}, "image": {"base_image"}}


# `make test` runs the tests not marked `serial` on two pytest-xdist workers, then the `serial` ones alone. A worker
# takes a whole module at a time (its module-scoped fixtures are set up once), and the modules that share one
# machine-wide resource together: the Slurm cluster's fixed ports, munge and slurm.conf. (pytest-xdist's own
# `xdist_group` marks do not group under pytest 9, whose node ids they can no longer rewrite.)
SHARED_RESOURCE = {"test_slurm.py": "slurm", "test_multinode.py": "slurm"}
# The longest modules first (a worker left with one of them at the end would run it alone); the rest as collected.
LONGEST_FIRST = ["test_multinode.py", "test_slurm.py", "test_containers.py", "test_parameter_server.py"]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleAndSharedResource(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SHARED_RESOURCE.get(Path(module).name, module)

    return ByModuleAndSharedResource(config, log)


HOST_CPU_KEY = pytest.StashKey[tuple[float, float]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[HOST_CPU_KEY] = (time.monotonic(), read_host_cpu()[0])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """How busy the machine's cores were over this pass (every process's CPU, from /proc/stat): a suite that
    keeps them all busy can only get faster by doing less work (issue `performance`, the suite's speed)."""
    if HOST_CPU_KEY not in config.stash or hasattr(config, "workerinput"):
        return
    started, busy_at_start = config.stash[HOST_CPU_KEY]
    wall = time.monotonic() - started
    busy, _, cpus = read_host_cpu()
    used = busy - busy_at_start
    line = f"host CPU over this pass: {used / 60:.1f} core-minutes busy of {cpus * wall / 60:.1f} ({cpus} cores)"
    terminalreporter.write_line(f"{line}: {100 * used / (cpus * wall):.0f} % busy")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for marker, needed in NEEDS.items():
            if fixtures & needed:
                item.add_marker(marker)
        if "horovod" in item.name.lower():
            item.add_marker("horovod")
            if not horovod_importable():  # `make horovod` could not build it for this user (scripts/horovod: 3)
                item.add_marker(pytest.mark.skip(reason=f"Horovod {HOROVOD_MISSING}"))


ONE_WORKER_COUNT_DLAAS = ("dlaas-scaling/efficiency-vs-host-ceiling-at-2-workers", "dlaas-scaling/two-workers-faster")


def gathered_references(folder: Path | None = None) -> Path:
    """Every figure's references in one file (in `folder`, else a fresh temporary one), as rule gather_references
    writes it."""
    import tempfile

    from ddlrepro.host.checks import figure_references, references_text

    out = Path(folder or tempfile.mkdtemp(prefix="references-")) / "references.yaml"
    out.write_text(references_text(figure_references()))
    return out


def checks_excluding(*references: str) -> str:
    """A `checks:` section excluding `references` beside tiny.yaml's own (a later config file replaces a list)."""
    tiny = yaml.safe_load((REPO / "tests" / "configs" / "tiny.yaml").read_text())["checks"]["exclude"]
    return yaml.safe_dump({"checks": {"exclude": [*tiny, *references]}})


def only_figures(sections: Mapping[str, Mapping | str]) -> dict[str, dict]:
    """A `figures` section enabling just `sections` (figure id → overrides, a mapping or a YAML flow mapping)."""
    overrides = {
        figure: yaml.safe_load(value) if isinstance(value, str) else dict(value) for figure, value in sections.items()
    }
    return {
        figure: {"enabled": True, **overrides[figure]} if figure in overrides else {"enabled": False}
        for figure in FIGURES
    }


def only(workdir: Path, name: str, sections: Mapping[str, Mapping | str], checks: str = "") -> str:
    """Config file `name` in `workdir` enabling just `sections` (see only_figures), then a `checks` section."""
    (workdir / name).write_text(yaml.safe_dump({"figures": only_figures(sections)}) + checks)
    return name


@pytest.fixture(autouse=True)
def _forget_registered_secrets() -> Iterator[None]:
    """A token one test registers is redacted in that test only, not in every later test of the process."""
    yield
    forget_registered()


def assert_refused(config: Mapping, figure: str, change: Mapping, message: str) -> None:
    """`config` with `change` in `figure`'s section is refused with a ConfigError matching `message`, by the schema
    or, for what it cannot say, as the workflow expands the points (before any job)."""
    import copy

    from ddlrepro.host.config import ConfigError, validate_config
    from ddlrepro.host.figures import figure_points

    changed = copy.deepcopy(dict(config))
    changed["figures"][figure].update(change)
    with pytest.raises(ConfigError, match=message):
        validate_config(changed)
        figure_points(changed)


def as_replicates(summary: pd.DataFrame, count: int = 3) -> pd.DataFrame:
    """A summary as `count` identical replicates (column `replicate`): a timing claim is judged over replicates."""
    return pd.concat([summary.assign(replicate=replicate) for replicate in range(count)], ignore_index=True)


def output_of_throttled(script: str, quotas: CpuQuotas | None) -> str:
    """What a fresh `python -c script` prints, run in rank 0's CPU-quota group of `quotas` (host/cpuquota.py) when
    given: the script waits for a line on stdin, so it joins the group before doing anything."""
    waiting = f"import sys\nsys.stdin.readline()\n{script}"
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    process = subprocess.Popen([sys.executable, "-c", waiting], **pipes)
    if quotas:
        quotas.join(0, process.pid)
    out, _ = process.communicate("go\n", timeout=60)
    return out


def tiny_point(workers: int = 2, figure: str = "kungfu-fig9", **params) -> Point:
    """A throughput point that runs in a few seconds on one core per worker."""
    defaults = {
        "model": "resnet20",
        "batch_size": 8,
        "warmup_batches": 1,
        "iterations": 2,
        "batches_per_iteration": 1,
        "backend": "auto",
        "sample_interval_s": 0.2,
    }
    return Point(figure, "throughput", workers, 1, {**defaults, **params})


def copy_workflow(target: Path, commit: bool = False, parts: list[str] = WORKFLOW_PARTS) -> Path:
    """A private copy of the workflow (optionally a git repository with one commit, as a user's clone is)."""
    for part in parts:
        source, destination = REPO / part, target / part
        if source.is_dir():
            shutil.copytree(source, destination, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    if commit:
        git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-C", str(target)]
        (target / ".gitignore").write_text("results/\n.snakemake/\n")
        for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
            subprocess.run([*git, *command], check=True, capture_output=True)
    return target


@pytest.fixture
def workflow_copy(tmp_path: Path) -> Path:
    """A private copy of the workflow, so tests may edit code and config without touching the repository."""
    return copy_workflow(tmp_path)


NO_SLURM_CLUSTER = REPO / "tests" / "data" / "no-slurm-cluster.conf"


def workflow_environment(workdir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a test starts Snakemake in (the workflow edits none): this venv's `python` first on PATH for
    the jobs, and `workdir`'s own src/ first on PYTHONPATH, so that the workflow and its jobs run the copy's code.
    A `base` naming no Slurm cluster (SLURM_CONF) runs as outside any: Slurm's commands fail at once (the Slurm
    plugin's query on every Snakemake start waits 9 s for a stopped controller) and `launcher.name: auto` is local.
    """
    base = dict(os.environ if base is None else base)
    if "SLURM_CONF" not in base:
        base.pop("SLURM_JOB_ID", None)
        base["SLURM_CONF"] = str(NO_SLURM_CLUSTER)
    return {
        **base,
        "PATH": os.pathsep.join(filter(None, [str(BIN), base.get("PATH")])),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(workdir / "src"), base.get("PYTHONPATH")])),
    }


def snakemake(workdir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run Snakemake in `workdir` (its own Snakefile) and return the finished process, output captured."""
    return subprocess.run(
        [SNAKEMAKE, "--cores", "2", *args],
        cwd=workdir,
        env=workflow_environment(workdir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def planned_jobs(dry_run_output: str) -> dict[str, int]:
    """The `Job stats` table of a dry run as {rule: count} (empty when there is nothing to do)."""
    counts: dict[str, int] = {}
    lines = dry_run_output.splitlines()
    if "Job stats:" not in lines:
        return counts
    for line in lines[lines.index("Job stats:") + 3 :]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def results_layout_tree() -> str:
    """The tree of docs/results-layout.md (its first code block)."""
    return (REPO / "docs" / "results-layout.md").read_text().split("```")[1]


def documented_results() -> list[re.Pattern[str]]:
    """The paths docs/results-layout.md's tree names, as patterns: `<name>` is any one path part, a trailing `/`
    everything under it."""
    patterns = []
    for line in results_layout_tree().splitlines():
        for word in line.split():
            if not word.startswith("results/"):
                break
            path = re.sub(r"<[^>]+>", "[^/]+", re.escape(word.rstrip(",")))  # re.escape leaves < and > as they are
            patterns.append(re.compile(path + (".*" if path.endswith("/") else "")))
    return patterns


def documented_run_entries() -> set[str]:
    """The files and folders docs/results-layout.md says a run folder holds (`log.txt`, `attempts/`, `pods/`)."""
    entry = results_layout_tree().split("results/runs/<figure>/<point-id>/", 1)[1].split("\nresults/", 1)[0]
    return {name.rstrip("/").split("/")[0] for name in re.findall(r"(?<![\w-])[a-z][a-z_-]*(?:\.[a-z]+|/)", entry)}


def undocumented_results(workdir: Path) -> list[str]:
    """Files under workdir/results that docs/results-layout.md does not name (in a run folder: by their name)."""
    patterns, run_entries = documented_results(), documented_run_entries()
    assert len(patterns) >= 15, f"docs/results-layout.md's tree gave only {len(patterns)} paths"
    assert {"result.json", "log.txt", "attempts"} <= run_entries, run_entries
    assert (workdir / "results").is_dir(), f"no results folder in {workdir}"
    found = [path.relative_to(workdir).as_posix() for path in (workdir / "results").rglob("*") if path.is_file()]
    unnamed = [path for path in found if not any(pattern.fullmatch(path) for pattern in patterns)]
    in_runs = [path for path in found if path.startswith("results/runs/") and path.count("/") >= 4]
    return sorted(unnamed + [path for path in in_runs if path.split("/")[4] not in run_entries])


def spawn_gloo(function, world: int, tmp_path: Path, *args) -> list:
    """Run `function(rank, *args)` on `world` gloo processes; return what each rank returned."""
    import torch
    import torch._dynamo  # DDP and the optimizers import it: once here, not in every forked rank
    import torch.multiprocessing as mp

    from ddlrepro.host.launchers.local import free_loopback_port

    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_loopback_port()
    # Forked, the ranks start with this process's torch: a fresh interpreter each takes seconds on 2 cores
    mp.start_processes(
        _gloo_rank, args=(function, world, port, str(tmp_path), args), nprocs=world, join=True, start_method="fork"
    )
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]


def _gloo_rank(rank: int, function, world: int, port: int, out_dir: str, args: tuple) -> None:
    import os

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(function(rank, *args), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    # Leave without interpreter finalisation: under CPU load torch's C++ teardown (seen after DDP communication
    # hooks) sometimes aborts in it, with no Python frame left ("terminate called without an active exception"),
    # after everything the test checks has been saved.
    os._exit(0)


def written_forms(value: str) -> set[bytes]:
    """The ways code writes a string (spelt out here, independently of ddlrepro.host.redaction), as UTF-8."""
    forms = {value, repr(value)[1:-1], ascii(value)[1:-1], html.escape(value)}
    forms |= {shlex.quote(value), shlex.quote(f"{value}'")[1:-5]}  # alone, and inside a longer quoted word
    forms |= {json.dumps(value, ensure_ascii=ensure_ascii)[1:-1] for ensure_ascii in (True, False)}
    forms |= {urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}
    return {form.encode() for form in forms}
