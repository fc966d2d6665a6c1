"""Elastic training state (modules, optimizers, the global sample offset and the step count), shared by the in-place
workers (`inplace_worker.py`), the torchrun baseline (`torchrun_worker.py`) and the static-world baseline
(`ddp_worker.py`). Two trainers: a classifier of rank/models.py on `dataset_size` synthetic samples (images, or
token ids with span labels for the encoders), SGD with momentum; and, for `model: biggan`, the GAN of
rank/gan_models.py on the digits, Adam for each network.

Global step k trains samples [offset, offset + size × batch), rank r the slice [offset + r·batch, offset +
(r+1)·batch) (modulo the dataset). The offset continues across resizes, so no sample is skipped or repeated; every
rank prints a `ledger` record of the samples each of its steps trained. With `record_state`, every rank also prints
a digest of its state after each resize and at the stop (checked to be equal across ranks), and rank 0 saves its
final state to `final_state.pt`.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddlrepro import startup
from ddlrepro.rank import gan_models
from ddlrepro.rank.checkpoints import save_checkpoint
from ddlrepro.rank.ddp_arithmetic import gradient_of
from ddlrepro.rank.elastic import GAN_MODEL
from ddlrepro.rank.elastic.forkserver import FORKED_ENV
from ddlrepro.rank.models import build_model
from ddlrepro.rank.runtime import optimizer_libraries
from ddlrepro.rank.workloads.throughput import synthetic_batch
from ddlrepro.records import emit

MOMENTUM = 0.9
# Ours: the elastic figures (kungfu-fig6, kungfu-fig7, biggan-elasticity's classifier) measure resizing and
# throughput, not accuracy, and configure no rate; one SGD rate for all, as the throughput protocol's.
LEARNING_RATE = 0.01
FINAL_STATE = "final_state.pt"


class Collectives(Protocol):
    """The group a step runs over: the elastic runtime's own (`elastic.cluster.Group`) or torch's default."""

    rank: int
    size: int
    version: int  # the membership it trains in: the cluster version (in place), the step it resumed at (torchrun)

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None: ...

    def broadcast(self, tensor: torch.Tensor, source: int) -> None: ...


class DefaultGroup:
    """torch's default process group (as torchrun sets it up) behind the `Collectives` interface."""

    def __init__(self, version: int) -> None:
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.version = version

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        dist.all_reduce(tensor, op)

    def broadcast(self, tensor: torch.Tensor, source: int) -> None:
        dist.broadcast(tensor, source)


