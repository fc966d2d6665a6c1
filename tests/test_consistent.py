"""Consistent elastic training: D1 is bitwise identical for every placement and across checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import REPO

from ddlrepro.config import ConfigError, load_config
from ddlrepro.consistent import SyntheticImages, est_ranges, fold
from ddlrepro.figures import figure_points
from ddlrepro.points import Point
from ddlrepro.run import run_point

STEPS = 4


def consistent(placement: list[int], mode: str = "D1", steps: int = STEPS, **extra) -> Point:
    params = {"model": "resnet20", "logical_workers": 4, "placement": placement, "mode": mode, "batch_size": 4}
    params |= {"steps": steps, "learning_rate": 0.05, "backend": "gloo", "sample_interval_s": 1.0, **extra}
    return Point("easyscale-fig9", "consistent", len(placement), 1, params)


def losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["value"] for r in sorted(records, key=lambda r: r.get("step") or 0) if r["metric"] == "loss"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every run the tests compare, in one folder (as the workflow files them)."""
    folder = tmp_path_factory.mktemp("easyscale")
    first = consistent([1, 1, 1, 1], steps=2)
    plans = {
        "P4": consistent([1, 1, 1, 1]),
        "P2": consistent([2, 2]),
        "P1": consistent([4]),
        "uneven": consistent([2, 1, 1]),
        "ddp": consistent([1, 1, 1, 1], mode="ddp"),
        first.id: first,
    }
    plans["resumed"] = consistent([2, 1, 1], steps=2, resume_from=first.id)
    for name, point in plans.items():
        run_point(point, folder / name, timeout_s=300)
    return folder


def test_d1_losses_are_bitwise_identical_for_every_placement(runs: Path) -> None:
    reference = losses(runs / "P4")
    assert len(reference) == STEPS
    for name in ("P2", "P1", "uneven"):
        assert losses(runs / name) == reference, name


def test_d1_survives_a_checkpoint_between_placements(runs: Path) -> None:
    first = next(path for path in runs.iterdir() if path.name.startswith("resnet20-np4-"))
    assert losses(first) + losses(runs / "resumed") == losses(runs / "P4")
    assert (first / "checkpoint.pt").exists()


def test_d1_matches_plain_ddp_within_float_tolerance(runs: Path) -> None:
    assert losses(runs / "ddp") == pytest.approx(losses(runs / "P4"), rel=1e-4)


def test_est_ranges_and_fold_order() -> None:
    assert est_ranges([2, 1, 1]) == [range(0, 2), range(2, 3), range(3, 4)]
    values = [torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8]), torch.tensor([1.0])]
    assert float(fold(values)) == float(((values[0] + values[1]) + values[2]) + values[3])


def test_samples_depend_only_on_their_index() -> None:
    data = SyntheticImages("resnet20", size=64, seed=3)
    image, label = data.sample(5)
    again, same_label = SyntheticImages("resnet20", size=64, seed=3).sample(5)
    assert torch.equal(image, again) and label == same_label
    assert sorted(data.index(position) for position in range(64)) == list(range(64))


@pytest.mark.parametrize(
    ("stages", "message"),
    [([[1, 1, 1, 1], [2, 1]], r"figures\.easyscale-fig9\.stages\[1\]: \[2, 1\] runs 3 ESTs, logical_workers is 4")],
)
def test_bad_stages_name_their_key(stages: list, message: str) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    config["figures"]["easyscale-fig9"]["stages"] = stages
    with pytest.raises(ConfigError, match=message):
        figure_points(config)


def test_elastic_stages_chain_through_checkpoints() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    points = list(figure_points(config)["easyscale-fig9"].values())
    for mode in ("D0", "D1"):
        stages = [p for p in points if p.params["mode"] == mode and p.params["run"] == "elastic"]
        assert [p.params["placement"] for p in stages] == [[1, 1, 1, 1], [2, 2], [2, 1, 1]]
        assert [p.params["resume_from"] for p in stages] == [None, stages[0].id, stages[1].id]
        assert {p.threads_per_worker for p in stages} == {1}
