"""KungFu Fig 4: the adaptive batch policy's exact decisions (scripted noise scales), the in-place batch change on
real gloo ranks, the bad input refused before any job, and `snakemake kungfu_fig4` end to end."""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, snakemake, spawn_gloo

from ddlrepro.host.config import ConfigError, load_config, validate_config
from ddlrepro.host.figures import figure_points, waiting_for_data
from ddlrepro.rank import datasets
from ddlrepro.rank.adaptation.batch import AdaptiveBatchPolicy, learning_rate, starting_rate

TINY = ["--configfile", "tests/configs/tiny.yaml"]
RUNS = ["small", "large", "adaptive"]


def schedule(policy: AdaptiveBatchPolicy, ratios_per_epoch: list[list[float]]) -> list[int]:
    """The batch after each epoch, fed noise scales whose ratio to the current batch is as scripted."""
    batches = []
    for epoch, ratios in enumerate(ratios_per_epoch, start=1):
        for ratio in ratios:
            policy.observe(-ratio * policy.batch_size if epoch % 2 else ratio * policy.batch_size)
        batches.append(policy.end_epoch(epoch))
    return batches


def cycles_of_rising_noise(rule: str) -> list[int]:
    """The batch after each of 10 cycles of 100 steps fed the noise scale 100 + t, starting at 32 (the issue's)."""
    policy = AdaptiveBatchPolicy(batch_size=32, cap=1024, cycle_epochs=1, rule=rule)
    batches = []
    for cycle in range(10):
        for step in range(100 * cycle, 100 * cycle + 100):
            policy.observe(100 + step)
        batches.append(policy.end_epoch(cycle + 1))
    return batches


def test_the_fork_rule_compares_with_the_first_cycles_end_and_first_grows_after_the_second() -> None:
    """luomai/models@osdi20 kungfu_policy.py:113-130: history[-1] / history[0], history[0] the EMA at the end of
    the run's first cycle. By hand: after cycle 1 the EMA is ≈ 199/32 = 6.2, after cycle 2 ≈ 299/32 = 9.3: ×1.5."""
    assert cycles_of_rising_noise("fork") == [32, 48, 65, 82, 99, 116, 133, 149, 166, 183]
    assert cycles_of_rising_noise("per-cycle") == [60, 60, 80, 80, 96, 96, 109, 109, 121, 121]


def test_policy_gives_the_exact_batch_schedule() -> None:
    """Rule per-cycle, weight 0.5 so the schedule can be followed by hand; each cycle's first is its EMA after its
    own first step.
    EMA 10 (first) → 15 (20), growth 1.5, B 4 → 6; 30 → 22.5 (first), 60 clipped at 45 → 33.75, growth 1.5, B 9 (the
    old cycle's 15 as first would give 2.25, clamped: 12); 1s clipped, the EMA falls, B stays; then 1.5× per
    cycle up to the cap."""
    policy = AdaptiveBatchPolicy(batch_size=4, cap=20, cycle_epochs=1, ema_weight=0.5, rule="per-cycle")
    huge = [1e6, 1e6]
    assert schedule(policy, [[10, 20], [30, 60], [1, 1], huge, huge, huge, huge]) == [6, 9, 9, 13, 19, 20, 20]


def test_policy_keeps_the_batch_a_multiple_of_the_micro_batches() -> None:
    policy = AdaptiveBatchPolicy(batch_size=8, cap=62, cycle_epochs=1, ema_weight=0.5, multiple=4, rule="per-cycle")
    huge = [1e6, 1e6]
    assert schedule(policy, [[10, 20], huge, huge, huge, huge, huge]) == [12, 16, 24, 36, 52, 60]  # 54, 62: rounded


def test_policy_grows_at_most_twofold_per_cycle_and_only_at_its_end() -> None:
    policy = AdaptiveBatchPolicy(batch_size=32, cap=1024, cycle_epochs=3, rule="per-cycle")  # EMA weight 0.9
    rising = [[1.05 ** (20 * epoch + k) for k in range(20)] for epoch in range(3)]
    assert schedule(policy, rising) == [32, 32, 64]  # the EMA rises ≈ ×10 over the cycle: clamped to 2


