"""Synthetic-data training throughput, the Horovod / tf_cnn_benchmarks / KungFu protocol, in three frameworks.

Random images and labels generated once; `warmup_batches` untimed; then `iterations` timed iterations of
`batches_per_iteration` batches each. Per iteration every rank records img/s = batch × batches / elapsed; rank 0
prints `RESULT: <mean> +-<1.96·std> {...}` over its iterations (population std), as the original benchmarks do.

`framework` (default torch) chooses what trains: `torch` (DDP, gradients averaged with `strategy`, see
strategies.py), `horovod` (horovod.torch's DistributedOptimizer, as Horovod's synthetic benchmark; its ring
all-reduce over gloo or MPI) or `tensorflow` (Keras model, MultiWorkerMirroredStrategy with its RING collective,
custom training loop: see tensorflow_trainer.py). The protocol and records are the same for all three.

`settings` (torch only): several settings of the same workload (each a dict of parameters over the point's, e.g.
`{monitor: variance, monitor_interval: 8}`, `{data_source: s3}`, `{network: bridge}`) trained side by side in the
same processes, one model each from the same seed, taking turns iteration by iteration (the order rotated every
iteration), as benchmarks/monitor_overhead.py does: the machine's drift and noise hit them alike, so a ratio
between two of them is paired. A setting's data reader reads only in its turn; a setting's network is the
interface its model's gradients go over (testbed hosts). Every record carries its `setting` label.

`independent` (torch only): every rank trains its own plain model, no gradient exchange: the same number of
processes on the same host(s) as a data-parallel run, nothing but their own compute. Its per-worker rate is the
host's parallel ceiling, what data-parallel efficiency is judged against at smoke scale (two busy cores of a small
VM each run slower than one, whatever the communication).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.rank.models import MODELS, build_model
from ddlrepro.rank.monitors import GradientMonitor
from ddlrepro.rank.runtime import RankContext, network_group, optimizer_libraries
from ddlrepro.rank.shards import PrefetchingReader, reader
from ddlrepro.rank.strategies import apply_strategy
from ddlrepro.rank.workloads.frameworks import FRAMEWORKS, LEARNING_RATE, Trainer
from ddlrepro.records import emit, say


def torch_parameter_sum(model: nn.Module) -> Callable[[], float]:
    return lambda: float(sum(parameter.detach().double().sum() for parameter in model.parameters()))


def synthetic_batch(
    model: str, batch_size: int, image_size: int | None, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images in the model's input shape and random labels in [0, classes); for a model that reads tokens,
    random token ids and random span (start, end) positions."""
    info = MODELS[model]
    generator = torch.Generator().manual_seed(seed)
    if info.tokens is not None:
        tokens = torch.randint(
            0, info.tokens.vocab_size, (batch_size, info.tokens.sequence_length), generator=generator
        )
        starts = torch.randint(0, info.tokens.sequence_length, (batch_size,), generator=generator)
        ends = torch.minimum(
            starts + torch.randint(0, 30, (batch_size,), generator=generator),
            starts.new_tensor(info.tokens.sequence_length - 1),
        )
        return tokens.to(device), torch.stack([starts, ends], dim=1).to(device)
    side = image_size or info.image_size
    images = torch.randn(batch_size, 3, side, side, generator=generator)
    labels = torch.randint(0, info.num_classes, (batch_size,), generator=generator)
    return images.to(device), labels.to(device)


def make_train_step(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One SGD step of softmax cross-entropy on the fixed batch; returns the (unsynchronised) loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step


def make_streaming_train_step(
    model: nn.Module, next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> Callable[[], torch.Tensor]:
    """One SGD step on the next batch a data source delivers (`data_source` other than synthetic)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    def step() -> torch.Tensor:
        images, labels = next_batch()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        return loss

    return step


def data_train_step(
    model: nn.Module, params: dict[str, Any], ctx: RankContext
) -> tuple[Callable[[], torch.Tensor], PrefetchingReader | None]:
    """The training step on the point's `data_source` (the rank's fixed synthetic batch, or shards read ahead on a
    thread), and the reader of those shards (None for synthetic data)."""
    if params.get("data_source", "synthetic") == "synthetic":
        images, labels = synthetic_batch(
            params["model"], params["batch_size"], params.get("image_size"), ctx.device, seed=ctx.rank
        )
        return make_train_step(model, images, labels), None
    shards = reader(params, ctx.rank, ctx.world_size)
    return make_streaming_train_step(model, shards.next, ctx.device), shards


def mean_and_confidence(rates: list[float]) -> tuple[float, float]:
    """Mean and 1.96 × population standard deviation, the protocol's error bar."""
    values = np.asarray(rates, dtype=float)
    return float(values.mean()), float(1.96 * values.std())


def data_parallel(model: nn.Module, ctx: RankContext, network: str | None = None) -> nn.Module:
    """DDP across the workers (over `network`'s interface on testbed hosts, see `network_group`); a single worker
    trains the plain model, as single-device baselines do.

    (DDP over one process still buckets and all-reduces every gradient: ~5 % of a small model's step on a CPU.)
    """
    if ctx.world_size == 1:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, process_group=network_group(network))


