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

from ddlrepro.rank.ema import Ema
from ddlrepro.rank.micro_batch_norms import MicroBatchNorms
from ddlrepro.rank.monitors import AGGREGATIONS, GradientMonitor, NoiseScaleEstimator
from ddlrepro.rank.strategies import hooked

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
    monitor = GradientMonitor("noise-scale", 1, BATCH, WORLD, alpha=0.6)
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


MICRO_BATCHES, SPREAD_STEPS, BURN_IN = (1, 4, 16), 300, 50


def micro_batch_run(rank: int) -> dict:
    """The same linear-regression batches measured with 1, 4 and 16 micro-batches per worker."""
    torch.manual_seed(1000 + rank)
    delta = torch.full((DIM,), 1 / math.sqrt(DIM))
    models, monitors = [], []
    for k in MICRO_BATCHES:
        model = DistributedDataParallel(nn.Linear(DIM, 1, bias=False))
        with torch.no_grad():
            model.module.weight.copy_(delta)
        monitor = GradientMonitor("noise-scale", 1, BATCH, WORLD, alpha=0.9, micro_batches=k)
        monitor.attach(model)
        models.append(model)
        monitors.append(monitor)
    values: dict[int, list[float]] = {k: [] for k in MICRO_BATCHES}
    for _ in range(SPREAD_STEPS):
        x = torch.randn(BATCH, DIM)
        y = SIGMA * torch.randn(BATCH)
        for k, model, monitor in zip(MICRO_BATCHES, models, monitors, strict=True):
            model.zero_grad()
            (0.5 * (model(x).squeeze(1) - y).square().mean()).backward()
            values[k].append(monitor.end_step()[1])
    return values


@pytest.mark.slow
def test_noise_scale_spread_shrinks_with_micro_batches(tmp_path: Path) -> None:
    """B_simple = tr(Σ)/|G|² = 21 here; more small-batch samples a step give a steadier estimate near it."""
    results = spawn_gloo(micro_batch_run, WORLD, tmp_path)
    assert results[0] == results[1]
    truth = (DIM + 1) + DIM * SIGMA**2
    spreads = []
    for k in MICRO_BATCHES:
        values = torch.tensor(results[0][k][BURN_IN:], dtype=torch.float64)
        spreads.append(float(values.std() / values.mean()))
        if k > 1:
            assert float(values.mean()) == pytest.approx(truth, rel=0.15), k
    # S's spread shrinks with the samples; |G|²'s own (≈ 4·GᵀΣG / (B·workers)) does not: the gain flattens.
    assert spreads[0] > 2 * spreads[1] and spreads[1] > spreads[2], spreads


def shares_network() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1, groups=2, bias=False),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 3),
    )


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_micro_batch_norms_equal_each_micro_batch_gradient(micro_batches: int) -> None:
    """Σ_m |c_m|² from the layer hooks equals that of each micro-batch's own backward (BatchNorm in eval mode:
    samples independent)."""
    torch.manual_seed(0)
    model = shares_network().double().eval()
    norms = MicroBatchNorms(model, micro_batches, lambda: True)
    norms.attach()
    x, y = torch.randn(8, 3, 8, 8, dtype=torch.float64), torch.randint(0, 3, (8,))
    F.cross_entropy(model(x), y).backward()
    measured = float(norms.take_small_squared())
    expected = 0.0
    for rows in torch.arange(8).chunk(micro_batches):
        model.zero_grad()
        (F.cross_entropy(model(x), y, reduction="none")[rows].sum() / 8).backward()
        expected += sum(float(p.grad.square().sum()) for p in model.parameters()) * micro_batches
    assert measured == pytest.approx(expected, rel=1e-9)


def test_micro_batch_norms_reject_unsupported_layers() -> None:
    with pytest.raises(ValueError, match="parameters in LayerNorm"):
        MicroBatchNorms(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)), 2, lambda: True)
    with pytest.raises(ValueError, match="BatchNorm2d in training mode couples them"):
        MicroBatchNorms(shares_network(), 2, lambda: True)


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
    monitor = GradientMonitor("variance", 1, 8, WORLD, alpha=0.6)
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


def first_estimates_run(rank: int, micro_batches: int) -> dict:
    """The monitor's first |G|² and S (an EMA starts at its first sample) beside those computed from every
    worker's micro-batch gradients and the mean gradient, gathered directly."""
    torch.manual_seed(0)
    reference = small_network()
    model = DistributedDataParallel(small_network(), bucket_cap_mb=0.0001)  # several buckets
    model.module.load_state_dict(reference.state_dict())
    monitor = GradientMonitor("noise-scale", 1, 8, WORLD, alpha=0.6, micro_batches=micro_batches)
    monitor.attach(model)
    x, y = batch(rank, 0)
    F.cross_entropy(model(x), y).backward()
    monitor.end_step()
    small = []
    for rows in torch.arange(8).chunk(micro_batches):
        reference.zero_grad()
        F.cross_entropy(reference(x[rows]), y[rows]).backward()
        small.append(sum(parameter.grad.double().square().sum() for parameter in reference.parameters()))
    small_sq = torch.stack(small).mean().reshape(1)
    dist.all_reduce(small_sq)
    big_sq = sum(float(parameter.grad.double().square().sum()) for parameter in model.module.parameters())
    expected = monitor.noise_scale.estimates(float(small_sq) / WORLD, big_sq)
    measured = (monitor.measurements["noise_scale_gradient_sq"], monitor.measurements["noise_scale_trace"])
    return {"measured": measured, "expected": expected}


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_noise_scale_estimates_from_gathered_gradients(tmp_path: Path, micro_batches: int) -> None:
    results = spawn_gloo(first_estimates_run, WORLD, tmp_path, micro_batches)
    assert results[0]["measured"] == results[1]["measured"]
    assert results[0]["measured"] == pytest.approx(results[0]["expected"], rel=1e-4)


