"""Accuracy-consistent elastic training (EasyScale, SC 2023) for PyTorch on CPU.

A job has E logical workers (EasyScaleThreads, ESTs). P processes (1 ≤ P ≤ E) run them: process k runs a
contiguous range of ESTs one after another within each step (`placement`, e.g. [2, 1, 1]). Each EST keeps its own
state, switched in before its forward and out after its backward: the RNG of its dropout, the generator of its
data augmentation, its BatchNorm buffers and its position in the sample stream. What the job computes is then a
function of E alone, whatever P and the placement:

- D0 keeps only that per-EST state; gradients are summed in each process, then all-reduced across processes, so
  the floating-point summation order depends on the placement.
- D1 also fixes the aggregation: it reproduces what plain E-worker DDP on gloo computes, bit for bit (its buckets,
  its 1/E scaling and its ring's order of additions: ddp_arithmetic.py), from every EST's gradient gathered on
  process 0, then broadcast. On CPU (same kernels and thread count everywhere) D1 gives training bitwise identical
  to E-worker DDP for any placement: the artifact's "exactly the same as DDP-homo".

A checkpoint (parameters, optimizer, every EST's state, the step) moves a job between placements.

With `est_timings`, each step is cut into contiguous laps (`StepLaps`), one per piece of an EST's turn (switch,
data, forward_backward, gradient_copy) and, on a process's last EST, the pieces after its turn (sync, optimizer,
loss): they add up to the step. Only time.perf_counter; the sync's lap includes waiting for the peers (the gather
on process 0 and the broadcast), as a DDP step's all-reduce does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddlrepro.rank.ddp_arithmetic import bucket_layout, ddp_average, gradient_of
from ddlrepro.rank.models import MODELS, build_model

MODES = ("D0", "D1", "ddp")


def est_ranges(placement: list[int]) -> list[range]:
    """The contiguous EST indices each process runs: [2, 1, 1] → [0, 1], [2], [3]."""
    starts = [sum(placement[:k]) for k in range(len(placement))]
    return [range(start, start + count) for start, count in zip(starts, placement, strict=True)]


class SampleStream:
    """Samples by index, any process reading the same sample for the same index, in a fresh order every epoch."""

    size: int
    seed: int

    def index(self, position: int) -> int:
        """The sample at `position` of the stream: a fresh permutation of the data set every epoch."""
        epoch, offset = divmod(position, self.size)
        permutation = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + 7919 * epoch))
        return int(permutation[offset])


class SyntheticImages(SampleStream):
    """A learnable synthetic data set: sample i is drawn from its own seed; its label is the argmax of a fixed
    random projection of the image."""

    def __init__(self, model: str, size: int, seed: int = 0) -> None:
        info = MODELS[model]
        self.side, self.classes, self.size, self.seed = info.image_size, info.num_classes, size, seed
        generator = torch.Generator().manual_seed(seed)
        self.projection = torch.randn(self.classes, 3 * self.side * self.side, generator=generator)

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.randn(3, self.side, self.side, generator=generator)
        return image, int((self.projection @ image.flatten()).argmax())


class SyntheticTokens(SampleStream):
    """Token ids for the span encoders: sample i is drawn from its own seed; its answer span starts at its first
    token (mod the sequence length) and is as long as its second (mod 16), a rule the model can learn."""

    def __init__(self, model: str, size: int, seed: int = 0) -> None:
        tokens = MODELS[model].tokens
        if tokens is None:
            raise ValueError(f"model {model!r} takes images, not token sequences")
        self.shape, self.size, self.seed = tokens, size, seed

    def sample(self, index: int) -> tuple[torch.Tensor, tuple[int, int]]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        length = self.shape.sequence_length
        tokens = torch.randint(0, self.shape.vocab_size, (length,), generator=generator)
        start = int(tokens[0]) % length
        return tokens, (start, min(length - 1, start + int(tokens[1]) % 16))


@dataclass
class StepLaps:
    """One step cut into contiguous laps: each `lap` closes the piece since the previous mark, so the pieces add up
    to the step. Disabled, `lap` returns at once and nothing is kept."""

    enabled: bool
    last: float = 0.0
    seconds: dict[tuple[int, str], float] = field(default_factory=dict)

    def start(self) -> None:
        if self.enabled:
            self.seconds = {}
            self.last = time.perf_counter()

    def lap(self, est: int, part: str) -> None:
        if self.enabled:
            now = time.perf_counter()
            self.seconds[est, part] = self.seconds.get((est, part), 0.0) + now - self.last
            self.last = now


@dataclass
class LogicalWorker:
    """One EST's own state: everything that must follow it from process to process."""

    index: int
    rng_state: torch.Tensor
    augment_state: torch.Tensor
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def fresh(cls, index: int, seed: int, model: nn.Module) -> LogicalWorker:
        rng = torch.Generator().manual_seed(seed * 104_729 + 2 * index)
        augment = torch.Generator().manual_seed(seed * 104_729 + 2 * index + 1)
        buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
        return cls(index, rng.get_state(), augment.get_state(), buffers)

    def state(self) -> dict[str, Any]:
        return {"index": self.index, "rng": self.rng_state, "augment": self.augment_state, "buffers": self.buffers}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LogicalWorker:
        return cls(state["index"], state["rng"], state["augment"], state["buffers"])