def attach_monitor(model: nn.Module, params: dict[str, Any], ctx: RankContext) -> GradientMonitor | None:
    """The configured online monitor (`monitor`, `monitor_interval`, `noise_scale_alpha`,
    `noise_scale_aggregation`), if any."""
    kind = params.get("monitor", "none")
    if kind == "none":
        return None
    if not isinstance(model, DistributedDataParallel):
        raise ValueError(f"monitor {kind!r} needs at least 2 workers: it compares local and all-reduced gradients")
    monitor = GradientMonitor(
        kind,
        params["monitor_interval"],
        params["batch_size"],
        ctx.world_size,
        params["noise_scale_alpha"],
        aggregation=params["noise_scale_aggregation"],
    )
    monitor.attach(model)
    return monitor


def torch_trainer(params: dict[str, Any], ctx: RankContext) -> Trainer:
    """DDP (plain model on one worker), gradients averaged with the point's strategy, optionally monitored."""
    torch.manual_seed(params.get("seed", 0))
    model = build_model(params["model"]).to(ctx.device)
    trained = model if params.get("independent") else data_parallel(model, ctx, params.get("network"))
    strategy = params.get("strategy", "RING")
    if isinstance(trained, DistributedDataParallel):
        apply_strategy(trained, strategy, group_size=ctx.local_world_size)
    monitor = attach_monitor(trained, params, ctx)
    source = params.get("data_source", "synthetic")
    train_step, shards = data_train_step(trained, params, ctx)

    labelled = {"setting": params["setting"]} if "setting" in params else {}

    def step() -> torch.Tensor:
        loss = train_step()
        if monitor and monitor.end_step():
            for metric, value in monitor.measurements.items():
                emit("metric", rank=ctx.rank, step=monitor.step - 1, metric=metric, value=value, **labelled)
        return loss

    settings = {"framework": "torch", "strategy": strategy, "monitor": params.get("monitor", "none")}
    settings |= {"independent": True} if params.get("independent") else {}
    settings |= {"data_source": source} if source != "synthetic" else {}
    trainer = Trainer(step, lambda loss: float(loss.item()), torch_parameter_sum(model), settings)
    if shards is not None:
        trainer.close, trainer.pause, trainer.resume = shards.close, shards.pause, shards.resume
    return trainer


def horovod_trainer(params: dict[str, Any], ctx: RankContext) -> Trainer:
    """horovod.torch as in Horovod's pytorch_synthetic_benchmark.py: DistributedOptimizer, broadcast from rank 0."""
    import horovod.torch as hvd

    hvd.init()
    if (hvd.rank(), hvd.size()) != (ctx.rank, ctx.world_size):
        raise RuntimeError(
            f"Horovod sees rank {hvd.rank()} of {hvd.size()}, the launcher {ctx.rank} of {ctx.world_size}"
        )
    torch.manual_seed(params.get("seed", 0))
    model = build_model(params["model"]).to(ctx.device)
    images, labels = synthetic_batch(
        params["model"], params["batch_size"], params.get("image_size"), ctx.device, seed=ctx.rank
    )
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LEARNING_RATE), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    controller = "mpi" if hvd.mpi_enabled() and params.get("horovod_controller") == "mpi" else "gloo"
    settings = {"framework": "horovod", "strategy": "RING", "controller": controller}
    return Trainer(step, lambda loss: float(loss.item()), torch_parameter_sum(model), settings, hvd.shutdown)


def make_trainer(params: dict[str, Any], ctx: RankContext) -> Trainer:
    framework = params.get("framework", "torch")
    if framework != "torch" and params.get("data_source", "synthetic") != "synthetic":
        raise ValueError(f"data_source {params['data_source']!r} is read by the torch framework only, not {framework}")
    if framework == "tensorflow":
        from ddlrepro.rank.workloads.tensorflow_trainer import tensorflow_trainer

        return tensorflow_trainer(params, ctx)
    if framework == "horovod":
        return horovod_trainer(params, ctx)
    if framework == "torch":
        return torch_trainer(params, ctx)
    raise ValueError(f"unknown framework {framework!r}; valid frameworks: {', '.join(FRAMEWORKS)}")