def training_run(rank: int, kind: str, interval: int, world: int, micro_batches: int = 1) -> dict:
    torch.manual_seed(0)
    model = DistributedDataParallel(small_network(), bucket_cap_mb=0.0001)
    if kind != "none":
        monitor = GradientMonitor(kind, interval, 8, world, alpha=0.6, micro_batches=micro_batches)
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
@pytest.mark.parametrize(
    ("kind", "interval", "micro_batches"),
    [("noise-scale", 1, 1), ("noise-scale", 1, 4), ("variance", 1, 1), ("variance", 4, 1)],
)
def test_monitoring_does_not_change_training(
    plain_training, tmp_path: Path, kind: str, interval: int, micro_batches: int
) -> None:
    world = len(plain_training)
    monitored = spawn_gloo(training_run, world, tmp_path, kind, interval, world, micro_batches)
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
        GradientMonitor("curvature", 1, 8, 2, alpha=0.6)
    with pytest.raises(ValueError, match="interval must be >= 1"):
        GradientMonitor("variance", 0, 8, 2, alpha=0.6)
    with pytest.raises(ValueError, match="at least 2 workers"):
        GradientMonitor("noise-scale", 1, 8, 1, alpha=0.6)
    with pytest.raises(ValueError, match="divide the batch of 8, got 3"):
        GradientMonitor("noise-scale", 1, 8, 2, alpha=0.6, micro_batches=3)


def aggregated_run(rank: int, world: int) -> dict:
    """Each aggregation's noise scale over 3 steps beside every worker's estimator computed from the gathered local
    gradients and the all-reduced one (α 0.5)."""
    torch.manual_seed(0)
    reference = small_network()
    models, monitors = {}, {}
    for aggregation in AGGREGATIONS:
        models[aggregation] = DistributedDataParallel(small_network(), bucket_cap_mb=0.0001)
        models[aggregation].module.load_state_dict(reference.state_dict())
        monitors[aggregation] = GradientMonitor("noise-scale", 1, 8, world, 0.5, aggregation=aggregation)
        monitors[aggregation].attach(models[aggregation])
    workers = [NoiseScaleEstimator(8, 8 * world, 0.5) for _ in range(world)]
    pooled = NoiseScaleEstimator(8, 8 * world, 0.5)
    measured: dict[str, list[float]] = {aggregation: [] for aggregation in AGGREGATIONS}
    expected: dict[str, list[float]] = {aggregation: [] for aggregation in AGGREGATIONS}
    for step in range(3):
        x, y = batch(rank, step)
        for aggregation, model in models.items():
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            measured[aggregation].append(monitors[aggregation].end_step()[1])
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        local = torch.cat([parameter.grad.flatten() for parameter in reference.parameters()])
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        smalls = [float(g.double().square().sum()) for g in gathered]
        big = float(torch.stack(gathered).double().mean(0).square().sum())
        values = [estimator.update(small, big) for estimator, small in zip(workers, smalls, strict=True)]
        expected["per-worker"].append(values[rank])
        expected["mean-of-workers"].append(sum(values) / world)
        expected["pooled"].append(pooled.update(sum(smalls) / world, big))
    return {"measured": measured, "expected": expected}


def test_each_aggregation_from_gathered_gradients(tmp_path: Path) -> None:
    """pooled and mean-of-workers give every rank the same value; per-worker each rank its own (KungFu's library);
    each equals what every worker's gathered gradient gives."""
    results = spawn_gloo(aggregated_run, WORLD, tmp_path, WORLD)
    for rank, result in enumerate(results):
        for aggregation in AGGREGATIONS:
            assert result["measured"][aggregation] == pytest.approx(result["expected"][aggregation], rel=1e-6), (
                rank,
                aggregation,
            )
    assert results[0]["measured"]["pooled"] == results[1]["measured"]["pooled"]
    assert results[0]["measured"]["mean-of-workers"] == results[1]["measured"]["mean-of-workers"]
    assert results[0]["measured"]["per-worker"] != results[1]["measured"]["per-worker"]
    assert results[0]["measured"]["mean-of-workers"] != results[0]["measured"]["pooled"]


def hooked_then_monitored(rank: int, kind: str) -> str:
    """The error a monitor's attach raises on a model whose gradients a KungFu strategy already averages."""
    model = DistributedDataParallel(small_network())
    hooked(model, "STAR", group_size=2)
    try:
        GradientMonitor(kind, 1, 8, 2, alpha=0.6).attach(model)
    except ValueError as error:
        return str(error)
    return "attached"


@pytest.mark.parametrize("kind", ["noise-scale", "variance"])
def test_a_monitor_beside_a_strategys_hook_is_refused_naming_why(tmp_path: Path, kind: str) -> None:
    """Both monitors average the gradients in their own communication hook; DDP takes one hook."""
    (message, _) = spawn_gloo(hooked_then_monitored, 2, tmp_path, kind)
    assert message.startswith(f"the {kind} monitor averages the gradients in its own hook"), message
