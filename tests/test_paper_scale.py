"""Paper scale as the papers ran it: every paper-scale point takes config/paper.yaml's sourced values and none of
config/config.yaml's smoke sizes; the values the originals' code sets (issue 36 item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, planned_jobs, snakemake

from ddlrepro.host.checks import figure_references
from ddlrepro.host.config import ConfigError, folder_block, load_config, load_config_file, validate_config
from ddlrepro.host.figures import figure_points
from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers import check_points, configured_launcher
from ddlrepro.host.paper_settings import settings_page
from ddlrepro.rank import datasets
from ddlrepro.rank.adaptation.batch import starting_rate

SMOKE = REPO / "config" / "config.yaml"
PAPER = REPO / "config" / "paper.yaml"
BLOCK = folder_block("paper")


def paper_config(data_dir: Path, *files: Path) -> dict[str, Any]:
    """config.yaml then paper.yaml (as Snakemake reads them), with a CIFAR-10-sized folder and BigGAN images."""
    config = load_config(*files)
    config["figures"]["kungfu-fig4"]["data_dir"] = str(data_dir)
    config["figures"]["biggan-profiles"]["enabled"] = False  # its points need the user's images.npy
    return config


@pytest.fixture
def cifar_like(tmp_path: Path) -> Path:
    """Files of CIFAR-10's names and sizes (sparse): the paper points' data check and digest, no download."""
    for name in datasets.CIFAR10_FILES:
        with open(tmp_path / name, "wb") as handle:
            handle.truncate(datasets.CIFAR10_MIN_BYTES)
    return tmp_path


def test_paper_points_take_no_value_from_the_smoke_block(cifar_like: Path, tmp_path: Path) -> None:
    """Change every smoke size of every figure: the paper-scale points are the same ones, id for id."""
    changed_smoke = tmp_path / "changed-smoke.yaml"
    never_read = {figure: dict.fromkeys(section, "never read") for figure, section in folder_block("smoke").items()}
    changed_smoke.write_text(yaml.safe_dump({"smoke": never_read}))
    with_smoke = figure_points(paper_config(cifar_like, SMOKE, PAPER))
    assert with_smoke == figure_points(paper_config(cifar_like, SMOKE, changed_smoke, PAPER))
    assert sum(map(len, with_smoke.values())) > 100


def test_every_key_the_smoke_block_sets_the_paper_block_sets_with_its_source() -> None:
    """No paper-scale value is left to a default where the smoke scale chose one: each is a decision, sourced."""
    smoke = folder_block("smoke")
    missing = [f"{figure}.{key}" for figure, section in smoke.items() for key in section if key not in BLOCK[figure]]
    assert missing == []
    assert all(entry["source"].strip() for section in BLOCK.values() for entry in section.values())


def matches(value: Any, configured: Any) -> bool:
    """A point's parameter against its configured value: equal, or one value of a configured sweep."""
    return value == configured or (isinstance(configured, list) and value in configured)


DERIVED = {
    ("kungfu-fig4", "batch_size"): "the large run starts at the cap",
    ("kungfu-fig4", "epochs"): "the adaptive run trains adaptive_epochs",
    ("kungfu-fig6", "standby"): "runs of a fixed size have no standbys",
    ("kungfu-fig7", "standby"): "the torchrun modes have no standbys",
    ("easyscale-fig9", "steps"): "each stage's point trains its share of the steps",
    ("easyscale-fig12", "logical_workers"): "the DDP baseline's workers",
    ("easyscale-fig12", "batch_size"): "the DDP baseline's per-worker batch carries its ESTs' samples",
    ("easyscale-fig14", "device_types"): "the types' definitions (launcher.device_types) in place of their names",
}
"""Point parameters a figure computes from its section rather than copying one key (their figures' tests check
them); every other parameter named like a paper-block key must hold its value."""


def test_every_paper_point_parameter_is_the_paper_blocks_value(cifar_like: Path) -> None:
    points = figure_points(paper_config(cifar_like, SMOKE, PAPER))
    wrong = [
        f"{figure} {point.id}: {key} = {value!r}, paper {BLOCK[figure][key]['value']!r}"
        for figure, by_id in points.items()
        for point in by_id.values()
        for key, value in point.params.items()
        if key in BLOCK[figure] and (figure, key) not in DERIVED and not matches(value, BLOCK[figure][key]["value"])
    ]
    assert wrong == []
    runs = {point.params["run"]: point.params for point in points["kungfu-fig4"].values()}
    assert runs["large"]["batch_size"] == BLOCK["kungfu-fig4"]["cap"]["value"]
    assert runs["adaptive"]["epochs"] == BLOCK["kungfu-fig4"]["adaptive_epochs"]["value"]


def test_the_originals_values_at_paper_scale(cifar_like: Path) -> None:
    """The fork's rates (0.1 × B ÷ 128 from each run's start, constant), its every-step monitor and rule; KungFu's
    one-vote strategy switch; the provisioning artifact's window of 800 steps and α = 1/3."""
    figures = paper_config(cifar_like, SMOKE, PAPER)["figures"]
    fig4 = figures["kungfu-fig4"]
    assert (fig4["lr_rule"], fig4["monitor_interval"], fig4["batch_rule"], fig4["weight_decay"]) == (
        "fixed",
        1,
        "fork",
        2e-4,
    )
    small, large = (starting_rate(fig4["learning_rate"], fig4["lr_reference_batch"], b) for b in (32, 1024))
    assert (small, large) == (pytest.approx(0.025), pytest.approx(0.8))
    assert figures["kungfu-fig5"]["patience"] == 1
    assert (figures["kungfu-fig6"]["window_steps"], figures["kungfu-fig6"]["alpha"]) == (800, pytest.approx(1 / 3))