class ConsistentTrainer:
    """Trains one model over E ESTs placed on this job's processes; see the module docstring for D0/D1."""

    def __init__(self, params: dict[str, Any], rank: int, placement: list[int]) -> None:
        if params["mode"] not in MODES:
            raise ValueError(f"unknown mode {params['mode']!r}; valid modes: {', '.join(MODES)}")
        if sum(placement) != params["logical_workers"]:
            raise ValueError(
                f"placement {placement} runs {sum(placement)} ESTs, the job has {params['logical_workers']}"
            )
        if params["mode"] == "ddp" and set(placement) != {1}:
            raise ValueError("plain DDP runs one logical worker per process")
        self.params, self.rank, self.placement = params, rank, placement
        self.logical_workers = params["logical_workers"]
        self.batch_size = params["batch_size"]
        seed = params.get("seed", 0)
        torch.manual_seed(seed)
        self.model = build_model(params["model"])
        stream = SyntheticTokens if MODELS[params["model"]].tokens else SyntheticImages
        self.data = stream(params["model"], params.get("dataset_size", 4096), seed)
        self.ests = [LogicalWorker.fresh(index, seed, self.model) for index in est_ranges(placement)[rank]]
        self.trained = self.model
        if params["mode"] == "ddp":
            self.trained = nn.parallel.DistributedDataParallel(self.model, broadcast_buffers=False)
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=params["learning_rate"], momentum=0.9, weight_decay=5e-4
        )
        self.step = 0
        self.switch_seconds = 0.0
        self.laps = StepLaps(bool(params.get("est_timings")))
        self.parameters = list(self.model.parameters())
        self.sizes = [parameter.numel() for parameter in self.parameters]
        # D1 computes as DDP, which rebuilds its buckets after the first step in the order gradients became ready.
        self.ready_order: list[int] = []
        self.rebuilt_layout: list[list[int]] | None = None
        if params["mode"] == "D1":
            for index, parameter in enumerate(self.parameters):
                parameter.register_post_accumulate_grad_hook(lambda _, index=index: self._gradient_ready(index))

    def _gradient_ready(self, index: int) -> None:
        if len(self.ready_order) < len(self.parameters) and index not in self.ready_order:
            self.ready_order.append(index)

    def ddp_layout(self) -> list[list[int]]:
        """DDP's buckets at this step: all parameters in one before its first step's end, then the rebuilt ones."""
        if self.step == 0:
            return bucket_layout(self.parameters, None)
        if self.rebuilt_layout is None:
            self.rebuilt_layout = bucket_layout(self.parameters, self.ready_order)
        return self.rebuilt_layout

    def batch(self, est: LogicalWorker) -> tuple[torch.Tensor, torch.Tensor]:
        """This EST's mini-batch of the current step, augmented (random flip, random 2-pixel shift) with its own RNG."""
        augment = torch.Generator()
        augment.set_state(est.augment_state)
        images, labels = [], []
        first = (self.step * self.logical_workers + est.index) * self.batch_size
        for position in range(first, first + self.batch_size):
            image, label = self.data.sample(self.data.index(position))
            if isinstance(self.data, SyntheticImages):
                if torch.rand(1, generator=augment) < 0.5:
                    image = image.flip(-1)
                shift = torch.randint(-2, 3, (2,), generator=augment)
                image = torch.roll(image, (int(shift[0]), int(shift[1])), dims=(1, 2))
            images.append(image)
            labels.append(label)
        est.augment_state = augment.get_state()
        return torch.stack(images), torch.tensor(labels)

    def switch_in(self, est: LogicalWorker) -> None:
        started = time.perf_counter()
        torch.random.set_rng_state(est.rng_state)
        for name, buffer in self.model.named_buffers():
            buffer.copy_(est.buffers[name])
        self.switch_seconds += time.perf_counter() - started

    def switch_out(self, est: LogicalWorker) -> None:
        started = time.perf_counter()
        est.rng_state = torch.random.get_rng_state()
        for name, buffer in self.model.named_buffers():
            est.buffers[name].copy_(buffer)
        self.switch_seconds += time.perf_counter() - started

    def train_step(self) -> float:
        """One global step over every EST; returns the global loss (mean of the ESTs' losses, folded in EST order)."""
        local_losses, local_gradients = {}, []
        self.laps.start()
        for est in self.ests:
            self.switch_in(est)
            self.laps.lap(est.index, "switch")
            images, labels = self.batch(est)
            self.laps.lap(est.index, "data")
            self.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.trained(images), labels)
            loss.backward()
            self.laps.lap(est.index, "forward_backward")
            if self.params["mode"] != "ddp":
                local_gradients.append(torch.cat([gradient_of(p).reshape(-1) for p in self.model.parameters()]))
                self.laps.lap(est.index, "gradient_copy")
            self.switch_out(est)
            self.laps.lap(est.index, "switch")
            local_losses[est.index] = loss.detach()
        last = self.ests[-1].index
        if self.params["mode"] != "ddp":
            self.set_gradients(self.aggregate(local_gradients))
            self.laps.lap(last, "sync")
        self.optimizer.step()
        self.laps.lap(last, "optimizer")
        self.step += 1
        global_loss = self.global_loss(local_losses)
        self.laps.lap(last, "loss")
        return global_loss

    def aggregate(self, gradients: list[torch.Tensor]) -> torch.Tensor:
        """The mean gradient over all ESTs: in a placement-dependent order (D0), or as E-worker DDP computes it
        (D1, every EST's gradient gathered on process 0)."""
        if self.params["mode"] == "D0":
            total = fold(gradients)
            if dist.get_world_size() > 1:
                dist.all_reduce(total)
            return total.div_(self.logical_workers)
        mine = torch.stack(gradients)
        averaged = torch.empty_like(gradients[0])
        if self.rank == 0:
            everyone = [mine]
            for source, count in enumerate(self.placement[1:], start=1):
                theirs = torch.empty(count, *mine.shape[1:], dtype=mine.dtype)
                dist.recv(theirs, src=source)
                everyone.append(theirs)
            averaged = ddp_average(torch.cat(everyone), self.sizes, self.ddp_layout())
        else:
            dist.send(mine, dst=0)
        if len(self.placement) > 1:
            dist.broadcast(averaged, src=0)
        return averaged

    def set_gradients(self, flat: torch.Tensor) -> None:
        offset = 0
        for parameter in self.model.parameters():
            size = parameter.numel()
            parameter.grad = flat[offset : offset + size].view_as(parameter).clone()
            offset += size

    def global_loss(self, local_losses: dict[int, torch.Tensor]) -> float:
        """Every EST's loss in one tensor (others' entries are zeros, so the sum is exact), folded in EST order."""
        losses = torch.zeros(self.logical_workers)
        for index, loss in local_losses.items():
            losses[index] = loss
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(losses)
        return float(fold(list(losses)) / self.logical_workers)

    def checkpoint(self) -> dict[str, Any] | None:
        """The whole job's state, gathered on rank 0 (None elsewhere)."""
        states = [est.state() for est in self.ests]
        gathered: list[Any] | None = [None] * len(self.placement) if self.rank == 0 else None
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.gather_object(states, gathered, dst=0)
        elif gathered is not None:
            gathered[0] = states
        if gathered is None:  # not rank 0
            return None
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "ests": sorted((state for part in gathered for state in part), key=lambda state: state["index"]),
            "logical_workers": self.logical_workers,
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        if checkpoint["logical_workers"] != self.logical_workers:
            raise ValueError(f"checkpoint has {checkpoint['logical_workers']} ESTs, this job {self.logical_workers}")
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        mine = {est.index for est in self.ests}
        self.ests = [LogicalWorker.from_state(state) for state in checkpoint["ests"] if state["index"] in mine]
        self.step = checkpoint["step"]


def fold(tensors: Iterator[torch.Tensor] | list[torch.Tensor]) -> torch.Tensor:
    """((t₀ + t₁) + t₂) + …, always in this order."""
    tensors = list(tensors)
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total += tensor
    return total