@pytest.mark.parametrize("rule", ["fork", "per-cycle"])
def test_policy_never_shrinks_nor_exceeds_the_cap(rule: str) -> None:
    rng = random.Random(4)
    for _ in range(50):
        policy = AdaptiveBatchPolicy(rng.randint(1, 8), rng.randint(8, 100), cycle_epochs=2, rule=rule)
        ratios = [[rng.lognormvariate(0, 2) * rng.choice([-1, 1]) for _ in range(5)] for _ in range(30)]
        batches = [policy.batch_size, *schedule(policy, ratios)]
        assert batches == sorted(batches) and max(batches) <= policy.cap


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"batch_size": 64, "cap": 32}, "cap 32"),
        ({"batch_size": 8, "cap": 32, "cycle_epochs": 0}, "at least 1 epoch"),
        ({"batch_size": 8, "cap": 32, "ema_weight": 1.0}, "strictly between 0 and 1"),
        ({"batch_size": 6, "cap": 32, "multiple": 4}, "not a multiple of 4"),
        ({"batch_size": 8, "cap": 32, "rule": "linear"}, "unknown batch rule 'linear'"),
    ],
)
def test_policy_refuses_bad_settings(arguments: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        AdaptiveBatchPolicy(**arguments)


def test_learning_rate_rules() -> None:
    assert learning_rate("fixed", 0.1, 32, 1024) == 0.1
    assert learning_rate("linear", 0.1, 32, 64) == pytest.approx(0.2)
    assert starting_rate(0.05, None, 1024) == 0.05
    assert starting_rate(0.1, 128, 32) == pytest.approx(0.025)  # the fork's small and adaptive runs
    assert starting_rate(0.1, 128, 1024) == pytest.approx(0.8)  # its large run


def test_weight_decay_leaves_batch_norm_out() -> None:
    """As the fork's L2 loss, which skips its `batch_normalization` variables (resnet_run_loop.py:360-367)."""
    from ddlrepro.rank.models import build_model
    from ddlrepro.rank.workloads.adaptive_batch import decay_groups

    module = build_model("resnet20")
    decayed, kept = decay_groups(module, 2e-4)
    norms = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert (decayed["weight_decay"], kept["weight_decay"]) == (2e-4, 0.0)
    assert len(kept["params"]) == 2 * len(norms) > 0
    assert len(decayed["params"]) + len(kept["params"]) == len(list(module.parameters()))


def process_identity() -> tuple[int, float]:
    """This process's id and start time: a restarted rank differs in one or both."""
    import psutil

    return os.getpid(), psutil.Process().create_time()


def _train_across_a_change(rank: int, out_dir: str) -> dict:
    """Two steps at batch 8, an in-place change to batch 24 (linear rule), two more steps. The rank's process
    identity is filed before the change, so a process that replaced it could not report the old one."""
    from ddlrepro.rank.runtime import RankContext
    from ddlrepro.rank.workloads.adaptive_batch import AdaptiveBatchTrainer

    ctx = RankContext(rank, 2, rank, 2, 1, "gloo", torch.device("cpu"))
    params = {"dataset": "digits", "model": "digitsnet", "batch_size": 8, "cap": 32, "adaptive": True, "seed": 0}
    params |= {"test_fraction": 0.25, "learning_rate": 0.05, "momentum": 0.9, "lr_rule": "linear"}
    params |= {"cycle_epochs": 1, "ema_weight": 0.9, "noise_scale_alpha": 0.9, "micro_batches": 4}
    params |= {"monitor_interval": 1, "batch_rule": "fork", "lr_reference_batch": None, "weight_decay": 0.0}
    params |= {"noise_scale_aggregation": "pooled"}
    trainer = AdaptiveBatchTrainer(params, ctx)
    noise, shapes = [], []
    batches = trainer.epoch_batches(1)
    for change in (None, 24):
        if change:
            (Path(out_dir) / f"before{rank}.json").write_text(json.dumps(process_identity()))
            trainer.set_batch_size(change)
            batches = trainer.epoch_batches(2)
        for _ in range(2):
            images, labels = next(batches)
            shapes.append(len(labels))
            noise.append(trainer.step(images, labels)[1])
        if change is None:
            before = trainer.parameters_vector()
    rate = trainer.optimizer.param_groups[0]["lr"]
    return {
        "before": before,
        "after": trainer.parameters_vector(),
        "noise": noise,
        "shapes": shapes,
        "lr": rate,
        "process": process_identity(),
    }


def test_batch_change_in_place_keeps_every_ranks_parameters_equal(tmp_path: Path) -> None:
    first, second = spawn_gloo(_train_across_a_change, 2, tmp_path, str(tmp_path))
    assert first["shapes"] == second["shapes"] == [8, 8, 24, 24]
    assert torch.equal(first["before"], second["before"]) and torch.equal(first["after"], second["after"])
    assert not torch.equal(first["before"], first["after"])  # it trained at the new batch
    assert first["noise"] == second["noise"]  # the policy's input is bit-identical on every rank
    assert first["lr"] == pytest.approx(0.05 * 24 / 8)
    for rank, result in enumerate([first, second]):  # no restart: the process before the change is the one after
        assert tuple(json.loads((tmp_path / f"before{rank}.json").read_text())) == result["process"]


@pytest.fixture
def section() -> tuple[dict, dict]:
    config = load_config(REPO / "config" / "config.yaml")
    return config, config["figures"]["kungfu-fig4"]


def refused(config: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
        figure_points(config)
    return str(caught.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cap": 4}, "figures.kungfu-fig4.cap: 4 is below the starting batch_size 8"),
        ({"cap": 1024}, "figures.kungfu-fig4.cap: 1024 × 2 workers exceeds the 1347 training samples"),
        ({"ema_weight": 1.0}, "figures.kungfu-fig4.ema_weight: 1.0 is greater than or equal to the maximum of 1"),
        ({"noise_scale_alpha": 0}, "figures.kungfu-fig4.noise_scale_alpha: 0 is less than or equal to the minimum"),
        ({"cycle_epochs": 0}, "figures.kungfu-fig4.cycle_epochs: 0 is less than the minimum of 1"),
        ({"dataset": "cifar10", "model": "resnet56"}, "figures.kungfu-fig4.micro_batches: 1 was expected"),
        (
            {"dataset": "cifar10"},
            "figures.kungfu-fig4.model: 'digitsnet' is not valid; valid values: resnet20, resnet56",
        ),
        ({"model": "resnet56"}, "figures.kungfu-fig4.model: 'digitsnet' was expected"),
    ],
)
def test_bad_input_is_refused_naming_the_key(section: tuple[dict, dict], change: dict, message: str) -> None:
    config, figure = section
    figure.update(change)
    assert message in refused(config)


def test_missing_cifar10_files_make_the_figure_wait_and_bad_ones_are_refused(
    section: tuple[dict, dict], tmp_path: Path
) -> None:
    """A folder without all six batches: the figure is skipped naming the first missing file (the workflow plans
    the others), or fetched with `download`; six files, one too small: refused before any job."""
    config, figure = section
    figure.update(dataset="cifar10", model="resnet56", micro_batches=1, data_dir=str(tmp_path))
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"]:
        with open(tmp_path / name, "wb") as handle:
            handle.truncate(30_730_000)
    waiting = waiting_for_data(validate_config(copy.deepcopy(config)))
    assert f"{tmp_path / 'test_batch'}: missing" in waiting["kungfu-fig4"] and "download=True" in waiting["kungfu-fig4"]
    assert "kungfu-fig4" not in figure_points(validate_config(copy.deepcopy(config)))
    assert waiting_for_data(validate_config(copy.deepcopy(config) | {"download": True})) == {}
    (tmp_path / "test_batch").write_bytes(b"\0" * 1000)
    assert "1000 bytes, too small for 10,000 CIFAR-10 images" in refused(config)


def test_digits_are_read_as_scikit_learn_loads_them() -> None:
    from sklearn.datasets import load_digits

    pixels, labels = load_digits(return_X_y=True)
    read_pixels, read_labels = datasets.digit_pixels()
    assert np.array_equal(read_pixels, pixels) and np.array_equal(read_labels, labels)
    assert read_labels.dtype == np.int64 and read_pixels.shape == (datasets.DIGITS_SAMPLES, 64)


@pytest.mark.slow
def test_snakemake_kungfu_fig4_end_to_end(workflow_copy: Path) -> None:
    enabled = workflow_copy / "fig4.yaml"
    enabled.write_text("figures:\n  kungfu-fig4: {enabled: true}\n")
    built = snakemake(workflow_copy, "kungfu_fig4", *TINY, str(enabled))
    assert built.returncode == 0, built.stderr[-3000:]
    results = workflow_copy / "results"
    assert (results / "figures" / "kungfu-fig4.png").stat().st_size > 0
    summary = pd.read_csv(results / "tables" / "kungfu-fig4.summary.csv").set_index("run")
    assert list(summary.index) == ["small", "large", "adaptive"]
    assert list(summary["start_batch"]) == [8, 32, 8] and (summary["max_batch"] <= 32).all()
    checks = pd.read_csv(results / "checks" / "kungfu-fig4.tsv", sep="\t").set_index("check")
    assert summary.loc["adaptive", "final_batch"] > summary.loc["adaptive", "start_batch"]  # the policy acted
    table = pd.read_csv(results / "tables" / "kungfu-fig4.csv")
    accuracies = {run: list(table[(table["run"] == run) & (table["metric"] == "accuracy")]["value"]) for run in RUNS}
    assert accuracies["adaptive"] != accuracies["small"]
    assert checks.loc["batch-never-shrinks", "status"] == "pass"
    assert checks.loc["batch-within-cap", "status"] == "pass"
    assert len(checks) == 5
