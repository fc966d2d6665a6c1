"""A point's launch (host/launch.py): one typed value the launchers, run_point and the rules read instead of the
workload's params (issue 38 item 1)."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import REPO, tiny_point

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import FIGURES, figure_points
from ddlrepro.host.launch import Launch, TestbedHosts, launch_of
from ddlrepro.points import Point

# The params a launch is made of: only host/launch.py (and the figures, which write them) may read them.
LAUNCH_KEYS = {
    "framework",
    "horovod_controller",
    "backend",
    "elastic",
    "initial_workers",
    "standby",
    "testbed_hosts",
    "network",
    "link_rate",
    "traffic",
    "data_source",
    "resume_from",
    "checkpoint_interval",
    "dataset",
    "environment",
    "environment_kind",
    "container",
    "neighbour",
    "device_types",
    "placement",
}
READERS = [
    *sorted((REPO / "src" / "ddlrepro" / "host" / "launchers").rglob("*.py")),
    REPO / "src" / "ddlrepro" / "host" / "run.py",
    REPO / "src" / "ddlrepro" / "host" / "environments.py",
    REPO / "src" / "ddlrepro" / "host" / "figures" / "__init__.py",
    *sorted((REPO / "workflow" / "rules").glob("*.smk")),
]


@pytest.mark.parametrize(
    ("params", "ranks"),
    [
        ({"framework": "torch"}, "ranks"),
        ({"framework": "horovod"}, "horovod-gloo"),
        ({"framework": "horovod", "horovod_controller": "mpi"}, "mpirun"),
        ({"backend": "mpi"}, "mpirun"),
        ({"framework": "tensorflow"}, "ranks"),
    ],
)
def test_how_the_ranks_start(params: dict, ranks: str) -> None:
    launch = launch_of(tiny_point(workers=2, **params))
    assert launch.ranks == ranks
    assert launch.tensorflow_cluster == (params.get("framework") == "tensorflow")
    assert launch.horovod_build == (params.get("framework") == "horovod")
    assert (launch.runtime, launch.peak_workers, launch.testbed, launch.data_source) == (None, 2, None, "synthetic")


def test_an_elastic_launch_counts_its_standbys_and_largest_cluster() -> None:
    params = {"elastic": "inplace", "initial_workers": 1, "standby": 2, "schedule": "10:2,20:4,30:0"}
    launch = launch_of(tiny_point(workers=1, **params))
    assert (launch.runtime, launch.peak_workers) == ("inplace", 4)
    assert launch_of(tiny_point(workers=1, **params | {"schedule": "10:2,30:0"})).peak_workers == 3


def test_a_testbed_launch_and_a_bad_value_named_by_its_key() -> None:
    params = {"testbed_hosts": 3, "network": "overlay", "link_rate": "1gbit", "traffic": {"connections": 2}}
    launch = launch_of(tiny_point(workers=2, **params))
    assert launch.testbed == TestbedHosts(3, "overlay", "1gbit", {"connections": 2}) and launch.needs_namespaces
    for key, value in (("elastic", "hovercraft"), ("data_source", "tape"), ("network", "carrier-pigeon")):
        with pytest.raises(ValueError, match=f"^{key} '{value}': not one of"):
            launch_of(tiny_point(workers=2, testbed_hosts=3, **{key: value}))


def test_every_smoke_point_of_every_figure_has_a_launch() -> None:
    smoke = figure_points(load_config(REPO / "config" / "config.yaml"))
    launches = {(figure, point.id): launch_of(point) for figure, points in smoke.items() for point in points.values()}
    assert {figure for figure, _ in launches} == set(FIGURES)
    assert {launch.ranks for launch in launches.values()} == {"ranks", "horovod-gloo", "mpirun"}
    assert {launch.runtime for launch in launches.values()} == {None, "inplace", "torchrun", "ddp"}
    assert any(launch.testbed for launch in launches.values())
    environments = {launch.environment.kind for launch in launches.values() if launch.environment}
    assert environments == {"slurm", "container"}  # biggan-profiles' runs
    points = {(figure, point.id): point for figure, by_id in smoke.items() for point in by_id.values()}
    assert all(len(launches[key].rank_variables) == point.workers for key, point in points.items())
    typed = [key for key, launch in launches.items() if any(launch.rank_variables)]
    assert typed and {figure for figure, _ in typed} <= {"easyscale-fig9", "easyscale-fig14", "easyscale-fig13"}


def test_no_launcher_or_rule_reads_a_launch_key_from_the_params() -> None:
    """The contract: launchers, run_point and the rules read a point's launch, never these params themselves."""
    pattern = re.compile(r"params(?:\.get\(|\[)\s*[\"'](\w+)[\"']")
    found = [
        f"{path.relative_to(REPO)}: params {key!r}"
        for path in READERS
        for key in pattern.findall(path.read_text())
        if key in LAUNCH_KEYS
    ]
    assert found == []


def test_the_launch_module_imports_no_torch() -> None:
    tree = ast.parse((REPO / "src" / "ddlrepro" / "host" / "launch.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] == "torch"}
    assert isinstance(launch_of(Point("x", "throughput", 1, 1)), Launch)
