"""Online monitors compute the right thing, in real 2-process gloo runs, and leave training unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import spawn_gloo
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.rank.monitors import Ema, GradientMonitor, NoiseScaleEstimator

WORLD = 2


# Linear regression y = x·w* + ε, x ~ N(0, I_d), ε ~ N(0, σ²), loss ½·mean((x·w − y)²), evaluated at w = w* + δ.
# Per-sample gradient g = (x·δ − ε)·x: true gradient G = δ, tr Cov(g) = (d + 1)|δ|² + d·σ².
DIM, SIGMA, BATCH, STEPS = 10, 1.0, 64, 1500


def noise_scale_run(rank: int) -> dict:
    torch.manual_seed(1000 + rank)
    delta = torch.full((DIM,), 1 / math.sqrt(DIM))
    model = DistributedDataParallel(nn.Linear(DIM, 1, bias=False))
    with torch.no_grad():
        model.module.weight.copy_(delta)  # w* = 0, so w − w* = δ
    monitor = GradientMonitor("noise-scale", 1, BATCH, WORLD)
    monitor.attach(model)
    gradient_ema, trace_ema = [], []
    for _ in range(STEPS):
        x = torch.randn(BATCH, DIM)
        y = SIGMA * torch.randn(BATCH)
        model.zero_grad()
        (0.5 * (model(x).squeeze(1) - y).square().mean()).backward()
        monitor.end_step()
        gradient_ema.append(monitor.noise_scale.gradient_ema.value)
        trace_ema.append(monitor.noise_scale.trace_ema.value)
    return {"gradient_ema": gradient_ema, "trace_ema": trace_ema}


def test_noise_scale_matches_closed_form(tmp_path: Path) -> None:
    truth_gradient_sq = 1.0
    truth_trace = (DIM + 1) * 1.0 + DIM * SIGMA**2
    results = spawn_gloo(noise_scale_run, WORLD, tmp_path)
    assert results[0] == results[1]
    mean_gradient = sum(results[0]["gradient_ema"]) / STEPS
    mean_trace = sum(results[0]["trace_ema"]) / STEPS
    assert mean_gradient == pytest.approx(truth_gradient_sq, rel=0.10)
    assert mean_trace == pytest.approx(truth_trace, rel=0.10)
    assert mean_trace / mean_gradient == pytest.approx(truth_trace / truth_gradient_sq, rel=0.10)


def small_network() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)


def variance_run(rank: int) -> dict:
    """The monitor's value beside the variance computed directly from every worker's gathered gradient."""
    torch.manual_seed(0)
    reference = small_network()
    model = DistributedDataParallel(small_network(), bucket_cap_mb=0.0001)  # several buckets
    model.module.load_state_dict(reference.state_dict())
    monitor = GradientMonitor("variance", 1, 8, WORLD)
    monitor.attach(model)
    measured, expected = [], []
    for step in range(3):
        x, y = batch(rank, step)
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        measured.append(monitor.end_step()[1])
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        total = 0.0
        for parameter in reference.parameters():
            gathered = [torch.empty_like(parameter.grad) for _ in range(WORLD)]
            dist.all_gather(gathered, parameter.grad)
            stacked = torch.stack(gathered).double()
            total += float((stacked.square().mean(0) - stacked.mean(0).square()).norm())
        expected.append(total)
    return {"measured": measured, "expected": expected}


def test_variance_equals_variance_of_gathered_gradients(tmp_path: Path) -> None:
    results = spawn_gloo(variance_run, WORLD, tmp_path)
    assert results[0]["measured"] == results[1]["measured"]
    assert results[0]["measured"] == pytest.approx(results[0]["expected"], rel=1e-5)
    assert all(value > 0 for value in results[0]["measured"])


def training_run(rank: int, kind: str, interval: int, world: int) -> dict:
    torch.manual_seed(0)
    model = DistributedDataParallel(small_network(), bucket_cap_mb=0.0001)
    if kind != "none":
        monitor = GradientMonitor(kind, interval, 8, world)
        monitor.attach(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step in range(6):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if kind != "none":
            monitor.end_step()
    return {name: tensor.clone() for name, tensor in model.module.state_dict().items()}


@pytest.fixture(scope="module", params=[2, 3], ids=["2-workers", "3-workers"])
def plain_training(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Unmonitored training at 2 and 3 workers (at 3, gloo's all-reduce sums three operands: order matters)."""
    return spawn_gloo(training_run, request.param, tmp_path_factory.mktemp("plain"), "none", 1, request.param)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "interval"), [("noise-scale", 1), ("variance", 1), ("variance", 4)])
def test_monitoring_does_not_change_training(plain_training, tmp_path: Path, kind: str, interval: int) -> None:
    world = len(plain_training)
    monitored = spawn_gloo(training_run, world, tmp_path, kind, interval, world)
    for rank in range(world):
        for name, tensor in plain_training[rank].items():
            assert torch.equal(tensor, monitored[rank][name]), (rank, name)


def test_noise_scale_formulas_and_ema() -> None:
    estimator = NoiseScaleEstimator(batch_small=8, batch_big=16, alpha=0.6)
    gradient_sq, trace = estimator.estimates(small_sq=3.0, big_sq=2.0)
    assert gradient_sq == pytest.approx((16 * 2.0 - 8 * 3.0) / 8)
    assert trace == pytest.approx((3.0 - 2.0) / (1 / 8 - 1 / 16))
    assert estimator.update(3.0, 2.0) == pytest.approx(trace / gradient_sq)
    ema = Ema(0.6)
    assert ema.update(10.0) == 10.0
    assert ema.update(20.0) == pytest.approx(0.6 * 10 + 0.4 * 20)


def test_monitor_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="valid monitors: none, noise-scale, variance"):
        GradientMonitor("curvature", 1, 8, 2)
    with pytest.raises(ValueError, match="interval must be >= 1"):
        GradientMonitor("variance", 0, 8, 2)
    with pytest.raises(ValueError, match="at least 2 workers"):
        GradientMonitor("noise-scale", 1, 8, 1)
