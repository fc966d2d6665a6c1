"""Consistent elastic training with BatchNorm and dropout: D1's whole state (parameters, momentum, every EST's
buffers and RNG) is bitwise identical for every placement and across checkpoints; D0's is not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO

from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.figures import figure_points
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point
from ddlrepro.rank.checkpoints import load_checkpoint
from ddlrepro.rank.easyscale import SyntheticImages, est_ranges, fold
from ddlrepro.rank.models import build_model
from ddlrepro.rank.workloads.consistent import CHECKPOINT

STEPS = 4


def consistent(placement: list[int], mode: str = "D1", steps: int = STEPS, **extra) -> Point:
    """A job of 4 ESTs of a model with BatchNorm and dropout (each EST has its own buffers and dropout RNG)."""
    params = {"model": "smallnet", "logical_workers": 4, "placement": placement, "mode": mode, "batch_size": 4}
    params |= {"steps": steps, "learning_rate": 0.05, "backend": "gloo", "sample_interval_s": 1.0, **extra}
    return Point("easyscale-fig9", "consistent", len(placement), 1, params)


def losses(run_dir: Path) -> list[float]:
    records = metric_records(run_dir)
    return [r["value"] for r in sorted(records, key=lambda r: r.get("step") or 0) if r["metric"] == "loss"]


def job_state(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the job's final checkpoint, by name: parameters, momentum, and each EST's BatchNorm buffers,
    dropout RNG and augmentation generator (the model's own buffers are only the last EST rank 0 switched out)."""
    checkpoint = load_checkpoint(run_dir / CHECKPOINT)
    parameter_names = [name for name, _ in build_model("smallnet").named_parameters()]
    state = {f"parameter {name}": checkpoint["model"][name] for name in parameter_names}
    momentum = checkpoint["optimizer"]["state"]
    state |= {f"momentum {name}": momentum[index]["momentum_buffer"] for index, name in enumerate(parameter_names)}
    for est in checkpoint["ests"]:
        state |= {f"EST {est['index']} buffer {name}": buffer for name, buffer in est["buffers"].items()}
        state |= {f"EST {est['index']} dropout RNG": est["rng"], f"EST {est['index']} augmentation": est["augment"]}
    return state


def differing(first: Path, second: Path) -> list[str]:
    """The names of the tensors whose bits differ between two runs' final states."""
    one, other = job_state(first), job_state(second)
    assert one.keys() == other.keys()
    return [name for name in one if not torch.equal(one[name], other[name])]


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
        "D0-P4": consistent([1, 1, 1, 1], mode="D0"),
        "D0-P1": consistent([4], mode="D0"),
        first.id: first,
    }
    plans["resumed"] = consistent([2, 1, 1], steps=2, resume_from=first.id)
    for name, point in plans.items():
        run_point(point, folder / name, local_launcher(300))
    return folder


def test_the_model_has_batchnorm_and_dropout() -> None:
    kinds = {type(module) for module in build_model("smallnet").modules()}
    assert {torch.nn.BatchNorm2d, torch.nn.Dropout} <= kinds


@pytest.mark.slow
def test_d1_state_is_bitwise_identical_for_every_placement(runs: Path) -> None:
    """Parameters, momentum and every EST's BatchNorm buffers and RNG states, bit for bit, not just the losses."""
    reference = losses(runs / "P4")
    assert len(reference) == STEPS
    assert len(job_state(runs / "P4")) == 2 * 8 + 4 * (2 * 3 + 2)  # 8 parameters; 4 ESTs × (2 BatchNorms × 3 + 2)
    for name in ("P2", "P1", "uneven"):
        assert differing(runs / "P4", runs / name) == [], name
        assert losses(runs / name) == reference, name


@pytest.mark.slow
def test_ests_keep_their_own_batchnorm_buffers_and_dropout_rng(runs: Path) -> None:
    state = job_state(runs / "P1")
    for name in ("buffer features.1.running_mean", "dropout RNG", "augmentation"):
        assert not torch.equal(state[f"EST 0 {name}"], state[f"EST 1 {name}"]), name


@pytest.mark.slow
def test_d1_survives_a_checkpoint_between_placements(runs: Path) -> None:
    first = next(path for path in runs.iterdir() if path.name.startswith("smallnet-np4-"))
    assert losses(first) + losses(runs / "resumed") == losses(runs / "P4")
    assert differing(runs / "P4", runs / "resumed") == []


def order_free_names(state: dict[str, torch.Tensor]) -> list[str]:
    """The state that no floating-point sum feeds: each EST's RNG states (counts of draws) and batch counts."""
    return [name for name in state if name.endswith(("dropout RNG", "augmentation", "num_batches_tracked"))]


@pytest.mark.slow
def test_d0_differs_across_placements_only_where_summation_order_reaches(runs: Path) -> None:
    """D0 in one process folds the ESTs in order; across 4 processes gloo's all-reduce sums in its own order: the
    parameters and momentum differ in their last bits, and so may the ESTs' BatchNorm running
    statistics (computed with those parameters); each EST's dropout RNG, augmentation generator and batch count
    may not (D0 still switches them per EST)."""
    changed = differing(runs / "D0-P4", runs / "D0-P1")
    order_free = order_free_names(job_state(runs / "D0-P1"))
    assert len(order_free) == 4 * (2 + 2)  # 4 ESTs × (dropout RNG, augmentation, 2 BatchNorms' batch counts)
    assert not set(changed) & set(order_free), sorted(set(changed) & set(order_free))
    assert any(name.startswith("parameter") for name in changed)


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["P4", "P2", "uneven", "P1"])
def test_d1_is_plain_ddp_bit_for_bit(runs: Path, placement: str) -> None:
    """EasyScale's claim as its artifact states it: D1's training is 4-worker DDP's (gloo), whatever the placement;
    the steps cross DDP's bucket rebuild after the first one."""
    assert losses(runs / "ddp") == losses(runs / placement)
    ddp, d1 = job_state(runs / "ddp"), job_state(runs / placement)
    parameters = [name for name in d1 if name.startswith("parameter")]
    assert parameters and [name for name in parameters if not torch.equal(ddp[name], d1[name])] == []


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
        stages = [
            p
            for p in points
            if p.params["mode"] == mode and p.params["run"] == "elastic" and "device_types" not in p.params
        ]
        assert [p.params["placement"] for p in stages] == [[1, 1, 1, 1], [2, 2], [2, 1, 1]]
        assert [p.params["resume_from"] for p in stages] == [None, stages[0].id, stages[1].id]
        assert {p.threads_per_worker for p in stages} == {1}