def timed_iterations(trainer: Trainer, params: dict[str, Any], ctx: RankContext) -> list[float]:
    """The protocol: warm-up batches, then per timed iteration img/s (and the last loss) as metric records."""
    loss = None
    for _ in range(params["warmup_batches"]):
        loss = trainer.step()
    if loss is not None:
        trainer.loss_value(loss)  # waits for the warm-up steps to finish, whatever the framework
    ctx.synchronize()
    rates = []
    images_per_iteration = params["batch_size"] * params["batches_per_iteration"]
    for iteration in range(params["iterations"]):
        started = time.perf_counter()
        for _ in range(params["batches_per_iteration"]):
            loss = trainer.step()
        value = trainer.loss_value(loss)
        ctx.synchronize()
        elapsed = time.perf_counter() - started
        rates.append(images_per_iteration / elapsed)
        emit("metric", rank=ctx.rank, iteration=iteration, metric="img_per_sec", value=rates[-1])
        emit("metric", rank=ctx.rank, iteration=iteration, metric="loss", value=value)
    return rates


def setting_label(setting: dict[str, Any]) -> str:
    """What the records and the figure call a setting: its data source (`synthetic`, `s3`) or network (`bridge`,
    `overlay`), or its monitor, `none` or `<monitor>@<interval>` (`variance@8`)."""
    for key in ("data_source", "network"):
        if key in setting:
            return str(setting[key])
    monitor = setting.get("monitor", "none")
    return monitor if monitor == "none" else f"{monitor}@{setting['monitor_interval']}"


def run_paired(params: dict[str, Any], ctx: RankContext) -> None:
    """The point's `settings` side by side: warm-up for each, then per timed iteration each setting's batches in
    turn (the order rotated by one every iteration), img/s recorded per setting."""
    if params.get("framework", "torch") != "torch":
        raise ValueError("`settings` (paired settings in one process) are for the torch framework only")
    trainers = {}
    for setting in params["settings"]:
        label = setting_label(setting)
        trainers[label] = make_trainer({**params, **setting, "setting": label}, ctx)
        trainers[label].pause()
    try:
        for trainer in trainers.values():
            with turn(trainer):
                loss = None
                for _ in range(params["warmup_batches"]):
                    loss = trainer.step()
                if loss is not None:
                    trainer.loss_value(loss)
        ctx.synchronize()
        rates = paired_iterations(trainers, params, ctx)
    finally:
        for trainer in trainers.values():
            trainer.close()
    if ctx.rank == 0:
        means = {label: mean_and_confidence(values)[0] for label, values in rates.items()}
        say(f"RESULT: {json.dumps(means)} img/s per worker by setting")
        emit("result", rank=0, img_per_sec_per_worker_by_setting=means)


@contextlib.contextmanager
def turn(trainer: Trainer) -> Iterator[None]:
    """The trainer's turn: its background work (a data reader) runs only inside it, so the reading a setting needs
    is timed with that setting, never with another."""
    trainer.resume()
    try:
        yield
    finally:
        trainer.pause()


def paired_iterations(trainers: dict[str, Trainer], params: dict[str, Any], ctx: RankContext) -> dict[str, list[float]]:
    """Per iteration, each setting's `batches_per_iteration` batches timed in turn, the order rotated by one."""
    labels = list(trainers)
    rates: dict[str, list[float]] = {label: [] for label in labels}
    images = params["batch_size"] * params["batches_per_iteration"]
    for iteration in range(params["iterations"]):
        shift = iteration % len(labels)
        for label in labels[shift:] + labels[:shift]:
            trainer, loss = trainers[label], None
            started = time.perf_counter()
            with turn(trainer):  # a fetch still under way at the turn's end is timed with it
                for _ in range(params["batches_per_iteration"]):
                    loss = trainer.step()
                value = trainer.loss_value(loss)
            ctx.synchronize()
            rates[label].append(images / (time.perf_counter() - started))
            emit(
                "metric",
                rank=ctx.rank,
                iteration=iteration,
                metric="img_per_sec",
                value=rates[label][-1],
                setting=label,
            )
            emit("metric", rank=ctx.rank, iteration=iteration, metric="loss", value=value, setting=label)
    return rates


def libraries(params: dict[str, Any]) -> tuple[str, ...]:
    """What the rank loads besides torch, imported before `run` while the collector waits (ddlrepro.startup)."""
    if params.get("framework", "torch") == "tensorflow":
        return ("ddlrepro.rank.workloads.tensorflow_trainer", "tensorflow")  # the former sets TF's log level
    return optimizer_libraries(params)


def run(params: dict[str, Any], ctx: RankContext) -> None:
    if "settings" in params:
        run_paired(params, ctx)
        return
    trainer = make_trainer(params, ctx)
    try:
        rates = timed_iterations(trainer, params, ctx)
        emit("metric", rank=ctx.rank, iteration=None, metric="parameter_sum", value=trainer.parameter_sum())
    finally:
        trainer.close()
    mean, confidence = mean_and_confidence(rates)
    if ctx.rank == 0:
        settings = {
            **trainer.settings,
            "np": ctx.world_size,
            "bs": params["batch_size"],
            "model": params["model"],
        }
        say(f"RESULT: {mean:.2f} +-{confidence:.2f} {json.dumps(settings)}")
        emit("result", rank=0, img_per_sec_per_worker=mean, confidence=confidence, total=mean * ctx.world_size)