def test_an_unsourced_paper_value_is_refused_naming_its_key() -> None:
    config = load_config(SMOKE, PAPER)
    config["paper"] = {"kungfu-fig5": {"patience": 1}, "kungfu-fig6": {"alpha": {"value": 0.3, "source": " "}}}
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    assert "paper.kungfu-fig5.patience: must be {value: ..., source:" in str(caught.value)
    assert "paper.kungfu-fig6.alpha: its source must be a non-empty string" in str(caught.value)


def test_figures_overrides_the_active_scale_only() -> None:
    """A user's `figures:` wins over either block; the inactive block is dropped from the resolved config."""
    smoke = validate_config(load_config_file(SMOKE) | {"figures": {"kungfu-fig9": {"batch_size": 7}}})
    assert smoke["figures"]["kungfu-fig9"]["batch_size"] == 7 and smoke["figures"]["kungfu-fig9"]["image_size"] == 32
    paper = load_config(SMOKE, PAPER)
    assert "smoke" not in paper and paper["figures"]["kungfu-fig9"]["image_size"] == 224


def test_the_paper_settings_page_is_current() -> None:
    """docs/paper-scale.md is what `ddlrepro paper-settings --out docs/paper-scale.md` writes today."""
    assert (REPO / "docs" / "paper-scale.md").read_text() == settings_page(SMOKE, PAPER)


def test_the_scale_blocks_name_the_figures_the_workflow_has() -> None:
    """The schema's list of figure ids (what a block may name) is the workflow's figures and `figures`' sections."""
    from ddlrepro.host.config import config_schema
    from ddlrepro.host.figures import FIGURES

    schema = config_schema()
    ids = schema["$defs"]["figure_id"]["enum"]
    assert sorted(ids) == sorted(FIGURES) == sorted(schema["properties"]["figures"]["required"])
    assert sorted(folder_block("smoke")) == sorted(BLOCK) == sorted(ids)


@pytest.mark.parametrize("profile", [[], ["--profile", "profiles/slurm"]], ids=["local", "slurm"])
def test_a_paper_scale_dry_run_plans_and_names_what_it_skips(workflow_copy: Path, profile: list[str]) -> None:
    """The preview of paper scale (docs/running.md) on a 2-core machine without the data: every other figure is planned;
    the two waiting for data say what they need and how to get it; under the local launcher what would not fit
    is told, not refused (under Slurm everything fits)."""
    done = snakemake(workflow_copy, "-n", *profile, "--configfile", "config/paper.yaml", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kungfu-fig4 skipped: CIFAR-10's python batches are not in" in done.stderr
    assert "data_batch_1: missing): add --config download=True to fetch them" in done.stderr
    assert "biggan-profiles skipped: set figures.biggan-profiles.data_dir" in done.stderr
    assert ("would not run here: kungfu-fig5 point" in done.stderr) == (not profile)
    jobs = planned_jobs(done.stdout)
    assert jobs["run_point"] > 200 and "fetch_cifar10" not in jobs


def test_a_paper_scale_dry_run_with_download_plans_the_fetch_first(workflow_copy: Path) -> None:
    done = snakemake(
        workflow_copy,
        "-n",
        "kungfu_fig4",
        "--configfile",
        "config/paper.yaml",
        "--config",
        "download=True",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = planned_jobs(done.stdout)
    assert (jobs["fetch_cifar10"], jobs["run_point"]) == (1, 3 * 3)  # 3 runs × 3 replicates (thorough tier)


def test_an_unusual_cluster_shape_gets_slurm_requests_that_agree_with_every_point(cifar_like: Path) -> None:
    """8 nodes × 8 GPUs at paper scale: each point's sbatch request has a task per worker on as few nodes as hold
    them (no idle node), a GPU per task and each task's memory."""
    config = paper_config(cifar_like, SMOKE, PAPER)
    config["launcher"]["name"] = "slurm"
    config["launcher"]["slurm"] |= {"tasks_per_node": 8, "gpus_per_node": 8, "max_nodes": 8}
    launcher = configured_launcher(config)
    check_points(figure_points(config), launcher)  # every point fits 8 nodes
    points = [point for by_id in figure_points(config).values() for point in by_id.values()]
    assert max(point.workers for point in points) == 32
    for point in points:
        request = launcher.resources(point)
        nodes, per_node, tasks = request["nodes"], request["tasks_per_node"], request["tasks"]
        assert tasks == launch_of(point).peak_workers, point.id
        if launch_of(point).runtime is None:
            assert (nodes - 1) * per_node < tasks <= nodes * per_node and per_node == min(tasks, 8), point.id
            assert nodes * per_node == tasks or tasks < 8, point.id
        assert request["gres"] == f"gpu:{min(8, per_node)}", point.id
        assert request["mem_mb"] == 32000 * per_node, point.id
        assert request["slurm_extra"] == f"--ntasks-per-node={per_node}", point.id


def test_a_figure_waiting_for_data_lists_its_checks_as_skipped_saying_why() -> None:
    """checks.tsv keeps a verdict line for every claim: a figure skipped for its data lists each as skipped, why."""
    from ddlrepro.host.checks import collect_checks, headline

    references = figure_references()
    collected = collect_checks([], {"kungfu-fig4": "CIFAR-10's python batches are not in x"}, references)
    assert len(collected) == len(references["kungfu-fig4"]) and set(collected["status"]) == {"skipped"}
    assert collected["reason"].str.startswith("waiting: CIFAR-10's python batches").all()
    assert headline(collected).endswith(f"({len(collected)} skipped)")