class ElasticTrainer:
    """What a worker keeps in memory across resizes (its modules, their optimizers, the global sample offset and
    step count) and one data-parallel step over the current group; subclasses train their model on a slice."""

    samples: int  # the dataset the offset walks through (modulo)
    batch_size: int  # samples per rank and step: what the ledger and the throughput count

    def __init__(self, params: dict[str, Any], threads: int) -> None:
        torch.set_num_threads(threads)
        self.seed = params.get("seed", 0)
        torch.manual_seed(self.seed)
        # Steps padded to at least this long: a tiny model's steps last milliseconds, too short for the host to act
        # "at a step" (kill or add a worker) before the run ends.
        self.min_step_s = float(params.get("min_step_s", 0.0))
        self.modules: dict[str, torch.nn.Module] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.offset = 0
        self.step = 0

    def train_slice(self, index: torch.Tensor, group: Collectives) -> None:
        """Train on the samples `index`, averaging every gradient over `group` before its optimizer steps."""
        raise NotImplementedError

    def train_step(self, group: Collectives) -> float:
        """Train this rank's slice of the next global batch over the group; the step time."""
        rank, size = group.rank, group.size
        started = time.perf_counter()
        start = self.offset + rank * self.batch_size
        index = torch.arange(start, start + self.batch_size) % self.samples
        torch.manual_seed(slice_seed(self.seed, start))
        # before the step's first all-reduce: see host/ledger.py
        emit("ledger", rank=rank, step=self.step, start=start, count=self.batch_size, size=size, version=group.version)
        self.train_slice(index, group)
        self.offset += size * self.batch_size
        self.step += 1
        time.sleep(max(0.0, self.min_step_s - (time.perf_counter() - started)))
        return time.perf_counter() - started

    def optimizer_state(self) -> list[torch.Tensor]:
        """Every optimizer's per-parameter tensors (momentum, Adam's moments and step), in parameter order."""
        return [
            value
            for optimizer in self.optimizers.values()
            for group in optimizer.param_groups
            for parameter in group["params"]
            for _, value in sorted(optimizer.state[parameter].items())
            if isinstance(value, torch.Tensor)
        ]

    def state_tensors(self) -> list[torch.Tensor]:
        """Everything a joiner must receive: parameters, buffers (BatchNorm statistics), optimizer state."""
        buffers = [buffer for module in self.modules.values() for buffer in module.buffers()]
        return [*self.parameters(), *buffers, *self.optimizer_state()]

    def parameters(self) -> list[torch.Tensor]:
        """Every module's parameters, in the order of `modules`."""
        return [parameter for module in self.modules.values() for parameter in module.parameters()]

    def broadcast_state(self, group: Collectives, source: int) -> None:
        """Make every rank's state, offset and step equal to `source`'s, one flat broadcast per dtype."""
        progress = torch.tensor([self.offset, self.step], dtype=torch.int64)
        tensors = [*self.state_tensors(), progress]
        with torch.no_grad():
            for dtype in sorted({tensor.dtype for tensor in tensors}, key=str):
                same = [tensor for tensor in tensors if tensor.dtype == dtype]
                flat = torch.cat([tensor.reshape(-1) for tensor in same])
                group.broadcast(flat, source)
                for tensor, part in zip(same, flat.split([tensor.numel() for tensor in same]), strict=True):
                    tensor.copy_(part.view_as(tensor))
        self.offset, self.step = (int(value) for value in progress)

    def parameters_and_momentum(self) -> list[torch.Tensor]:
        """Parameters and optimizer state (momentum, or Adam's): what data-parallel steps keep equal on every rank
        (BatchNorm buffers follow each rank's own slices)."""
        return [*self.parameters(), *self.optimizer_state()]

    def record_state(self, group: Collectives, state: str) -> None:
        """A ledger record of this rank's state digest: `synced` (everything, right after a resize's state sync) or
        `final` (parameters and optimizer state, at the stop)."""
        tensors = self.state_tensors() if state == "synced" else self.parameters_and_momentum()
        progress = torch.tensor([self.offset, self.step], dtype=torch.int64)
        emit(
            "ledger",
            rank=group.rank,
            step=self.step,
            version=group.version,
            state=state,
            digest=digest([*tensors, progress]),
        )

    def save_final_state(self, run_dir: Path) -> None:
        """Write the trained state to `final_state.pt` in the run folder, atomically (the tests compare it)."""
        save_checkpoint(self.checkpoint(), run_dir / FINAL_STATE)

    def checkpoint(self) -> dict[str, Any]:
        return {
            "modules": {name: module.state_dict() for name, module in self.modules.items()},
            "optimizers": {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()},
            "offset": self.offset,
            "step": self.step,
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        for name, module in self.modules.items():
            module.load_state_dict(checkpoint["modules"][name])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(checkpoint["optimizers"][name])
        self.offset, self.step = checkpoint["offset"], checkpoint["step"]


class ClassifierTrainer(ElasticTrainer):
    """An image or span model of rank/models.py on `dataset_size` synthetic samples, SGD with momentum."""

    def __init__(self, params: dict[str, Any], threads: int) -> None:
        super().__init__(params, threads)
        self.samples, self.batch_size = params["dataset_size"], params["batch_size"]
        self.model = self.modules["model"] = build_model(params["model"])
        self.optimizer = self.optimizers["model"] = torch.optim.SGD(
            self.model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM
        )
        # created now, not at the first step: a joiner receives them before it has stepped
        for parameter in self.model.parameters():
            self.optimizer.state[parameter]["momentum_buffer"] = torch.zeros_like(parameter)
        self.inputs, self.labels = synthetic_batch(
            params["model"], params["dataset_size"], params.get("image_size"), torch.device("cpu"), seed=0
        )

    def train_slice(self, index: torch.Tensor, group: Collectives) -> None:
        self.optimizer.zero_grad(set_to_none=False)
        F.cross_entropy(self.model(self.inputs[index]), self.labels[index]).backward()
        average_gradients(self.model, group)
        self.optimizer.step()


class GanElasticTrainer(ElasticTrainer):
    """The BigGAN-style GAN of rank/gan_models.py (the biggan-profiles workload's networks, losses and Adam settings)
    on the first `dataset_size` digits: per step, `d_steps` discriminator steps, each on its own `batch_size` real
    images of the rank's slice, then one generator step; every gradient averaged over the group before its optimizer
    steps, as DDP would."""

    def __init__(self, params: dict[str, Any], threads: int) -> None:
        super().__init__(params, threads)
        images, labels = gan_models.load_images({**params, "dataset": "digits"})
        self.images, self.labels = images[: params["dataset_size"]], labels[: params["dataset_size"]]
        self.real_batch = params["batch_size"]
        self.samples, self.batch_size = len(self.labels), self.real_batch * params["d_steps"]
        self.shape = gan_models.shape_of(params, self.images.shape[1])
        betas = tuple(params["betas"])
        for name, network, rate in (
            ("generator", gan_models.Generator, "lr_g"),
            ("discriminator", gan_models.Discriminator, "lr_d"),
        ):
            module = self.modules[name] = network(self.shape)
            optimizer = self.optimizers[name] = torch.optim.Adam(module.parameters(), lr=params[rate], betas=betas)
            # Adam's own initial state, created now: a joiner receives it before it has stepped
            for parameter in module.parameters():
                zeros = torch.zeros_like(parameter)
                optimizer.state[parameter] = {"step": torch.tensor(0.0), "exp_avg": zeros, "exp_avg_sq": zeros.clone()}

    def train_slice(self, index: torch.Tensor, group: Collectives) -> None:
        """The step, all or nothing: its d_steps + 1 all-reduces each precede an optimizer step, so a peer lost
        midway (a collective raises) would leave some updated; they are undone, as the classifier's one all-reduce
        leaves its parameters untouched, and the step is trained again after the resize."""
        kept = [tensor.clone() for tensor in self.parameters_and_momentum()]
        try:
            self.train_networks(index, group)
        except Exception:
            with torch.no_grad():
                for tensor, old in zip(self.parameters_and_momentum(), kept, strict=True):
                    tensor.copy_(old)
            raise

    def train_networks(self, index: torch.Tensor, group: Collectives) -> None:
        generator, discriminator = self.modules["generator"], self.modules["discriminator"]
        for real in index.split(self.real_batch):
            self.optimizers["discriminator"].zero_grad(set_to_none=False)
            fakes = gan_models.latents(self.real_batch, self.shape)
            gan_models.discriminator_backward(generator, discriminator, self.images[real], self.labels[real], *fakes)
            average_gradients(discriminator, group)
            self.optimizers["discriminator"].step()
        self.optimizers["generator"].zero_grad(set_to_none=False)
        gan_models.generator_backward(generator, discriminator, *gan_models.latents(self.real_batch, self.shape))
        average_gradients(generator, group)
        self.optimizers["generator"].step()


def build_trainer(params: dict[str, Any], threads: int) -> ElasticTrainer:
    """The trainer of the point's `model`: the GAN for `biggan`, else a classifier of rank/models.py. Its optimizer's
    library loaded first, the worker has loaded its libraries: the collector resumes (ddlrepro.startup)."""
    startup.resume_collection(after_loading=optimizer_libraries(params))
    return (GanElasticTrainer if params["model"] == GAN_MODEL else ClassifierTrainer)(params, threads)


def slice_seed(seed: int, start: int) -> int:
    """The RNG seed (dropout) of the slice starting at global offset `start`: a function of the samples, not of the
    process that trains them, so a joiner draws what a fixed-size run would."""
    return seed * 1_000_003 + start


def digest(tensors: list[torch.Tensor]) -> str:
    """sha256 of the bytes of every tensor, in order: two ranks with the same digest hold bit-identical tensors."""
    hasher = hashlib.sha256()
    for tensor in tensors:
        hasher.update(str((tensor.dtype, tuple(tensor.shape))).encode())
        hasher.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # an ndarray is a buffer
    return hasher.hexdigest()


def average_gradients(module: torch.nn.Module, group: Collectives) -> None:
    """One all-reduce of every gradient of `module`, flattened (Horovod's tensor fusion, as one bucket)."""
    if group.size == 1:
        return
    parameters = list(module.parameters())
    gradients = [gradient_of(parameter) for parameter in parameters]
    flat = torch.cat([gradient.reshape(-1) for gradient in gradients])
    group.all_reduce(flat)
    flat.div_(group.size)
    for gradient, part in zip(gradients, flat.split([g.numel() for g in gradients]), strict=True):
        gradient.copy_(part.view_as(gradient))


def announce(rank: int) -> None:
    """The worker record provenance collects (elastic workers: gloo on CPU)."""
    emit(
        "worker",
        rank=rank,
        pid=os.getpid(),
        hostname=socket.gethostname(),
        torch=torch.__version__,
        backend="gloo",
        threads=torch.get_num_threads(),
        cpus=sorted(os.sched_getaffinity(0)),
        started="forked" if os.environ.get(FORKED_ENV) else "process",  # by the fork server, or as a new process
        collector=startup.collector_state(),
    )


def emit_step(step: int, size: int, batch_size: int, step_time_s: float) -> None:
    """Rank 0's record of one step: cluster size, step time and cluster throughput."""
    for metric, value in (
        ("cluster_size", size),
        ("step_time_s", step_time_s),
        ("img_per_sec", size * batch_size / step_time_s),
    ):
        emit("metric", rank=0, step=step, metric=metric, value=float(value))
